"""Reward models and a reference in Ray actors of their own (`placement: actor`, issue 20 part 2).

Unit tests: what validate refuses, and how the plan counts a service (on its own device, out of every
rank's memory table). The integration run is one pipeline of two PPO stages on the tiny model, the same
seed and a random-init one-label reward model: `colocated` holds the reward model and the reference copy
on its rank, `actor` places both in actors of their own. Their rollouts, losses and held-out rewards must
agree within TOLERANCE, and the actor run records the seconds its rank waited on the services.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from align.cli import main
from tests.pipelines import QUIET_TRL, run, stage_folder, stage_record

ROOT = Path(__file__).parents[1]
TOY = "align:toy/number-or-word"
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
"""Actor against co-located scoring on CPU in fp32: the same model, forward and batches in another
process. Measured bit-equal here; the tolerance leaves room for another thread count's summation order."""
COMPARED = ("loss", "objective/scores", "objective/kl", "loss/policy_avg", "loss/value_avg", "rewards/model")


def reward_model(folder: Path) -> Path:
    """A one-label sequence classifier on the tiny model's trunk, random init with a fixed seed."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    from align.models.loading import resolve_model

    tiny = resolve_model("tiny")
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    config = AutoConfig.from_pretrained(tiny, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(folder / "rm")
    tokenizer.save_pretrained(folder / "rm")
    return folder / "rm"


def ppo_stage(scorer: Path, actor: bool) -> dict:
    trl = {
        **{key: value for key, value in QUIET_TRL.items() if key != "max_length"},
        "max_steps": 3,
        "learning_rate": 5e-3,
        "per_device_train_batch_size": 4,
        "num_mini_batches": 1,
        "num_ppo_epochs": 1,  # a rollout per step: the reference's KL counts from the second on
        "max_completion_length": 8,
        "temperature": 1.0,
    }
    reward = {"model": str(scorer), **({"placement": "actor"} if actor else {})}
    stage = {
        "kind": "ppo",
        "data": {"train": f"{TOY}/train", "eval": f"{TOY}/test", "max_eval_rows": 4},
        "rewards": [reward, {"function": "length", "args": {"target": 3}, "weight": 0.5}],
        "trl": trl,
    }
    return {**stage, "reference": {"placement": "actor"}} if actor else stage


def write(folder: Path, stages: dict[str, dict]) -> Path:
    body = {"name": "svc", "base_model": "tiny", "defaults": {"output_root": str(folder / "runs")}}
    path = folder / "svc.yaml"
    path.write_text(yaml.safe_dump({**body, "stages": stages}, sort_keys=False))
    return path


def problems(capsys: pytest.CaptureFixture[str], path: Path) -> str:
    assert main(["validate", str(path)]) == 2
    return capsys.readouterr().err


def test_actor_placement_is_refused_where_nothing_can_move(tmp_path, capsys) -> None:
    sft = {"kind": "sft", "data": {"train": "align:chatterbot/sft/train"}}
    sft["reference"] = {"placement": "actor"}
    lora = {**ppo_stage(tmp_path, actor=True), "lora": {"r": 4}}
    lora["rewards"] = [{"function": "format"}]
    evals = {
        "kind": "eval",
        "models": {"base": "tiny"},
        "data": {"prompts": f"{TOY}/test"},
        "rewards": [{"model": "tiny", "placement": "actor"}],
    }
    err = problems(capsys, write(tmp_path, {"sft": sft, "ppo": lora, "ev": evals}))
    assert "stages.sft.reference: a sft stage has no reference copy align can move" in err
    assert "remove `reference:`" in err
    assert "stages.ppo.reference.placement: with `lora:` the reference is the policy's own base" in err
    assert "stages.ev.rewards[0].placement: a eval stage scores with its reward models on its own" in err
    function = ppo_stage(tmp_path, actor=False)
    function["rewards"] = [{"function": "format", "placement": "actor"}]
    err = problems(capsys, write(tmp_path, {"ppo": function}))
    assert "stages.ppo.rewards[0]" in err and "a function runs on each training rank: remove them" in err


def test_plan_counts_a_service_on_its_own_device_not_on_the_ranks(tmp_path) -> None:
    from align.pipeline.file import load
    from align.planning.hardware import Hardware
    from align.planning.plan import build

    scorer = reward_model(tmp_path)
    path = write(tmp_path, {"near": ppo_stage(scorer, False), "far": ppo_stage(scorer, True)})
    plan = build(load(path), Hardware(accelerator=True, device_memory=80 * 10**9))
    near, far = plan.stages["near"], plan.stages["far"]
    assert [role for role, *_ in near.memory.frozen_by_role] == ["reference", "rewards[0]"]
    assert far.memory.frozen_by_role == () and far.memory.device.frozen == 0
    assert near.memory.total - far.memory.total == near.memory.device.frozen
    services = {service.role: service for service in far.placement.services}
    assert set(services) == {"reference", "rewards[0]"} and near.placement.services == ()
    assert services["rewards[0]"].gpus == 1 and services["rewards[0]"].cpus is None
    on_rank = {role: device for role, device, _host in near.memory.frozen_by_role}
    assert services["reference"].weight_bytes == on_rank["reference"]
    assert services["rewards[0]"].num_cpus(embedded=True) == 0 and services["rewards[0]"].num_cpus(False) == 1
    assert "in a Ray actor of its own" in far.placement.description["rewards"]
    assert "on a GPU of its own, in no rank's memory" in far.placement.description["rewards[0] service"]


def test_shipped_service_pipeline_validates_and_plans(capsys) -> None:
    path = str(ROOT / "pipelines" / "ppo_reward_service.yaml")
    assert main(["validate", path]) == 0
    assert main(["plan", path, "--device-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    assert "rewards[0] service: a Ray actor {CPU: 8, GPU: 2}; 139 GB of bf16 weights over 2 GPUs" in out
    assert "reference service: a Ray actor {CPU: 4, GPU: 1}" in out
    assert "frozen models                    0 B" in out


@pytest.fixture(scope="module")
def service_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("services")
    scorer = reward_model(folder)
    path = write(folder, {"colocated": ppo_stage(scorer, False), "actor": ppo_stage(scorer, True)})
    run(path, cwd=folder)
    return path


def logged(path: Path, stage: str) -> list[dict]:
    lines = (stage_folder(path, stage) / "logs" / "metrics.jsonl").read_text().splitlines()
    return [entry for entry in map(json.loads, lines) if "loss" in entry]


@pytest.mark.integration
@pytest.mark.slow
def test_actor_scoring_equals_colocated_scoring(service_run) -> None:
    near, far = logged(service_run, "colocated"), logged(service_run, "actor")
    assert len(near) == len(far) == 3
    for mine, theirs in zip(far, near, strict=True):
        for key in COMPARED:
            torch.testing.assert_close(mine[key], theirs[key], **TOLERANCE, msg=key)
    assert far[-1]["objective/kl"] != 0  # the policy moved away from the remote reference
    metrics = {stage: stage_record(service_run, stage)["metrics"] for stage in ("colocated", "actor")}
    for key in ("reward_model_before", "reward_model_after", "reward_mean_after"):
        torch.testing.assert_close(metrics["actor"][key], metrics["colocated"][key], **TOLERANCE, msg=key)


@pytest.mark.integration
@pytest.mark.slow
def test_the_record_shows_the_wait_on_the_services(service_run) -> None:
    near = stage_record(service_run, "colocated")["metrics"]
    far = stage_record(service_run, "actor")["metrics"]
    assert near["time_service_wait_s"] == 0.0
    assert 0 < far["time_service_wait_s"] < far["time_score_s"]
