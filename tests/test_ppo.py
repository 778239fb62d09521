"""align's PPO on 2 gloo ranks through Ray Train, under each backend, and a reward function that raises.

One pipeline run (about 3 minutes on 2 cores) holds every case, so Ray starts once:
- `ddp_lora`: LoRA under plain DDP with the critic on its own adapter, the case that crashed upstream;
- `zero2_offload`: LoRA under DeepSpeed ZeRO-2 with the optimizer on the CPU, critic as a value head;
- `fsdp_full`: full parameters under FSDP2, the frozen reference copy sharded like the policy;
- `reward_raises`: last, one worker, a user's reward function that raises on its third call, after the
  first checkpoint: the run fails there and the stage is kept aside with that checkpoint.
The policy is the random-init tiny model; the rewards are rules that score any text (length, format),
so every run has a signal to follow. The rise of held-out reward is shown on the toy task in
tests/test_rl_stages.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.pipelines import QUIET_TRL, placement_reports, run, stage_folder, stage_record, write_pipeline
from tests.test_fsdp import assert_memory_sharded, assert_sharded, assert_trained_sharded, fsdp_reports

TOY = "align:toy/number-or-word"
RAISING_REWARD = '''
calls = 0


def explode_on_third_call(completions, **_):
    """Scores like a length reward twice (held-out measure, first rollout), then raises."""
    global calls
    calls += 1
    if calls == 3:
        raise ZeroDivisionError("the scorer divided by zero")
    return [float(len(c[-1]["content"])) for c in completions]
'''


def ppo_stage(**fields) -> dict:
    trl = {
        **{key: value for key, value in QUIET_TRL.items() if key != "max_length"},
        "max_steps": 4,
        "learning_rate": 5e-3,
        "per_device_train_batch_size": 4,
        "num_mini_batches": 2,
        "num_ppo_epochs": 1,
        "max_completion_length": 8,
        "temperature": 1.0,
        **fields.pop("trl", {}),
    }
    rewards = [{"function": "length", "args": {"target": 3}}, {"function": "format"}]
    data = {"train": f"{TOY}/train", "eval": f"{TOY}/test", "max_eval_rows": 8}
    return {"kind": "ppo", "data": data, "rewards": rewards, "trl": trl, **fields}


@pytest.fixture(scope="module")
def ppo_runs(tmp_path_factory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("ppo")
    (folder / "raising_rewards.py").write_text(RAISING_REWARD)
    raising = ppo_stage(
        workers=1,
        backend="ddp",
        lora={"r": 4},
        trl={"save_strategy": "steps", "save_steps": 1, "num_mini_batches": 1},
    )
    raising["rewards"] = [{"function": "raising_rewards.explode_on_third_call"}]
    stages = {
        "ddp_lora": ppo_stage(backend="ddp", lora={"r": 8}, value="adapter"),
        "zero2_offload": ppo_stage(backend="zero2", lora={"r": 8}, zero2={"offload_optimizer": "cpu"}),
        "fsdp_full": ppo_stage(backend="fsdp"),
        "reward_raises": raising,
    }
    path = write_pipeline(folder, "ppo", stages, workers=2)
    text = path.read_text().replace("name: ppo\n", "name: ppo\nallow_custom_code: true\n", 1)
    path.write_text(text)
    done = run(path, expect=2, cwd=folder)  # the last stage fails by design: a user error
    return path, done.stdout + done.stderr


@pytest.mark.integration
@pytest.mark.parametrize("name", ["ddp_lora", "zero2_offload", "fsdp_full"])
def test_ppo_trains_every_parameter_on_two_ranks(ppo_runs, name: str) -> None:
    path, _ = ppo_runs
    record = stage_record(path, name)
    assert record["status"] == "succeeded"
    metrics = record["metrics"]
    # policy (adapters or weights), the critic's adapter and its value head: every one moved
    assert metrics["trainable_changed"] == 1.0
    # the policy moved away from its reference, and not so far that the KL penalty lost hold of it
    assert 1e-3 < metrics["train_kl_last"] < 10
    # LoRA: the reference is the base with adapters off; full parameters: a frozen copy (sharded)
    assert metrics["reference_copy_loaded"] == (0.0 if name != "fsdp_full" else 1.0)
    reports = placement_reports(path, name)
    assert [report["rank"] for report in reports] == [0, 1]


@pytest.mark.integration
def test_fsdp_ppo_shards_policy_critic_and_reference(ppo_runs) -> None:
    path, _ = ppo_runs
    assert_trained_sharded(placement_reports(path, "fsdp_full"))  # policy + value head, and Adam states
    for report in fsdp_reports(path, "fsdp_full"):
        # the policy and its frozen reference copy (the critic's head is a replicated 65 parameters)
        assert sorted(model["trainable"] for model in report["models"]) == [False, True]
        for model in report["models"]:
            assert_sharded(model)
            assert_memory_sharded(model)


@pytest.mark.integration
def test_a_raising_reward_function_is_named_and_its_checkpoint_kept(ppo_runs) -> None:
    path, output = ppo_runs
    assert "reward function 'raising_rewards.explode_on_third_call' raised ZeroDivisionError" in output
    assert "on a batch of 4 completions" in output
    assert not stage_folder(path, "reward_raises").exists()
    kept = list(stage_folder(path, "reward_raises").parent.glob(".reward_raises.failed-*"))
    assert len(kept) == 1
    checkpoint = kept[0] / "checkpoints" / "checkpoint-1"
    assert (checkpoint / "adapter_model.safetensors").is_file()
    assert (checkpoint / "value_head.pt").is_file()
