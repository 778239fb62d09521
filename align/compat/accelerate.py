"""accelerate's private code that align uses: resetting its process-wide singletons between stages."""

from __future__ import annotations

from align.compat.versions import check_version

WRITTEN_FOR = ">=1.16,<1.17"
check_version("accelerate", WRITTEN_FOR)


def reset_accelerate_state() -> None:
    """Forget the `AcceleratorState` (with its `PartialState`) and the `GradientState` a stage left: they
    are shared by every Accelerator of the process and refuse a second stage with other settings. accelerate
    resets them this way in its own tests; nothing public does."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
