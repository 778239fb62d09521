"""Merge LoRA adapters into their base and save a plain `transformers` model folder.

Merging must not change the model: the merged model's logits are compared with the adapter model's on
a few prompts in fp32, against the model's own scale (the difference relative to the largest logit, the KL
of the next-token distributions, the share of greedy tokens that agree), so that the noise of summing in
another order passes and a dropped or mis-scaled adapter fails. The merged model is then published in
the input model's dtype (a bf16 base gives a bf16 model), or the stage's `save_dtype`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from align.config.spec import MergeStage
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


@dataclass(frozen=True)
class MergeCheck:
    """How far the merged model's logits are from the adapter model's, over all the check prompts."""

    max_abs_delta: float  # the largest logit difference
    relative_delta: float  # ... each prompt's over its largest logit magnitude, the largest of them
    max_kl: float  # KL(adapter || merged) of the next-token distributions, the largest over positions
    greedy_agreement: float  # the share of positions whose greedy token is the same
    largest_logit: float  # the adapter model's largest logit magnitude, for the failure line

    def metrics(self) -> dict[str, float | str]:
        return {
            "merge_max_abs_logit_delta": self.max_abs_delta,
            "merge_relative_logit_delta": self.relative_delta,
            "merge_max_kl": self.max_kl,
            "merge_greedy_agreement": self.greedy_agreement,
        }


def measure(before: list[torch.Tensor], after: list[torch.Tensor]) -> MergeCheck:
    """The figures of a merge, from each prompt's logits (batch 1, positions, vocabulary) before and after.
    KL is computed in float64, so that it measures the logits rather than the softmax's own rounding."""
    deltas = [float((a - b).abs().max()) for a, b in zip(before, after, strict=True)]
    scales = [float(a.abs().max()) for a in before]
    kls = [
        torch.nn.functional.kl_div(
            b.double().log_softmax(-1), a.double().log_softmax(-1), log_target=True, reduction="none"
        )
        .sum(-1)
        .max()
        for a, b in zip(before, after, strict=True)
    ]
    same = sum(int((a.argmax(-1) == b.argmax(-1)).sum()) for a, b in zip(before, after, strict=True))
    return MergeCheck(
        max_abs_delta=max(deltas),
        relative_delta=max(delta / max(scale, 1e-30) for delta, scale in zip(deltas, scales, strict=True)),
        max_kl=max(0.0, float(max(kls))),
        greedy_agreement=same / sum(a.shape[-2] for a in before),
        largest_logit=max(scales),
    )


def check_problems(check: MergeCheck, stage: MergeStage, where: str) -> list[str]:
    """Each bound of `stage` the merge breaks, naming the YAML key that sets it."""
    relative, kl, agreement = check.relative_delta, check.max_kl, check.greedy_agreement
    bounds = [
        (relative > stage.tolerance, f"relative logit delta {relative:.3g} >", "tolerance", stage.tolerance),
        (kl > stage.max_kl, f"next-token KL {kl:.3g} >", "max_kl", stage.max_kl),
        (
            agreement < stage.min_greedy_agreement,
            f"greedy agreement {agreement:.3g} <",
            "min_greedy_agreement",
            stage.min_greedy_agreement,
        ),
    ]
    return [f"{figure} {where}.{key} {limit:g}" for broken, figure, key, limit in bounds if broken]


def failure_line(check: MergeCheck, problems: list[str]) -> str:
    return (
        f"the merged model differs from the adapter model: {'; '.join(problems)} (measured: max abs logit "
        f"delta {check.max_abs_delta:.3g} with logits up to {check.largest_logit:.3g}, relative "
        f"{check.relative_delta:.3g}, KL {check.max_kl:.3g}, greedy agreement {check.greedy_agreement:.3g}); "
        "the merged model was not published"
    )


def run(ctx: StageContext) -> StageResult:
    """Apply every adapter of the input, check the merge kept the model (`measure`), and save model/ (in
    the input's dtype) with its tokenizer. The check prompts' greedy completions by the adapter model and by
    the merged one are its samples."""
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
    check = measure(before, after)
    if problems := check_problems(check, stage, ctx.plan.where):
        raise StageFailed(failure_line(check, problems))
    folder = ctx.output_dir / "model"
    merged.save_pretrained(str(folder), safe_serialization=True)
    publish(ctx, folder, "model")
    tokenizer.save_pretrained(str(folder))
    return StageResult(
        output="model",
        metrics={
            **check.metrics(),
            "adapters_merged": float(len(ctx.model_input.adapters)),
        },
        samples=paired(prompts, completions_before, completions_after),
    )
