"""`align status PIPELINE_FILE_OR_RUN_FOLDER`: where a local run stands, read from what it leaves on disk
(each stage's record, the progress file a running stage keeps, the run lock) without disturbing it.

A stage is `done` (published), `running` (step, rate, ETA), `interrupted` (its attempt holds a "running"
record but no live run holds the lock: a kill or a crash; the next `align run` resumes it), `failed`
(with the first line of why) or `pending`.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from align.console import progress_text
from align.run.lock import LOCK, describe, same_process
from align.run.records import RECORD, attempts, read_record
from align.run.worker import PROGRESS_FILE


@dataclass(frozen=True)
class StageState:
    name: str
    state: str  # done | running | interrupted | failed | pending
    detail: str = ""


def live_holder(folder: Path) -> dict[str, Any] | None:
    """Who holds the run lock, when that process is alive (a killed run's holder is stale). The lock file
    is only read: taking the lock, even briefly, could refuse a run starting at that moment."""
    try:
        holder = json.loads((folder / LOCK).read_text() or "{}")
    except (OSError, ValueError):
        return None
    if not holder.get("pid"):
        return None
    if holder.get("host") != socket.gethostname():
        return holder  # another machine's run: its process cannot be checked from here
    return holder if same_process(holder["pid"], holder.get("started", 0)) else None


def latest_attempt(final: Path) -> tuple[Path, dict[str, Any]] | None:
    """The most recent unfinished attempt at a stage (scratch or kept failed folder) and its record."""
    found = [(folder, record) for folder in attempts(final) if (record := read_record(folder))]
    return max(found, key=lambda pair: pair[1].get("started", 0), default=None)


def read_progress(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None


def clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def stage_state(name: str, folder: Path, running: bool) -> StageState:
    """One stage's state; `running`: whether a live run holds the pipeline's folder."""
    final = folder / name
    published = read_record(final)
    attempt = latest_attempt(final)
    newer = attempt and attempt[1].get("started", 0) > (published or {}).get("started", 0)
    if published and published.get("status") == "succeeded" and not newer:
        took = published.get("ended", 0) - published.get("started", 0)
        return StageState(name, "done", f"{took:.1f}s, finished {clock(published.get('ended', 0))}")
    if not attempt:
        return StageState(name, "pending")
    scratch, record = attempt
    progress = read_progress(scratch)
    if record.get("status") == "running" and running:
        return StageState(name, "running", progress_text(progress) if progress else "starting")
    if record.get("status") in ("running", "interrupted"):
        where = f"at step {progress['step']}/{progress['max_steps']}" if progress else "before its first step"
        return StageState(name, "interrupted", f"{where}; `align run` resumes it ({scratch})")
    why = str(record.get("error", "no error recorded")).strip().splitlines() or ["no error recorded"]
    return StageState(name, "failed", f"{why[0]} ({scratch})")


def run_status(folder: Path, names: list[str]) -> list[str]:
    """The lines `align status` prints: who runs the pipeline now, then one line per stage."""
    holder = live_holder(folder)
    head = f"{folder}: " + (f"running, {describe(holder)}" if holder else "no run in progress")
    states = [stage_state(name, folder, holder is not None) for name in names]
    width = max((len(state.name) for state in states), default=0)
    return [head] + [f"  {s.name:<{width}}  {s.state:<11}  {s.detail}".rstrip() for s in states]


def status_lines(target: Path) -> list[str]:
    """`target` is a pipeline file (every stage it declares, in file order) or its run folder (the stages
    found there)."""
    from align.report import run_target, stage_names

    folder, configs = run_target(target)
    names = list(configs) or stage_names(folder)
    if not names:
        return [f"{folder}: no stage has run here (no {RECORD})"]
    return run_status(folder, names)
