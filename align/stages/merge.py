"""Merge LoRA adapters into their base and save a plain `transformers` model folder.

Merging must not change the model: the merged model's logits are compared with the adapter
model's on a few prompts in fp32, and the stage fails if they differ by more than the tolerance. The
merged model is then published in the input model's dtype (a bf16 base gives a bf16 model), or the
stage's `save_dtype`.
"""

from __future__ import annotations

import torch

from align.errors import StageFailed
from align.planning.plan import ModelInput
from align.records import StageResult
from align.stages.context import StageContext, load_stage_model, stage_tokenizer
from align.stages.export import publish
from align.stages.samples import SAMPLE_PROMPTS, greedy_completions, paired


@torch.no_grad()
def prompt_logits(model: torch.nn.Module, tokenizer, prompts: list[str]) -> list[torch.Tensor]:
    """Logits for each chat-formatted prompt, in fp32."""
    model.eval()
    logits = []
    for prompt in prompts:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]
        logits.append(model(input_ids=ids).logits.float())
    return logits


def run(ctx: StageContext) -> StageResult:
    """Apply every adapter of the input, check the merge is exact, and save model/ (in the input's dtype)
    with its tokenizer. The check prompts' greedy completions by the adapter model and by the merged one
    are its samples."""
    from peft import PeftModel

    stage = ctx.plan.stage
    *earlier, last = ctx.model_input.adapters
    tokenizer = stage_tokenizer(ctx)
    before_last = ctx.with_model(ModelInput(ctx.model_input.base, tuple(earlier)))
    base = load_stage_model(before_last, tokenizer=tokenizer)  # rows for the tokens the last stage added
    adapted = PeftModel.from_pretrained(base, last)
    before = prompt_logits(adapted, tokenizer, stage.check_prompts)
    prompts = [[{"role": "user", "content": text}] for text in stage.check_prompts[:SAMPLE_PROMPTS]]
    completions_before = greedy_completions(adapted, tokenizer, prompts)
    merged = adapted.merge_and_unload()
    after = prompt_logits(merged, tokenizer, stage.check_prompts)
    completions_after = greedy_completions(merged, tokenizer, prompts)
    max_delta = max(float((a - b).abs().max()) for a, b in zip(before, after, strict=True))
    if max_delta > stage.tolerance:
        raise StageFailed(
            f"merged logits differ from the adapter model's by {max_delta:.3g} "
            f"> tolerance {stage.tolerance:g}; the merged model was not published"
        )
    folder = ctx.output_dir / "model"
    merged.save_pretrained(str(folder), safe_serialization=True)
    publish(ctx, folder, "model")
    tokenizer.save_pretrained(str(folder))
    return StageResult(
        output="model",
        metrics={
            "merge_max_abs_logit_delta": max_delta,
            "adapters_merged": float(len(ctx.model_input.adapters)),
        },
        samples=paired(prompts, completions_before, completions_after),
    )
