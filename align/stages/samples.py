"""Greedy completions of a few held-out prompts before and after a stage: what a person reads to see what
training did to the model, beside the numbers. They go into the stage's record (`samples`), which
`align report` shows."""

from __future__ import annotations

from typing import Any

import torch

from align.trainers.sampling import moe_generation, prompt_text

SAMPLE_PROMPTS = 4
SAMPLE_TOKENS = 24  # enough to read a reply's start, cheap even for a large model under a sharded backend
SCAN_ROWS = 64  # held-out rows read for distinct prompts


def row_prompt(row: dict[str, Any]) -> Any:
    """A row's prompt: the `prompt` column, or a conversation's turns before its last reply, or the first
    half of a plain text (SFT's `text` format has no prompt of its own)."""
    if "prompt" in row:
        return row["prompt"]
    if "messages" in row:
        return row["messages"][:-1]
    words = row["text"].split()
    return " ".join(words[: max(1, len(words) // 2)])


def sample_prompts(rows: Any, count: int = SAMPLE_PROMPTS) -> list[Any]:
    """The first `count` distinct held-out prompts (held-out data may pair one prompt with several
    replies), read from the first SCAN_ROWS rows; none for a count of 0."""
    prompts: list[Any] = []
    if count == 0:
        return prompts
    for row in rows.select(range(min(SCAN_ROWS, len(rows)))):
        prompt = row_prompt(row)
        if prompt not in prompts:
            prompts.append(prompt)
        if len(prompts) == count:
            break
    return prompts


def shown(prompt: Any) -> str:
    """A prompt as a person reads it: the text, or each turn as `role: content` on its own line."""
    if isinstance(prompt, list):
        return "\n".join(f"{turn['role']}: {turn['content']}" for turn in prompt)
    return prompt


@torch.no_grad()
def greedy_completions(
    model: Any, tokenizer: Any, prompts: list[Any], max_new_tokens: int = SAMPLE_TOKENS
) -> list[str]:
    """One greedy completion per prompt, in one batch. Every rank calls it: under a sharded backend each
    forward is a collective, so every rank keeps stepping until all are done (`synced_gpus`)."""
    if not prompts:
        return []
    was_training = model.training
    model.eval()
    texts = [prompt_text(prompt, tokenizer) for prompt in prompts]
    batch = tokenizer(
        texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False
    ).to(model.device)
    synced = torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1
    output = model.generate(
        **batch,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        synced_gpus=synced,
        **moe_generation(model),
    )
    model.train(was_training)
    return tokenizer.batch_decode(output[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)


def paired(prompts: list[Any], before: list[str], after: list[str]) -> list[dict[str, str]]:
    """The record's `samples`: each prompt as shown, with its completion before and after."""
    return [
        {"prompt": shown(prompt), "before": first, "after": last}
        for prompt, first, last in zip(prompts, before, after, strict=True)
    ]
