"""`sweep.json` in the pipeline's folder: the variants a sweep drew and how each ended, so that a rerun skips
what ended for good (without starting Ray when nothing is left) and resumes what was interrupted. A frozen,
versioned record, written and read only here (a file that predates its format number is format 1)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from align.errors import AlignError
from align.pipeline.sweep import Sweep

STATE = "sweep.json"
FORMAT = 1
DRAWN_BY = ("parameters", "method", "seed")  # what makes another sweep: other variants drawn

Status = Literal["succeeded", "stopped", "failed", "interrupted"]
"""How a variant ended: finished; stopped early by ASHA (for good); failed; interrupted (a rerun resumes)."""


def key(values: dict[str, Any]) -> str:
    """A variant's values as one comparable string."""
    return json.dumps(values, sort_keys=True)


class VariantEnd(BaseModel):
    """One variant: its swept values and how it ended, with the step and reason ASHA stopped it at, or the
    first line of its error."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    values: dict[str, Any]
    status: Status
    step: int | None = None
    reason: str | None = None
    error: str | None = None

    @property
    def key(self) -> str:
        return key(self.values)

    @property
    def for_good(self) -> bool:
        """Whether a rerun leaves it as it is (finished, or stopped by ASHA)."""
        return self.status in ("succeeded", "stopped")


class SweepState(BaseModel):
    """The sweep as written (`spec`, to tell whether a later run asks the same) and its variants' ends."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    format: int = FORMAT
    spec: dict[str, Any]
    variants: tuple[VariantEnd, ...] = ()


def read_state(path: Path, sweep: Sweep) -> list[VariantEnd]:
    """The variants an earlier run of this same sweep drew, with how each ended; none for another sweep (other
    values, method or seed: ranking by another metric, or asking for more samples, keeps them) or no file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict):
        return []
    if data.get("format", 1) > FORMAT:
        raise AlignError(
            f"{path}: sweep state format {data['format']}, newer than this align reads ({FORMAT})"
        )
    state = SweepState.model_validate(data)
    ours = sweep.spec.model_dump(mode="json")
    return list(state.variants) if all(state.spec.get(k) == ours[k] for k in DRAWN_BY) else []


def write_state(path: Path, sweep: Sweep, variants: list[VariantEnd]) -> None:
    """Write the sweep's state whole (a temporary file renamed into place)."""
    state = SweepState(spec=sweep.spec.model_dump(mode="json"), variants=tuple(variants))
    scratch = path.parent / f".{path.name}.{uuid.uuid4().hex[:8]}"
    scratch.write_text(state.model_dump_json(indent=2, exclude_none=True) + "\n")
    os.replace(scratch, path)
