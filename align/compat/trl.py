"""TRL's private code that align uses: a trainer's row preparation run without a model, GRPO's and RLOO's
kept generation batch and rollout steps, and the fused-LM-head calls its trainers make. TRL is imported
only inside the functions (align/stages/prepared.py runs before any model loads)."""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from align.compat.versions import check_version

WRITTEN_FOR = ">=1.16,<1.17"
check_version("trl", WRITTEN_FOR)


def prepare_dataset(
    trainer_class: type, attributes: dict[str, Any], dataset: Any, tokenizer: Any, config: Any, name: str
) -> Any:
    """`dataset` as `trainer_class`'s private `_prepare_dataset` prepares it (chat template, tokenization,
    loss masks), run on a stand-in for a trainer, so that no model loads: the stand-in holds what the method
    reads of its trainer, the tokenizer as `_tokenizer`, no vision data, and `attributes` (the public ones
    the trainer's constructor sets). SFT's also takes packing (off here) and a formatting function (none)."""
    import trl

    view = SimpleNamespace(_tokenizer=tokenizer, _is_vision_dataset=False, **attributes)
    if issubclass(trainer_class, trl.SFTTrainer):
        return trainer_class._prepare_dataset(view, dataset, tokenizer, config, False, None, name)
    return trainer_class._prepare_dataset(view, dataset, tokenizer, config, name)


def kept_generation_batch(trainer: Any) -> dict[str, Any] | None:
    """What a GRPO or RLOO trainer keeps of its last generation batches for its completions table (its
    `_logs`: `completion`, and `rewards` by the name each is logged under), every rank's; None before any."""
    return getattr(trainer, "_logs", None)


class RolloutSteps:
    """Put before GRPOTrainer or RLOOTrainer in a named subclass: TRL's two private rollout steps,
    `_generate` (sampling the completions) and `_generate_and_score_completions` (that, then the rewards
    and the old and reference log-probs), each run as `rollout_step(part, step)`, which the subclass
    overrides. TRL times these only for W&B, MLflow or Trackio, and has no public hook around them."""

    def rollout_step(self, part: str, step: Callable[[], Any]) -> Any:
        """Run `step`, the `part` ("generate" or "rollout") of a rollout."""
        return step()

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        trainer = super()
        return self.rollout_step("generate", lambda: trainer._generate(*args, **kwargs))

    def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> Any:
        trainer = super()
        return self.rollout_step("rollout", lambda: trainer._generate_and_score_completions(*args, **kwargs))


Answer = Callable[[Any, Any, Any, Any, Any], Any]
"""(model, outputs, labels, shift_labels, num_items_in_batch) -> TRL's `FusedCausalLMOutput`."""


def answer_fused_lm_head(model: Any, answer: Answer) -> None:
    """Replace `model`'s forward, as TRL's `add_fused_lm_head` left it on the instance, by one that answers
    TRL's trainers' `fused_lm_head=True` calls with `answer(model, outputs, ...)`, from the outputs of the
    forward without it (no cache); every other call goes through unchanged. TRL's trainers make those calls
    on the instance they train, and nothing public routes them. Applying it twice changes nothing."""
    patched = model.forward
    if getattr(patched, "answers_from_logits", False):
        return

    @functools.wraps(type(model).forward)  # its signature: `generate` checks its arguments against it
    def forward(
        self: Any,
        *args: Any,
        fused_lm_head: bool = False,
        labels: Any = None,
        shift_labels: Any = None,
        num_items_in_batch: Any = None,
        **kwargs: Any,
    ) -> Any:
        if not fused_lm_head:
            return patched(
                *args,
                labels=labels,
                shift_labels=shift_labels,
                num_items_in_batch=num_items_in_batch,
                **kwargs,
            )
        kwargs["use_cache"] = False
        outputs = patched(*args, **kwargs)  # fused_lm_head=False: the model's own forward and head
        return answer(self, outputs, labels, shift_labels, num_items_in_batch)

    forward.answers_from_logits = True
    model.forward = types.MethodType(forward, model)
