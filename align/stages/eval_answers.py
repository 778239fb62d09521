"""What an eval stage asks of one model: its answers to this rank's prompts, greedy or sampled with a fixed
seed, in the shape the reward functions take (TRL's: text, or one assistant message for a conversation)."""

from __future__ import annotations

from typing import Any

import torch

from align.config.eval_settings import GenerationSpec
from align.trainers.sampling import moe_generation, only_these_settings, prompt_text

BATCH = 32  # prompts per generate call


@torch.no_grad()
def answers(
    model: Any, tokenizer: Any, prompts: list[Any], generation: GenerationSpec, seed: int
) -> list[str]:
    """`generation.num_samples` answers per prompt, prompt by prompt (sample-major within a prompt), each cut
    at the model's end-of-sequence token. Sampling is seeded by `seed` and the prompt's batch, so that the
    answers do not depend on which rank asked."""
    model.eval()
    greedy = generation.temperature == 0
    texts: list[str] = []
    for start in range(0, len(prompts), BATCH):
        chunk = [prompt_text(prompt, tokenizer) for prompt in prompts[start : start + BATCH]]
        batch = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        sampling = {} if greedy else {"temperature": generation.temperature, "top_p": generation.top_p}
        with torch.random.fork_rng(devices=[]), only_these_settings(model):
            torch.manual_seed(seed + start)
            output = model.generate(
                **batch,
                do_sample=not greedy,
                **sampling,
                num_return_sequences=generation.num_samples,
                max_new_tokens=generation.max_new_tokens,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
                **moe_generation(model),
            )
        new = output[:, batch["input_ids"].shape[1] :]
        texts += tokenizer.batch_decode(new, skip_special_tokens=True)
    return texts


def shaped(prompt: Any, text: str) -> Any:
    """A completion as a reward function receives it: text, or one assistant message after a conversation."""
    return [{"role": "assistant", "content": text}] if isinstance(prompt, list) else text
