"""A sweep's state (`sweep.json`, align/records/sweep.py) read for this sweep: the variants an earlier run of
the same sweep drew, with how each ended."""

from __future__ import annotations

from pathlib import Path

from align.pipeline.sweep import Sweep
from align.records import SweepState, VariantEnd, read, write
from align.records.sweep import SWEEP_STATE as STATE
from align.records.sweep import variant_key as key

__all__ = ["STATE", "VariantEnd", "key", "read_state", "write_state"]


def read_state(path: Path, sweep: Sweep) -> list[VariantEnd]:
    """The variants an earlier run of this same sweep drew, with how each ended; none for another sweep (other
    values, method or seed) or no file."""
    state = read(path, SweepState)
    return list(state.variants) if state and state.drawn_alike(sweep.spec.model_dump(mode="json")) else []


def write_state(path: Path, sweep: Sweep, variants: list[VariantEnd]) -> None:
    """Write the sweep's state whole (a temporary file renamed into place)."""
    write(path, SweepState(spec=sweep.spec.model_dump(mode="json"), variants=tuple(variants)))
