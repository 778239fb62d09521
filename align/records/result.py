"""What rank 0 leaves in the stage's scratch folder for the driver: its result (`.result.json`) when the
stage ends, or a user error found late (`.error.json`), which the driver shows as it is, without a
traceback. The launcher reads and removes both; nothing else touches them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from align.records.stage import Metrics
from align.records.versioned import Record, read, write

RESULT = ".result.json"
ERROR = ".error.json"


class StageResult(Record):
    """What a runner produced: `adapter` or `model` (a folder of that name, or `eval` for an eval stage's
    results), its final metrics, and greedy completions of held-out prompts before and after."""

    output: str
    metrics: Metrics = {}
    steps: int | None = None  # the optimizer step training ended at (a resumed run counts from its start)
    samples: list[dict[str, Any]] = []


class StageError(Record):
    """A user error a rank found once the stage ran (a bad row, a missing file): its type and message."""

    type: str
    message: str


def write_result(folder: Path, result: StageResult) -> None:
    write(folder / RESULT, result)


def write_error(folder: Path, error: StageError) -> None:
    write(folder / ERROR, error)


def read_result(folder: Path) -> StageResult | None:
    return read(folder / RESULT, StageResult)


def read_error(folder: Path) -> StageError | None:
    return read(folder / ERROR, StageError)


def clear(folder: Path) -> None:
    """Remove what an earlier attempt's rank 0 left, before another starts."""
    for name in (RESULT, ERROR):
        (folder / name).unlink(missing_ok=True)


def take_result(folder: Path) -> StageResult | None:
    """The result rank 0 left, removed from the folder (it is not one of the stage's outputs)."""
    found = read_result(folder)
    clear(folder)
    return found
