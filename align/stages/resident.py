"""A trainer callback that keeps a rank's resident memory to what one batch needs (data/mapped_pages.py)."""

from __future__ import annotations

from transformers import TrainerCallback

from align.data.mapped_pages import release_mapped_pages


class ReleaseMappedPages(TrainerCallback):
    """After every step the Arrow pages that step read are unmapped, so that over an epoch the rank's RSS
    does not grow to the size of its memory-mapped data."""

    def on_step_end(self, args, state, control, **kwargs):
        release_mapped_pages()
