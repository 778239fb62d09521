"""Held-out measures that do not depend on a trainer's internals.

Preference accuracy here is the policy's own judgement: the share of held-out pairs where the
chosen reply has a higher log-probability than the rejected one, and the mean margin between them.
It needs no reference model, so the SFT model a DPO stage starts from is scored the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SCORE_BATCH = 16  # held-out rows per forward


def as_messages(value: Any, role: str) -> list[dict[str, str]]:
    """TRL's standard (a string) or conversational (a list of messages) field, as messages."""
    return value if isinstance(value, list) else [{"role": role, "content": value}]


def training_text(tokenizer: Any, prompt: Any, reply: Any) -> str:
    """A prompt and its reply as TRL trains on them: chat-formatted when the reply is conversational (a
    list of messages), else the plain text prompt + reply + eos (TRL's standard format)."""
    if isinstance(reply, list):
        return tokenizer.apply_chat_template(as_messages(prompt or [], "user") + reply, tokenize=False)
    return (prompt or "") + reply + tokenizer.eos_token


def prompt_text(tokenizer: Any, prompt: Any, conversational: bool) -> str:
    """The prompt alone, as it opens `training_text`."""
    if conversational:
        messages = as_messages(prompt or [], "user")
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prompt or ""


def completion_logprob(model: Any, tokenizer: Any, prompt: Any, reply: Any, max_length: int) -> float:
    """Sum of the reply's token log-probabilities after its prompt, on the text TRL trains on."""
    return completion_logprobs(model, tokenizer, [(prompt, reply)], max_length)[0]


def completion_logprobs(
    model: Any, tokenizer: Any, pairs: list[tuple[Any, Any]], max_length: int, batch_size: int = SCORE_BATCH
) -> list[float]:
    """`completion_logprob` of each (prompt, reply), `batch_size` rows per forward (right-padded: a row's
    own tokens see none of the padding after them)."""
    rows = []
    for prompt, reply in pairs:
        head = prompt_text(tokenizer, prompt, conversational=isinstance(reply, list))
        start = max(len(tokenizer(head, add_special_tokens=False)["input_ids"]) - 1, 0)
        ids = tokenizer(training_text(tokenizer, prompt, reply), add_special_tokens=False)["input_ids"]
        rows.append((ids[:max_length], start))
    sums = []
    for first in range(0, len(rows), batch_size):
        chunk = rows[first : first + batch_size]
        width = max(len(ids) for ids, _ in chunk)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in chunk], device=model.device)
        mask = torch.tensor(
            [[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in chunk], device=model.device
        )
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float()
        token_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
        for row, (row_ids, start) in enumerate(chunk):
            sums.append(float(token_logprobs[row, start : len(row_ids) - 1].sum()))
    return sums


@torch.no_grad()
def pair_logprobs(model: Any, tokenizer: Any, rows: Any, max_length: int = 256) -> PairLogprobs:
    """The model's summed log-probability of each held-out pair's chosen and rejected reply, in one pass."""
    was_training = model.training
    model.eval()
    chosen = completion_logprobs(model, tokenizer, [(r.get("prompt"), r["chosen"]) for r in rows], max_length)
    rejected = completion_logprobs(
        model, tokenizer, [(r.get("prompt"), r["rejected"]) for r in rows], max_length
    )
    model.train(was_training)
    return PairLogprobs(chosen, rejected)


@dataclass(frozen=True)
class PairLogprobs:
    """Summed log-probabilities of held-out pairs' chosen and rejected replies, pair by pair."""

    chosen: list[float]
    rejected: list[float]

    def scores(self) -> dict[str, float]:
        """Preference accuracy and the mean chosen-minus-rejected margin (a tie counts as wrong)."""
        margins = [c - r for c, r in zip(self.chosen, self.rejected, strict=True)]
        return {
            "preference_accuracy": sum(m > 0 for m in margins) / len(margins),
            "preference_margin": sum(margins) / len(margins),
        }


def preference_scores(model: Any, tokenizer: Any, rows: Any, max_length: int = 256) -> dict[str, float]:
    """Held-out preference accuracy and mean chosen-minus-rejected log-probability margin."""
    return pair_logprobs(model, tokenizer, rows, max_length).scores()


@torch.no_grad()
def label_scores(model: Any, tokenizer: Any, rows: Any, max_length: int = 256) -> dict[str, float]:
    """Held-out judgement on unpaired feedback (prompt, completion, label): the mean summed log-probability
    of the desirable completions (label true) minus that of the undesirable ones. Like preference accuracy
    it needs no reference model; it is defined only when the rows hold both labels."""
    was_training = model.training
    model.eval()
    logprobs: dict[bool, list[float]] = {True: [], False: []}
    scored = completion_logprobs(
        model, tokenizer, [(r.get("prompt"), r["completion"]) for r in rows], max_length
    )
    for row, logprob in zip(rows, scored, strict=True):
        logprobs[bool(row["label"])].append(logprob)
    model.train(was_training)
    if not logprobs[True] or not logprobs[False]:
        raise ValueError(
            f"label_margin needs desirable and undesirable rows; got {len(logprobs[True])} desirable and "
            f"{len(logprobs[False])} undesirable"
        )
    desirable = sum(logprobs[True]) / len(logprobs[True])
    undesirable = sum(logprobs[False]) / len(logprobs[False])
    return {"label_margin": desirable - undesirable}
