"""Reward models and a reference in Ray actors of their own (`placement: actor`, issue 20 part 2).

Unit tests: what validate refuses, and how the plan counts a service (on its own device, out of every
rank's memory table). The integration run (about 3 minutes on 2 cores) is one pipeline of pairs of stages
on the tiny model with the same seed, each pair alike but for where its frozen models run:
- PPO against a random-init one-label reward model: `colocated` holds it and the reference copy on its
  rank, `actor` places both in actors of their own;
- DPO with full parameters: a reference copy on the rank against one in an actor that precomputes every
  pair's log-probs;
- GRPO with the reward model held by TRL on the rank against one in an actor.
An actor Ray cannot place ends its stage after its `wait_s` in one line (on a Ray of this process); one
this machine could never hold is refused before Ray starts. A reward actor killed mid-PPO is restarted and
its stage retried from the last checkpoint, as a lost rank is (a fault run of its own).
Logged rollouts, losses and held-out rewards agree within TOLERANCE, and each actor run records the
seconds its rank waited on the services.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
import yaml

from align.cli import main
from align.errors import StageFailed
from align.records import Attempt
from align.run.controller import attempt_until_done
from align.run.launch import LostWorkers
from align.run.services import with_lost_services
from align.stages.checkpoints import COMPLETE
from tests.pipelines import QUIET_TRL, run, stage, stage_folder, stage_record

ROOT = Path(__file__).parents[1]
TOY = "align:toy/number-or-word"
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
"""Actor against co-located on CPU in fp32: the same model and forward in another process. PPO and DPO
measured bit-equal here; GRPO's reward model scores each completion alone in its actor where TRL pads a
batch (its rewards differ by about 1e-8); the tolerance also leaves room for another thread count."""
COMPARED = {
    "ppo": ("loss", "objective/scores", "objective/kl", "loss/policy_avg", "loss/value_avg", "rewards/model"),
    "dpo": ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen"),
    "grpo": ("loss", "reward", "reward_std", "rewards/rm/mean"),
}
PAIRS = {"ppo": ("colocated", "actor"), "dpo": ("dpo_copy", "dpo_actor"), "grpo": ("grpo_here", "grpo_actor")}


def reward_model(folder: Path) -> Path:
    """A random-init reward model on the tiny model's trunk, fixed seed."""
    from align.models.loading import resolve_model
    from align.models.tiny import build_tiny_reward_model

    return build_tiny_reward_model(folder / "rm", Path(resolve_model("tiny")))


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


def grpo_stage(scorer: Path, actor: bool) -> dict:
    trl = {
        **{key: value for key, value in QUIET_TRL.items() if key != "max_length"},
        "max_steps": 2,
        "per_device_train_batch_size": 4,
        "num_generations": 4,
        "max_completion_length": 8,
        "learning_rate": 1e-3,
    }
    reward = {"model": str(scorer), **({"placement": "actor"} if actor else {})}
    data = {"train": f"{TOY}/train", "eval": f"{TOY}/test", "max_eval_rows": 4}
    return {"kind": "grpo", "data": data, "rewards": [reward, {"function": "format"}], "trl": trl}


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
    dpo = stage("dpo", steps=3)
    stages = {
        "colocated": ppo_stage(scorer, False),
        "actor": ppo_stage(scorer, True),
        "dpo_copy": dpo,
        "dpo_actor": {**dpo, "reference": {"placement": "actor"}},
        "grpo_here": grpo_stage(scorer, False),
        "grpo_actor": grpo_stage(scorer, True),
    }
    run(write(folder, stages), cwd=folder)
    return folder / "svc.yaml"


def logged(path: Path, stage: str) -> list[dict]:
    lines = (stage_folder(path, stage) / "logs" / "metrics.jsonl").read_text().splitlines()
    return [entry for entry in map(json.loads, lines) if "loss" in entry]


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("kind", list(PAIRS))
def test_actor_placement_equals_colocated(service_run, kind: str) -> None:
    here, there = PAIRS[kind]
    near, far = logged(service_run, here), logged(service_run, there)
    assert len(near) == len(far) == stage_record(service_run, here)["steps_trained"]
    for mine, theirs in zip(far, near, strict=True):
        for key in COMPARED[kind]:
            torch.testing.assert_close(mine[key], theirs[key], **TOLERANCE, msg=key)
    metrics = {name: stage_record(service_run, name)["metrics"] for name in (here, there)}
    held_out = [key for key in metrics[here] if key.endswith(("_before", "_after"))]
    assert held_out
    for key in held_out:
        torch.testing.assert_close(metrics[there][key], metrics[here][key], **TOLERANCE, msg=key)


@pytest.mark.integration
@pytest.mark.slow
def test_ppo_reference_in_an_actor_gives_the_kl(service_run) -> None:
    assert logged(service_run, "actor")[-1]["objective/kl"] != 0  # the policy moved from the reference


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("kind", list(PAIRS))
def test_the_record_shows_the_wait_on_the_services(service_run, kind: str) -> None:
    here, there = PAIRS[kind]
    near = stage_record(service_run, here)["metrics"]
    far = stage_record(service_run, there)["metrics"]
    assert near.get("time_service_wait_s", 0.0) == 0.0 and far["time_service_wait_s"] > 0
    if kind != "dpo":  # the rollouts' scoring includes the wait; DPO's is before training
        assert far["time_service_wait_s"] < far["time_score_s"]


def unplaceable(folder: Path, resources: dict) -> Path:
    stage = grpo_stage(reward_model(folder), True)
    stage["rewards"][0]["resources"] = resources
    return write(folder, {"far": stage})


def test_an_actor_this_machine_cannot_hold_is_refused_before_ray_starts(tmp_path, capsys) -> None:
    assert main(["run", str(unplaceable(tmp_path, {"cpus": 1, "gpus": 1}))]) == 2
    err = capsys.readouterr().err
    assert "stages.far.rewards[0].resources.cpus: the ranks and actors ask 3 CPUs; this machine has 2" in err
    assert "stages.far.rewards[0].resources.gpus: the ranks and actors ask 1 GPUs; this machine has 0" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.integration
@pytest.mark.slow
def test_a_service_ray_cannot_place_ends_its_stage_in_one_line(tmp_path) -> None:
    """On a cluster (here this process's own Ray, as `--address` joins one) nothing is refused up front:
    the actor waits its `wait_s`, then the stage ends in one line naming the request and the largest node."""
    from align.errors import AlignError
    from align.pipeline.file import load
    from align.planning.launch import launch_of
    from align.planning.plan import ModelInput, StageInputs, build
    from align.run.launch import connect, disconnect
    from align.run.services import stage_services

    far = build(load(unplaceable(tmp_path, {"gpus": 1, "wait_s": 2}))).stages["far"]
    plan = launch_of(far, StageInputs(ModelInput(far.model_source)))
    said: list[str] = []
    connect(None)
    try:
        with pytest.raises(AlignError) as refused, stage_services(plan, True, said.append):
            pass
    finally:
        disconnect()
    assert str(refused.value).startswith(
        "stage 'far': Ray could not start the rewards[0] service ({CPU: 0, GPU: 1}) in 2 s; the largest "
        "node has {CPU: 2}: lower `stages.far.rewards[0].resources` or add nodes"
    )
    assert said == []


LOST = "stage 'ppo' lost its rewards[0] service (ActorDiedError)"


def test_a_stage_that_lost_its_service_is_retried_from_its_checkpoint(tmp_path) -> None:
    """Without Ray: a rank's error beside a dead service is the service's loss, which the controller retries
    from the latest complete checkpoint; beside live services it stays the stage's own error."""
    from ray.exceptions import ActorDiedError

    own = StageFailed("stage 'ppo' failed: ActorDiedError: The actor died unexpectedly", rank=0)
    assert with_lost_services("ppo", own, {}) is own
    rank = LostWorkers("stage 'ppo' lost a worker: rank 1 (ActorDiedError)")
    both = with_lost_services("ppo", rank, {"rewards[0]": ActorDiedError(), "reference": ActorDiedError()})
    lost = "stage 'ppo' lost its reference service (ActorDiedError), rewards[0] service (ActorDiedError)"
    assert str(both) == f"{lost}; {rank}"
    resumed: list[Path | None] = []

    def launch(plan, stage, scratch: Path, resume: Path | None) -> dict:
        resumed.append(resume)
        if len(resumed) > 1:
            return {"metrics": {}}
        (scratch / "checkpoints" / "checkpoint-2").mkdir(parents=True)
        (scratch / "checkpoints" / "checkpoint-2" / COMPLETE).write_text("{}")
        raise with_lost_services("ppo", own, {"rewards[0]": ActorDiedError()})

    attempts: list[Attempt] = []
    events: list[str] = []
    ppo = SimpleNamespace(name="ppo", plan=SimpleNamespace(max_failures=2))
    assert attempt_until_done(None, ppo, tmp_path, launch, attempts, events.append) == {"metrics": {}}
    assert resumed == [None, tmp_path / "checkpoints" / "checkpoint-2"]
    assert [attempt.error for attempt in attempts] == [LOST, None]
    assert f"[ppo] {LOST}; retry 1 of 2, from the last checkpoint" in events


def service_actors(driver: int) -> list[psutil.Process]:
    """The service actors' processes below a driver (its embedded Ray's raylet starts them)."""
    below = psutil.Process(driver).children(recursive=True)
    return [process for process in below if "ServiceActor" in " ".join(process.cmdline())]


def complete_checkpoint(pipeline_dir: Path, proc: subprocess.Popen, timeout: float = 300) -> int:
    """The step of the running attempt's first complete checkpoint, once there is one."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if done := sorted(pipeline_dir.glob(f".ppo.tmp-*/checkpoints/checkpoint-*/{COMPLETE}")):
            return int(done[0].parent.name.removeprefix("checkpoint-"))
        time.sleep(0.2)
    raise AssertionError(f"no complete checkpoint within {timeout}s")


@pytest.mark.integration
@pytest.mark.faults
def test_a_reward_actor_killed_mid_ppo_is_restarted_and_retried_from_the_checkpoint(tmp_path) -> None:
    ppo = ppo_stage(reward_model(tmp_path), actor=False)
    ppo["rewards"][0]["placement"] = "actor"
    steps = 16
    ppo["trl"].update(max_steps=steps, save_strategy="steps", save_steps=2)
    path = write(tmp_path, {"ppo": ppo})
    command = [sys.executable, "-m", "align.cli", "run", str(path)]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = complete_checkpoint(tmp_path / "runs" / "svc", proc)
    [actor] = service_actors(proc.pid)
    actor.kill()
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:] + "\n" + err[-3000:]
    record = stage_record(path, "ppo")
    resumed = record["resumed_from"]
    assert record["retries"] == 1 and [a["resumed_from"] for a in record["attempts"]] == [None, resumed]
    assert record["attempts"][0]["error"] == LOST and resumed >= first
    assert record["steps_trained"] == steps - resumed
    assert f"{LOST}; retry 1 of 2, from the last checkpoint" in out and f"resuming from step {resumed}" in out
    assert out.count("[ppo] rewards[0]: in a Ray actor of its own") == 2  # a fresh actor for the retry
    assert "Traceback" not in out + err
