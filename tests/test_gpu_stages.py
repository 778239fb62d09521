"""One GPU, bf16 mixed precision: the stages whose frozen models the Trainer does not place itself
(`make smoke-gpu`). DPO with a full-parameter reference copy, PPO full-parameter and LoRA against a reward
model, GRPO scored by a reward model. A model left on the CPU fails the first forward it takes part in
("Expected all tensors to be on the same device"), so each stage finishing is the placement check; each
also reports fp32 trainable weights and Adam state (mixed, not pure, bf16) and its peak device memory.

Built from the shipped pipelines/tiny_sft_rm_ppo.yaml so it runs what users run. Skipped without CUDA.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml

from tests.pipelines import placement_reports, run, stage_record

on_gpu = pytest.mark.gpu  # with pytest.mark.integration, per test: the validate test runs anywhere

SHIPPED = Path(__file__).parents[1] / "pipelines" / "tiny_sft_rm_ppo.yaml"
TOY = "align:toy/number-or-word"


def gpu_pipeline(folder: Path) -> Path:
    body = yaml.safe_load(SHIPPED.read_text())
    stages = body["stages"]
    ppo = stages.pop("ppo")
    stages.pop("merge")
    ppo["trl"]["max_steps"] = 20
    full_ppo = {**copy.deepcopy(ppo), "value": "head"}
    full_ppo.pop("lora")
    full_ppo["trl"] = {**full_ppo["trl"], "learning_rate": 1e-4, "max_steps": 10}
    stages["ppo_lora"] = ppo
    stages["ppo_full"] = full_ppo
    stages["dpo_full"] = {  # no LoRA: the reference is a frozen copy the runner places
        "kind": "dpo",
        "model": "${stages.sft.output}",
        "data": {"train": f"{TOY}/prefs/train", "eval": f"{TOY}/prefs/test"},
        "trl": {"max_steps": 20, "learning_rate": 1e-4, "per_device_train_batch_size": 16, "max_length": 64},
    }
    stages["grpo_rm"] = {
        "kind": "grpo",
        "model": "${stages.sft.output}",
        "data": {"train": f"{TOY}/train", "eval": f"{TOY}/test"},
        "rewards": [{"model": "${stages.reward.output}"}],
        "trl": {
            "max_steps": 10,
            "learning_rate": 1e-3,
            "per_device_train_batch_size": 16,
            "num_generations": 8,
            "max_completion_length": 8,
            "beta": 0.04,  # a reference model too
        },
    }
    body["defaults"] = {**body["defaults"], "output_root": str(folder / "runs"), "precision": "bf16"}
    path = folder / "gpu.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def gpu_run(tmp_path_factory) -> Path:
    path = gpu_pipeline(tmp_path_factory.mktemp("gpu"))
    run(path, timeout=1200)
    return path


def test_the_gpu_pipeline_validates_and_plans_here(tmp_path, capsys):
    """So the first GPU run is not spent on a typo: every stage validates, and the plan holds the full DPO
    reference and GRPO's reference as frozen copies, and PPO's reward model."""
    from align.cli import main

    path = gpu_pipeline(tmp_path)
    assert main(["plan", str(path), "--device-memory", "80GB"]) == 0
    out = capsys.readouterr().out
    dpo, grpo = out[out.index("dpo_full  kind=dpo") :], out[out.index("grpo_rm  kind=grpo") :]
    assert "reference: frozen copy" in dpo and "reference: frozen copy" in grpo
    assert "rewards[0] ${stages.reward.output}: frozen reward model" in out[out.index("ppo_full  kind=ppo") :]


@on_gpu
@pytest.mark.integration
@pytest.mark.parametrize("name", ["dpo_full", "ppo_full", "ppo_lora", "grpo_rm"])
def test_each_stage_with_frozen_models_trains_on_the_gpu_in_mixed_bf16(gpu_run, name):
    record = stage_record(gpu_run, name)
    assert record["status"] == "succeeded" and record["resolved"]["precision"] == "bf16"
    assert record["metrics"]["trainable_changed"] == 1.0
    [report] = placement_reports(gpu_run, name)
    assert report["peak_device_bytes"] > 0
    assert report["optimizer_state_dtypes"] == ["float32"]
    if record["resolved"]["backend"] != "zero2":  # DeepSpeed computes on bf16 weights, steps its fp32 master
        assert report["trainable_dtypes"] == ["float32"]


@on_gpu
@pytest.mark.integration
def test_full_dpo_learns_the_held_out_preference_against_its_placed_reference(gpu_run):
    metrics = stage_record(gpu_run, "dpo_full")["metrics"]
    assert metrics["reference_copy_loaded"] == 1.0
    assert metrics["dpo_reward_accuracy_after"] > 0.5


@on_gpu
@pytest.mark.integration
@pytest.mark.parametrize("name", ["ppo_full", "ppo_lora", "grpo_rm"])
def test_rl_stages_score_held_out_samples_with_the_reward_model(gpu_run, name):
    metrics = stage_record(gpu_run, name)["metrics"]
    assert math.isfinite(metrics["reward_mean_before"]) and math.isfinite(metrics["reward_mean_after"])
