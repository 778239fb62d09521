"""Sampling completions with HF `generate`, cut at the stop token: shared by PPO rollouts and the RL
stages' held-out reward measurement, so both see completions made the same way."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Completions:
    """Left-padded prompts and their completions; `completion_mask` covers the real tokens (EOS included)."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor
    ended: torch.Tensor  # whether each completion produced its stop token

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([self.prompt_mask, self.completion_mask], dim=1)


def prompt_text(prompt: Any, tokenizer: Any) -> str:
    """A prompt as the policy sees it: chat-formatted with the generation prompt, or as written."""
    if isinstance(prompt, list):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return prompt


def cut_at_stop(tokens: torch.Tensor, stop_id: int | None, pad_id: int) -> tuple[torch.Tensor, ...]:
    """Tokens after the first stop token become padding: (tokens, mask with the stop token, ended)."""
    length = tokens.shape[1]
    positions = torch.arange(length, device=tokens.device).expand_as(tokens)
    if stop_id is None:
        is_stop = torch.zeros_like(tokens, dtype=torch.bool)
    else:
        is_stop = tokens == stop_id
    ended = is_stop.any(dim=1)
    first_stop = torch.where(
        ended, is_stop.int().argmax(dim=1), torch.full_like(ended, length, dtype=torch.long)
    )
    mask = (positions <= first_stop.unsqueeze(1)).long()
    return tokens.masked_fill(mask == 0, pad_id), mask, ended


@contextmanager
def only_these_settings(model: Any) -> Iterator[None]:
    """Sample with exactly the settings `generate` is given: `generate` fills every unset one (a
    `repetition_penalty`, a `top_k`) from the checkpoint's generation_config.json, which would make the
    samples come from another distribution than the one their log-probs are computed under."""
    from transformers import GenerationConfig

    owner = model.get_base_model() if hasattr(model, "get_base_model") else model
    saved = owner.generation_config
    owner.generation_config = GenerationConfig()
    try:
        yield
    finally:
        owner.generation_config = saved


def moe_generation(model: Any) -> dict[str, bool]:
    """What `generate` must be told of a MoE model that TRL set to return router logits for its auxiliary
    loss (`output_router_logits`): not to, because transformers' loss over them fails on a cached step."""
    config = getattr(model, "config", None)
    return {"output_router_logits": False} if getattr(config, "output_router_logits", False) else {}


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[Any],
    *,
    max_new_tokens: int,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    stop_at_eos: bool = True,
    synced: bool = False,
) -> Completions:
    """Sample one completion per prompt; `synced` keeps every rank stepping until all are done, which a
    sharded model needs (each forward is a collective)."""
    texts = [prompt_text(prompt, tokenizer) for prompt in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    stop_id = tokenizer.eos_token_id if stop_at_eos else None
    with only_these_settings(model):
        output = model.generate(
            **batch,
            do_sample=True,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            max_new_tokens=max_new_tokens,
            min_new_tokens=0 if stop_at_eos else max_new_tokens,
            eos_token_id=stop_id,
            pad_token_id=tokenizer.pad_token_id,
            synced_gpus=synced,
            **moe_generation(model),
        )
    new_tokens = output[:, batch["input_ids"].shape[1] :]
    if new_tokens.shape[1] < max_new_tokens:  # every completion stopped early
        pad = new_tokens.new_full(
            (len(new_tokens), max_new_tokens - new_tokens.shape[1]), tokenizer.pad_token_id
        )
        new_tokens = torch.cat([new_tokens, pad], dim=1)
    tokens, mask, ended = cut_at_stop(new_tokens, stop_id, tokenizer.pad_token_id)
    return Completions(batch["input_ids"], batch["attention_mask"], tokens, mask, ended)


def decode(tokenizer: Any, completions: Completions, prompts: list[Any]) -> list[Any]:
    """Completion texts in TRL's shape: strings, or one assistant message for a conversational prompt."""
    texts = tokenizer.batch_decode(completions.completion_ids, skip_special_tokens=True)
    return [
        [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
        for prompt, text in zip(prompts, texts, strict=True)
    ]


def synced_clock() -> float:
    """Wall time once the accelerator has finished what was queued (CUDA runs asynchronously)."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter()


def train_runtime(trainer: Any) -> float | None:
    """Seconds of the trainer's last `train()`, as the Trainer logged them (`train_runtime`)."""
    logged = (
        entry["train_runtime"] for entry in reversed(trainer.state.log_history) if "train_runtime" in entry
    )
    return next(logged, None)


def time_split(trainer: Any, generate: float, score: float) -> dict[str, float]:
    """How an RL trainer's last `train()` divided, as every RL stage records it: seconds generating,
    scoring, and updating (the rest of the train loop)."""
    runtime = train_runtime(trainer) or 0.0
    return {
        "time_generate_s": generate,
        "time_score_s": score,
        "time_update_s": max(runtime - generate - score, 0.0),
    }
