"""Held-out measures that do not depend on a trainer's internals.

Preference accuracy here is the policy's own judgement: the share of held-out pairs where the
chosen reply has a higher log-probability than the rejected one, and the mean margin between them.
It needs no reference model, so the SFT model a DPO stage starts from is scored the same way.
"""

from __future__ import annotations

from typing import Any

import torch


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
    head = prompt_text(tokenizer, prompt, conversational=isinstance(reply, list))
    prompt_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(training_text(tokenizer, prompt, reply), add_special_tokens=False)["input_ids"]
    ids = torch.tensor([full_ids[:max_length]], device=model.device)
    logits = model(input_ids=ids).logits[0, :-1].float()
    targets = ids[0, 1:]
    token_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]
    return float(token_logprobs[max(len(prompt_ids) - 1, 0) :].sum())


@torch.no_grad()
def preference_scores(model: Any, tokenizer: Any, rows: Any, max_length: int = 256) -> dict[str, float]:
    """Held-out preference accuracy and mean chosen-minus-rejected log-probability margin."""
    was_training = model.training
    model.eval()
    margins = []
    for row in rows:
        chosen = completion_logprob(model, tokenizer, row.get("prompt"), row["chosen"], max_length)
        rejected = completion_logprob(model, tokenizer, row.get("prompt"), row["rejected"], max_length)
        margins.append(chosen - rejected)
    model.train(was_training)
    return {
        "preference_accuracy": sum(m > 0 for m in margins) / len(margins),
        "preference_margin": sum(margins) / len(margins),
    }


@torch.no_grad()
def label_scores(model: Any, tokenizer: Any, rows: Any, max_length: int = 256) -> dict[str, float]:
    """Held-out judgement on unpaired feedback (prompt, completion, label): the mean summed log-probability
    of the desirable completions (label true) minus that of the undesirable ones. Like preference accuracy
    it needs no reference model; it is defined only when the rows hold both labels."""
    was_training = model.training
    model.eval()
    logprobs: dict[bool, list[float]] = {True: [], False: []}
    for row in rows:
        logprob = completion_logprob(model, tokenizer, row.get("prompt"), row["completion"], max_length)
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
