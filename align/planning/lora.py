"""What LoRA meets in a stage's model, decided with the plan: its `target_modules` against the model's own
modules, whether the chat template's token rows train, and how the trainer reads the LM head (`lm_head`).

TRL 1.16's SFT, DPO, KTO, GRPO and RLOO trainers patch the model with a fused LM head
(`trl.trainer.utils.add_fused_lm_head`): the loss reads `lm_head.weight` and `lm_head.bias` and projects
only the labelled positions, in tiles, never building the logits. TRL has no setting to turn it off. Under
LoRA, the rows of a template's special tokens train through peft's `trainable_token_indices`: in the input
embeddings, and in an untied LM head too (a new token's head row starts as the mean of the others, and the
model would never learn to end a turn). peft wraps the head either way (a `TrainableTokensWrapper`, for a
tied head sharing the embeddings' trained rows), and that wrapper has no `bias`: the fused head fails in
the first step. There the trainer's calls are answered from the model's own logits (`plain`,
align/stages/lm_head.py), which read the wrapper as the model's forward does: trained rows with the
adapters on, loaded ones with them off.
"""

from __future__ import annotations

from dataclasses import dataclass

from align.config.spec import StageBase
from align.config.stage_parts import lora_of
from align.errors import ConfigError, Problem
from align.models.architectures import Architecture, LoraTargets
from align.models.chat_templates import ChatTemplate
from align.models.memory import format_bytes

FUSED, PLAIN = "fused", "plain"
FUSED_HEAD_KINDS = ("sft", "dpo", "kto", "grpo", "rloo")
"""The kinds trained by a TRL trainer that patches the fused LM head; their runners hand peft the template's
token rows to train. Align's PPO and the reward stage read logits and train no rows."""


@dataclass(frozen=True)
class LMHead:
    """How the trainer reads the LM head (`fused` or `plain`) and why, and whether LoRA trains the chat
    template's token rows (peft's `trainable_token_indices`, align/stages/context.py `peft_config`)."""

    path: str
    reason: str
    template_rows: bool = False

    @property
    def summary(self) -> str:
        return f"{self.path} ({self.reason})"


def lora_targets(stage: StageBase, where: str, arch: Architecture | None) -> LoraTargets | None:
    """The stage's `lora.target_modules` against its model's own modules (as given when the model is not
    present yet); a name the model lacks is refused here, not by peft in the worker minutes later."""
    lora = lora_of(stage)
    if lora is None:
        return None
    named = lora.target_modules if isinstance(lora.target_modules, str) else tuple(lora.target_modules)
    if arch is None:
        shown = ", ".join(named) if isinstance(named, tuple) else named
        return LoraTargets(named, summary=f"{shown} (checked against the model once it is present)")
    try:
        return arch.resolve_lora(named)
    except ValueError as err:
        raise ConfigError([Problem(f"{where}.lora.target_modules", str(err))]) from None


def trained_token_rows(
    stage: StageBase, template: ChatTemplate | None, sharded_at_load: bool
) -> tuple[str, ...]:
    """The template's special tokens whose embedding rows LoRA trains (peft's `trainable_token_indices`):
    for the kinds of FUSED_HEAD_KINDS, except on a backend that shards the model as it loads (peft indexes
    the embedding, which FSDP has made a DTensor: aten.index fails on the mix)."""
    if stage.kind not in FUSED_HEAD_KINDS or lora_of(stage) is None or template is None:
        return ()
    return () if sharded_at_load else template.special_tokens


def lm_head(
    stage: StageBase,
    template: ChatTemplate | None,
    arch: Architecture | None,
    sharded_at_load: bool,
    positions: int,
) -> LMHead | None:
    """The LM-head decision of a kind in FUSED_HEAD_KINDS (None for the others).

    Where the template's rows train, peft wraps the head (tied, or untied with its own rows): `plain`.
    `positions` (sequences x tokens per micro-batch) prices the logits the plain path builds."""
    if stage.kind not in FUSED_HEAD_KINDS:
        return None
    tokens = template.special_tokens if template is not None else ()
    if lora_of(stage) is None or not tokens:
        return LMHead(FUSED, "TRL's chunked log-probs read the LM head's weight; the logits are never built")
    rows = f"the template's {len(tokens)} token rows ({' '.join(tokens)})"
    if not trained_token_rows(stage, template, sharded_at_load):
        return LMHead(
            FUSED,
            f"{rows} stay as loaded: peft's trainable tokens cannot index the embeddings FSDP shards as it "
            "loads; train them under zero2 or ddp, or start from a model whose rows are trained",
        )
    if arch is None:
        head = "which the LM head may be tied to (the model is not present yet): peft then wraps the head"
    elif arch.output_head > 0:
        head = "and in the untied LM head, where a new token's row must learn too or the model never ends a "
        head += "turn: peft wraps the head"
    else:
        head = "which the LM head is tied to: peft then wraps the head"
    cost = (
        "" if arch is None else f" ({format_bytes(4 * positions * arch.vocab_size)} in fp32 per micro-batch)"
    )
    return LMHead(
        PLAIN,
        f"LoRA trains {rows} in the embeddings, {head}, which TRL's fused head cannot read, so the loss "
        f"comes from the model's own logits{cost}",
        True,
    )


def trained_rows(
    stage: StageBase, template: ChatTemplate | None, sharded_at_load: bool, arch: Architecture
) -> int:
    """How many embedding rows LoRA trains beside its adapters: each template token's row in the input
    embeddings, and in the LM head too when it is untied (align/stages/context.py `peft_config`)."""
    tokens = len(trained_token_rows(stage, template, sharded_at_load))
    return tokens * (2 if arch.output_head > 0 else 1)
