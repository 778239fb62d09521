"""A small file the running stage keeps current (`logs/progress.json`): the driver's progress line and
`align status` read it, so the console needs none of the workers' output. Before the first step it names
what the stage is doing (`phase`): loading and tokenizing a large file can take minutes. `notes` are lines
said once each (an RL stage that has nothing to learn from), kept in every later write so the driver, which
reads the file now and then, sees each."""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path

from transformers import TrainerCallback

from align.records import LoggedStep, Progress, read_progress, write_progress

RECENT_LOGS = 64
"""Logged steps the file keeps, each with its values: the driver reads the file now and then, several steps
apart on a fast stage, and a sweep's early stopping needs the value logged at each of its rungs."""
SHOWN = ("loss", "reward", "rewards/mean", "eval_loss")
"""Logged values worth a place on the progress line, first found wins."""


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK", "0")) == 0


def with_notes(logs_dir: Path, progress: Progress) -> Progress:
    """`progress` with the notes the file holds so far."""
    found = read_progress(logs_dir)
    return progress.model_copy(update={"notes": found.notes}) if found else progress


def note_phase(logs_dir: Path, phase: str) -> None:
    """On rank 0, what the stage does before its first step (`loading the data`), shown until training
    starts."""
    if is_rank_zero():
        now = time.time()
        write_progress(logs_dir, with_notes(logs_dir, Progress(phase=phase, started=now, time=now)))


def add_note(logs_dir: Path, note: str) -> None:
    """On rank 0, a line the console prints once (and the file keeps), beside whatever the file says."""
    if not is_rank_zero():
        return
    now = time.time()
    found = read_progress(logs_dir) or Progress(phase="starting", started=now, time=now)
    if note not in found.notes:
        write_progress(logs_dir, found.model_copy(update={"notes": [*found.notes, note]}))


class ProgressFile(TrainerCallback):
    """Rank 0 rewrites the file (atomically, at most once a second) with step, total and the last loss."""

    def __init__(self, logs_dir: Path) -> None:
        self.logs_dir = logs_dir
        self.started = time.time()
        self.written = 0.0
        self.last_value: tuple[str, float] | None = None
        self.recent: deque[LoggedStep] = deque(maxlen=RECENT_LOGS)  # a sweep's ASHA reads each logged step
        self.first_step = 0

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.time()
        self.first_step = state.global_step  # a resumed run starts past 0
        self.write(state, force=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        values = {key: float(v) for key, v in (logs or {}).items() if isinstance(v, int | float)}
        if values:
            self.recent.append(LoggedStep(step=state.global_step, values=values))
        for key in SHOWN:
            if logs and isinstance(logs.get(key), int | float):
                self.last_value = (key, float(logs[key]))
                break

    def on_step_end(self, args, state, control, **kwargs):
        self.write(state)

    def on_train_end(self, args, state, control, **kwargs):
        self.write(state, force=True)  # the last steps, which a write a moment before left out

    def write(self, state, force: bool = False) -> None:
        if not state.is_world_process_zero or (not force and time.time() - self.written < 1.0):
            return
        self.written = time.time()
        progress = Progress(
            step=state.global_step,
            max_steps=state.max_steps,
            first_step=self.first_step,
            started=self.started,
            time=self.written,
            value=self.last_value,
            recent=list(self.recent),
        )
        write_progress(self.logs_dir, with_notes(self.logs_dir, progress))
