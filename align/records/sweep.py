"""`sweep.json` in the pipeline's folder: the variants a sweep drew and how each ended, so that a rerun skips
what ended for good (without starting Ray when nothing is left) and resumes what was interrupted."""

from __future__ import annotations

import json
from typing import Any, Literal

from align.records.stage import Part
from align.records.versioned import Record

SWEEP_STATE = "sweep.json"
DRAWN_BY = ("parameters", "method", "seed")  # what makes another sweep: other variants drawn

VariantStatus = Literal["succeeded", "stopped", "failed", "interrupted"]
"""How a variant ended: finished; stopped early by ASHA (for good); failed; interrupted (a rerun resumes)."""


def variant_key(values: dict[str, Any]) -> str:
    """A variant's values as one comparable string."""
    return json.dumps(values, sort_keys=True)


class VariantEnd(Part):
    """One variant: its swept values and how it ended, with the step and reason ASHA stopped it at, or the
    first line of its error."""

    values: dict[str, Any]
    status: VariantStatus
    step: int | None = None
    reason: str | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        return variant_key(self.values)

    @property
    def for_good(self) -> bool:
        """Whether a rerun leaves it as it is (finished, or stopped by ASHA)."""
        return self.status in ("succeeded", "stopped")


class SweepState(Record):
    """The sweep as written (`spec`, to tell whether a later run asks the same) and its variants' ends."""

    spec: dict[str, Any]
    variants: tuple[VariantEnd, ...] = ()

    def drawn_alike(self, spec: dict[str, Any]) -> bool:
        """Whether `spec` draws the same variants (ranking by another metric, or asking for more samples,
        keeps them)."""
        return all(self.spec.get(k) == spec.get(k) for k in DRAWN_BY)
