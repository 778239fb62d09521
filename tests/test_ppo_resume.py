"""align's PPO resumes exactly: a run resumed from its step-3 checkpoint logs steps 4-6 as the uninterrupted
run does (rewards, losses, KL and its adaptive coefficient), in fp32 on CPU, and ends with the same weights.

In process, one rank, the tiny builtin model, built as align/stages/ppo.py builds it. Three cases, each
taking a different path through the Trainer's resume:
- `full_value_head`: full parameters, a frozen reference copy, the critic a head on the trunk; the checkpoint
  falls inside a rollout (2 optimizer steps each) in the second epoch, so the resume needs the rollout
  itself, the skipped batches and that epoch's prompt order;
- `full_logging_every_2`: the same, logging every 2 steps, so step 3's statistics wait in the checkpoint;
- `lora_value_adapter`: LoRA with the critic on its own adapter, gradient accumulation 2, three PPO epochs
  over each rollout; the checkpoint falls at an epoch's end, where the Trainer skips no batch, and the
  resume finds it with `resume_from_checkpoint=True`.
The resumed trainer starts from perturbed weights, so only the checkpoint can make it match.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from align.models.loading import load_causal_lm, load_tokenizer, resolve_model
from align.trainers.policy_value import PolicyAndValue, add_value_adapter
from align.trainers.ppo import PPOTrainer, RolloutSampler
from align.trainers.ppo_checkpoint import load_state
from align.trainers.ppo_config import PPOConfig

SEED = 13  # some seeds draw the same prompts or mini-batches either way, and would hide a lost state
FULL = {"per_device_train_batch_size": 2, "num_mini_batches": 2, "num_ppo_epochs": 1, "logging_steps": 1}
PROMPTS = ["one two", "the cat sat", "a b c d", "seven", "red green blue", "up and down"]
CASES: dict[str, dict[str, Any]] = {
    "full_value_head": {
        "lora": False,
        "rows": 6,  # a rollout takes 4: one per epoch, and the 2 left out change with the epoch
        "trl": FULL,
    },
    "full_logging_every_2": {  # the statistics of step 3 wait in the checkpoint to be logged at step 4
        "lora": False,
        "rows": 6,
        "trl": {**FULL, "logging_steps": 2},
    },
    "lora_value_adapter": {
        "lora": True,
        "resume_latest": True,  # `train(resume_from_checkpoint=True)`: the newest checkpoint in output_dir
        "rows": 3,  # a rollout takes 2; 3 optimizer steps each: an epoch ends at step 3
        "trl": {
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 2,
            "num_mini_batches": 1,
            "num_ppo_epochs": 3,
            "logging_steps": 1,
        },
    },
}
# every checkpoint: the Trainer's resume state, PPO's, and the tokenizer (no pickled `training_args.bin`)
CHECKPOINT_FILES = {
    *("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"),
    *("value_head.pt", "ppo_state_rank0.pt"),
    *("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"),
}


def word_count_reward(prompts: list[Any], completions: list[Any], columns: dict[str, list[Any]]):
    """Highest for 3 words, so the policy has a signal; returned as PPOTrainer's `RewardFn`."""
    scores = [-abs(len(text.split()) - 3) / 3 for text in completions]
    return scores, {"words": scores}


def build_trainer(case: str, output_dir: Path, perturb: bool = False, **config: Any) -> PPOTrainer:
    """The trainer as the ppo stage builds it; `perturb` moves every trainable weight off its start."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import set_seed

    spec = CASES[case]
    tiny = resolve_model("tiny")
    tokenizer = load_tokenizer(tiny)
    tokenizer.padding_side = "left"
    set_seed(SEED)
    policy = load_causal_lm(tiny)
    if spec["lora"]:
        lora = LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM")
        policy = get_peft_model(policy, lora)
        add_value_adapter(policy, lora)
    model = PolicyAndValue(policy, value_adapter=spec["lora"])
    if perturb:
        with torch.no_grad():
            for param in model.parameters():
                if param.requires_grad:
                    param.add_(torch.randn_like(param))
    args = PPOConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        seed=SEED,
        report_to=[],
        max_steps=6,
        learning_rate=5e-3,
        save_strategy="steps",
        save_steps=3,
        max_completion_length=6,
        temperature=1.0,
        kl_coef=0.05,
        kl_target=0.01,  # the coefficient moves each rollout: its state must survive the resume
        kl_horizon=20,
        **spec["trl"],
        **config,
    )
    return PPOTrainer(
        model=model,
        ref_model=None if spec["lora"] else load_causal_lm(tiny).requires_grad_(False).eval(),
        rewards=word_count_reward,
        args=args,
        train_dataset=Dataset.from_list([{"prompt": text} for text in PROMPTS[: spec["rows"]]]),
        processing_class=tokenizer,
    )


def step_logs(trainer: PPOTrainer) -> dict[int, dict[str, float]]:
    """Each optimizer step's log entry, without the run's closing summary."""
    return {entry["step"]: entry for entry in trainer.state.log_history if "grad_norm" in entry}


def trainable(trainer: PPOTrainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("case", list(CASES))
def test_resumed_run_matches_the_uninterrupted_one(case: str, tmp_path: Path) -> None:
    whole = build_trainer(case, tmp_path / "whole")
    whole.train()
    checkpoint = tmp_path / "whole" / "checkpoint-3"
    policy_files = (
        {"adapter_model.safetensors", "adapter_config.json", "README.md", "value"}
        if CASES[case]["lora"]
        else {"model.safetensors", "config.json", "generation_config.json"}
    )
    assert {path.name for path in checkpoint.iterdir()} == CHECKPOINT_FILES | policy_files
    assert sorted(path.name for path in (tmp_path / "whole").iterdir()) == ["checkpoint-3", "checkpoint-6"]

    # the runner resumes in the stage's own checkpoint folder, where an older checkpoint may lie
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(checkpoint, resumed_dir / "checkpoint-3")
    resumed = build_trainer(
        case,
        resumed_dir,
        perturb=True,
        resume_from_checkpoint=str(resumed_dir / "checkpoint-3"),
        save_total_limit=1,
    )
    latest = CASES[case].get("resume_latest", False)
    resumed.train(resume_from_checkpoint=latest or resumed.args.resume_from_checkpoint)  # as align's runner

    expected, got = step_logs(whole), step_logs(resumed)
    every = int(resumed.args.logging_steps)
    assert sorted(got) == sorted(expected) == list(range(every, 7, every))
    after = [step for step in got if step > 3]
    keys = {"reward", "objective/kl", "objective/kl_coef", "loss/policy_avg", "loss/value_avg"}
    assert keys <= set().union(*(got[step] for step in after))  # rollout statistics log when one starts
    for step in after:
        if step == 4 and every == 2:  # the Trainer's own running loss restarts at a resume (every stage kind)
            del got[step]["loss"], expected[step]["loss"]
        assert set(got[step]) == set(expected[step])
        assert_close(got[step], expected[step], rtol=1e-4, atol=1e-6, msg=lambda m, s=step: f"step {s}: {m}")
    kl_coefs = [entry["objective/kl_coef"] for entry in expected.values() if "objective/kl_coef" in entry]
    assert len(set(kl_coefs)) == len(kl_coefs) >= 2  # logged once per rollout, moved each time
    assert resumed.kl_coef == pytest.approx(whole.kl_coef, rel=1e-6) and whole.kl_coef != 0.05
    assert_close(trainable(resumed), trainable(whole), rtol=1e-4, atol=1e-6)
    assert sorted(path.name for path in resumed_dir.iterdir()) == ["checkpoint-6"]  # save_total_limit


def test_a_checkpoint_without_ppo_state_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="ppo_state_rank1.pt is missing.*start the stage again"):
        load_state(str(tmp_path), rank=1, device=torch.device("cpu"))


def test_rollout_sampler_set_epoch_draws_that_epochs_order() -> None:
    """What a resume in epoch 2 relies on: naming the epoch gives the order the sampler's third pass gives."""
    running = RolloutSampler(12, batch=2, repeats=2, rank=0, world=1, seed=3)
    passes = [list(running) for _ in range(3)]
    fresh = RolloutSampler(12, batch=2, repeats=2, rank=0, world=1, seed=3)
    fresh.set_epoch(2)
    assert list(fresh) == passes[2] != passes[1]
