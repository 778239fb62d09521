"""How far the student is from its teacher on held-out prompts, measured before and after a distill stage.

The teacher answers each held-out prompt greedily, once (it is frozen, so both measurements read the same
answers). On each answer, after its prompt:
- `teacher_jsd`: the divergence the trainer minimises, computed by the trainer itself (its generalized JSD
  at `beta`, with its temperature), averaged over the answer's tokens;
- `teacher_agreement`: the share of the answer's tokens that the student's own greedy choice (its argmax
  at that position) also picks.
Each is the mean over prompts, with its 95% bootstrap interval over prompts (`_ci_low`, `_ci_high`).
Every rank measures every prompt, in the same order: under fsdp each forward is a collective.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from align.measures.stats import mean_interval
from align.stages.training import no_measure, suffixed
from align.trainers.sampling import generate

HELD_OUT_PROMPTS = 64  # the most held-out prompts measured: each is one generation and three forwards


@dataclass(frozen=True)
class Answer:
    """One prompt's tokens and the teacher's greedy answer to it, as TRL's distillation batches hold them."""

    prompt_ids: torch.Tensor  # (1, P)
    completion_ids: torch.Tensor  # (1, C), the answer's tokens up to and with its stop token

    def batch(self) -> dict[str, torch.Tensor]:
        return {
            "prompt_ids": self.prompt_ids,
            "prompt_mask": torch.ones_like(self.prompt_ids),
            "completion_ids": self.completion_ids,
            "completion_mask": torch.ones_like(self.completion_ids),
        }


@torch.no_grad()
def greedy_answers(teacher: Any, tokenizer: Any, prompts: list[Any], max_new_tokens: int) -> list[Answer]:
    """The teacher's greedy answer to each prompt, one prompt at a time (no padding shifts a position).
    Sampling from the top token alone is greedy decoding through the sampler the RL stages share."""
    synced = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
    answers = []
    for prompt in prompts:
        found = generate(
            teacher,
            tokenizer,
            [prompt],
            max_new_tokens=max_new_tokens,
            temperature=1.0,
            top_k=1,
            synced=synced,
        )
        length = int(found.completion_mask.sum())
        answers.append(Answer(found.prompt_ids, found.completion_ids[:, :length]))
    return answers


@torch.no_grad()
def agreement(student: Any, answer: Answer) -> float:
    """The share of the answer's tokens that are the student's argmax where it predicts them."""
    prompt, completion = answer.prompt_ids, answer.completion_ids
    logits = student(input_ids=torch.cat([prompt, completion], dim=1)).logits
    start = prompt.shape[1] - 1  # the position whose next token is the answer's first
    picked = logits[0, start : start + completion.shape[1]].argmax(dim=-1)
    return float((picked == completion[0]).float().mean())


@torch.no_grad()
def divergence(trainer: Any, answer: Answer) -> float:
    """The trainer's own loss on one answer: its divergence per answer token, at its beta and temperature."""
    return float(trainer.compute_loss(trainer.model, answer.batch()))


def with_interval(name: str, values: list[float], seed: int) -> dict[str, float]:
    interval = mean_interval(values, seed=seed)
    return {name: interval.mean, f"{name}_ci_low": interval.low, f"{name}_ci_high": interval.high}


def teacher_measure(trainer: Any, tokenizer: Any, rows: Any, seed: int) -> Callable[[str], dict[str, float]]:
    """The distill runner's held-out measure, called `before` and `after` training: the student against the
    teacher on the held-out prompts (`teacher_jsd_*`, `teacher_agreement_*`, each with its interval), the
    teacher answering once."""
    if rows is None:
        return no_measure
    prompts = list(rows.select(range(min(HELD_OUT_PROMPTS, len(rows))))["prompt"])
    device = trainer.accelerator.device
    answers: list[Answer] = []

    def measure(phase: str) -> dict[str, float]:
        if not answers:
            teacher = trainer.accelerator.unwrap_model(trainer.teacher_model)
            length = trainer.args.max_completion_length
            found = greedy_answers(teacher, tokenizer, prompts, length)
            answers.extend(Answer(a.prompt_ids.to(device), a.completion_ids.to(device)) for a in found)
        student = trainer.model
        was_training = student.training
        student.eval()  # the trainer's loss reads the mode: no generation, no gradient accounting
        jsd = [divergence(trainer, answer) for answer in answers]
        agreed = [agreement(student, answer) for answer in answers]
        student.train(was_training)
        measured = with_interval("teacher_jsd", jsd, seed) | with_interval("teacher_agreement", agreed, seed)
        tokens = float(sum(answer.completion_ids.shape[1] for answer in answers))
        return {**suffixed(measured, phase), "teacher_prompts": float(len(answers)), "teacher_tokens": tokens}

    return measure
