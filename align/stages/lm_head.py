"""The plan's `plain` LM-head path (align/planning/lora.py says when and why): TRL's trainers call
`model(..., labels=..., fused_lm_head=True)` and read per-token log-probabilities from the answer; their
fused head reads `lm_head.weight` and `lm_head.bias`, which peft's trainable-token wrapper around a tied head
cannot give. Here the same calls are answered from the model's own forward, through whatever wraps its head
(adapters enabled or disabled, softcapping and logit scales as the model applies them), at the cost of
building the logits. What the answer holds is TRL's `FusedCausalLMOutput`, field for field.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

from align.compat.trl import answer_fused_lm_head
from align.planning.lora import PLAIN

IGNORED = -100  # the label of a position that is not scored


class PlainLMHead(TrainerCallback):
    """Puts the plain path on the trained model when training begins: after the trainer's fused head is
    patched in (in its __init__), before the first step or start-of-training evaluation with the adapters
    on. Only TRL's reference log-probs run earlier (DPO and KTO precompute), with the adapters disabled,
    where peft's wrapper reads as the head it wraps and the fused head runs."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        answer_from_logits(base, temperature=getattr(args, "temperature", 1.0))  # GRPO's and RLOO's


def lm_head_callbacks(plan: Any) -> list[Any]:
    """The callbacks that put the plan's LM-head path in place: none for TRL's own fused head."""
    return [PlainLMHead()] if plan.lm_head is not None and plan.lm_head.path == PLAIN else []


def answer_from_logits(model: Any, temperature: float = 1.0) -> None:
    """`model`'s forward, as TRL's `add_fused_lm_head` left it, answering `fused_lm_head=True` from the
    model's logits instead (align/compat/trl.py routes the calls); every other call goes through unchanged.
    Applying it twice changes nothing."""

    def answer(model: Any, outputs: Any, labels: Any, shift_labels: Any, num_items_in_batch: Any) -> Any:
        if shift_labels is None:
            logits, targets = outputs.logits[:, :-1], labels[:, 1:]
        else:
            logits, targets = outputs.logits, shift_labels
        aux = getattr(outputs, "aux_loss", None)
        coefficient = getattr(model.config.get_text_config(), "router_aux_loss_coef", 0.0)
        return scored(logits.float() / temperature, targets, num_items_in_batch, aux, coefficient)

    answer_fused_lm_head(model, answer)


def scored(
    logits: torch.Tensor, labels: torch.Tensor, num_items: Any, aux_loss: Any, aux_coefficient: float
) -> Any:
    """TRL's per-token fields from next-token `logits` (already shifted, temperature applied): each zero
    where the label is ignored; the loss is the summed negative log-likelihood over `num_items` (the
    scored positions when None), plus the weighted MoE balancing loss when the model returned one."""
    from trl.trainer.utils import FusedCausalLMOutput

    mask = labels != IGNORED
    log_softmax = logits.log_softmax(dim=-1)
    log_probs = log_softmax.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1).masked_fill(~mask, 0)
    entropy = -(log_softmax.exp() * log_softmax).sum(dim=-1).masked_fill(~mask, 0)
    with torch.no_grad():
        log_sum_sq_probs = torch.logsumexp(2 * log_softmax, dim=-1).masked_fill(~mask, 0)
        mean_logits = logits.mean(dim=-1).masked_fill(~mask, 0)
        is_top1 = (logits.argmax(dim=-1) == labels) & mask
    loss = -log_probs.sum() / (mask.sum().clamp(min=1) if num_items is None else num_items)
    if aux_loss is not None:
        loss = loss + aux_coefficient * aux_loss
    return FusedCausalLMOutput(
        loss=loss,
        log_probs=log_probs,
        entropy=entropy,
        log_sum_sq_probs=log_sum_sq_probs,
        mean_logits=mean_logits,
        is_top1=is_top1,
        label_mask=mask,
        aux_loss=aux_loss,
    )
