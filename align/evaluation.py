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


def completion_logprob(
    model: Any, tokenizer: Any, prompt: list[dict], reply: list[dict], max_length: int
) -> float:
    """Sum of the reply's token log-probabilities after the chat-formatted prompt."""
    prompt_text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    full_text = tokenizer.apply_chat_template(prompt + reply, tokenize=False)
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(full_text, add_special_tokens=False)["input_ids"][:max_length]
    ids = torch.tensor([full_ids], device=model.device)
    logits = model(input_ids=ids).logits[0, :-1].float()
    targets = ids[0, 1:]
    token_logprobs = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None])[:, 0]
    return float(token_logprobs[len(prompt_ids) - 1 :].sum())


@torch.no_grad()
def preference_scores(model: Any, tokenizer: Any, rows: Any, max_length: int = 256) -> dict[str, float]:
    """Held-out preference accuracy and mean chosen-minus-rejected log-probability margin."""
    was_training = model.training
    model.eval()
    margins = []
    for row in rows:
        prompt = as_messages(row.get("prompt", []), "user")
        chosen = completion_logprob(
            model, tokenizer, prompt, as_messages(row["chosen"], "assistant"), max_length
        )
        rejected = completion_logprob(
            model, tokenizer, prompt, as_messages(row["rejected"], "assistant"), max_length
        )
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
        prompt = as_messages(row.get("prompt", []), "user")
        reply = as_messages(row["completion"], "assistant")
        logprobs[bool(row["label"])].append(completion_logprob(model, tokenizer, prompt, reply, max_length))
    model.train(was_training)
    if not logprobs[True] or not logprobs[False]:
        raise ValueError(
            f"label_margin needs desirable and undesirable rows; got {len(logprobs[True])} desirable and "
            f"{len(logprobs[False])} undesirable"
        )
    desirable = sum(logprobs[True]) / len(logprobs[True])
    undesirable = sum(logprobs[False]) / len(logprobs[False])
    return {"label_margin": desirable - undesirable}
