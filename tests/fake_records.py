"""Stage records as the controller writes them, for tests that lay out a run folder by hand: the fields a
test looks at are its own, the rest filled in so the record is a whole one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from align.records import StageRecord, write

RESOLVED = {"backend": "ddp", "workers": 1, "precision": "fp32", "seed": 0, "model": "tiny"}


def a_record(stage: str = "stage", **fields: Any) -> StageRecord:
    """A record of `stage` with `fields` (a partial `resolved` is completed)."""
    resolved = {**RESOLVED, **fields.pop("resolved", {})}
    whole = {"pipeline": "p", "stage": stage, "kind": "sft", "fingerprint": "f", "config": {}, "started": 0.0}
    return StageRecord.model_validate({**whole, "resolved": resolved, **fields})


def write_record(folder: Path, **fields: Any) -> None:
    """`folder/align-stage.json`, written as the controller writes it."""
    folder.mkdir(parents=True, exist_ok=True)
    write(folder / "align-stage.json", a_record(folder.name, **fields))
