"""A running stage's progress file (`logs/progress.json`), kept current by its rank 0: the driver's progress
line, `align status` and a sweep's early stopping read it, so the console needs none of the workers' output.
Before the first step it names what the stage is doing (`phase`); `notes` are lines said once each, kept in
every later write so a reader that looks now and then sees each."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from align.records.stage import Part
from align.records.versioned import Record, read, write

LOGS = "logs"  # a stage folder's logs: this file, the workers' logs, metrics.jsonl
PROGRESS = "progress.json"


class LoggedStep(Part):
    """The values a trainer logged at one step."""

    step: int
    values: dict[str, float]


class Progress(Record):
    """Where a stage is: its phase before training, then its step of max_steps, the last shown value, and
    the values of the recent logged steps."""

    started: float
    time: float
    phase: str | None = None  # before the first step: what the stage is doing
    step: int | None = None
    max_steps: int | None = None
    first_step: int = 0  # a resumed run starts past 0
    value: tuple[str, float] | None = None  # the last logged value worth showing, by name
    recent: list[LoggedStep] = []  # the last logged steps: a sweep's ASHA reads each one
    notes: list[str] = []

    @property
    def training(self) -> bool:
        return self.phase is None and self.step is not None

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True) + "\n"  # a phase names no step, not a null one


OnProgress = Callable[[str, "Progress"], None]
"""What the driver calls as a stage's progress file changes: the stage's name, and what the file says."""


def read_progress(logs_dir: Path) -> Progress | None:
    """What a stage's progress file (in its `logs_dir`) says now; None before it has one."""
    return read(logs_dir / PROGRESS, Progress)


def write_progress(logs_dir: Path, progress: Progress) -> None:
    """Rewritten about once a second: whole (renamed into place), but not synced to disk, which would cost
    more than a lost second of progress is worth."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    write(logs_dir / PROGRESS, progress, sync=False)
