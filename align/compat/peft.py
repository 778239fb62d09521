"""peft's private code that align uses: the switches of its LoRA layers, flipped without re-marking which
parameters train."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from align.compat.versions import check_version

WRITTEN_FOR = ">=0.21,<0.22"
check_version("peft", WRITTEN_FOR)


@contextmanager
def lora_switches(model: Any, *, active: str | None = None, disabled: bool = False) -> Iterator[None]:
    """Run `model`'s LoRA layers with one adapter (`active`), or with none (`disabled`), for this block,
    then put each layer's switches back. peft's public `set_adapter` and `disable_adapter` (on the model
    and on each layer) also set `requires_grad` of the adapters' parameters, so only the layers' own
    switches, `_active_adapter` and `_disable_adapters`, are flipped."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [module for module in model.modules() if isinstance(module, BaseTunerLayer)]
    saved = [(layer._active_adapter, layer._disable_adapters) for layer in layers]
    for layer in layers:
        layer._active_adapter = [active] if active else layer._active_adapter
        layer._disable_adapters = disabled
    try:
        yield
    finally:
        for layer, (names, off) in zip(layers, saved, strict=True):
            layer._active_adapter, layer._disable_adapters = names, off
