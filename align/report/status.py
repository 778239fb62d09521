"""`align status PIPELINE_FILE_OR_RUN_FOLDER`: where a local run stands, read from what it leaves on disk
(each stage's record, the progress file a running stage keeps, the run lock) without disturbing it.

A stage is `done` (published), `outdated` (published, but a stage it reads has not finished since: the
next run redoes it), `running` (step, rate, ETA), `interrupted` (its attempt holds a "running" record but
no live run holds the lock: a kill or a crash; the next `align run` resumes it), `failed` (with the first
line of why) or `pending`.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from align.pipeline.graph import order
from align.records import LOGS, StageRecord, read_progress
from align.report.console import progress_text
from align.run.lock import LOCK, describe, same_process
from align.run.records import RECORD, attempts, read_stage
from align.stages.checkpoints import latest_complete


@dataclass(frozen=True)
class StageState:
    name: str
    state: str  # done | outdated | running | interrupted | failed | pending
    detail: str = ""
    started: float = 0.0  # of the published output, for `outdated`
    ended: float = 0.0


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


def latest_attempt(final: Path) -> tuple[Path, StageRecord] | None:
    """The most recent unfinished attempt at a stage (scratch or kept failed folder) and its record."""
    found = [(folder, record) for folder in attempts(final) if (record := read_stage(folder))]
    return max(found, key=lambda pair: pair[1].started, default=None)


def clock(seconds: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(seconds))


def where_ranks_ran(record: StageRecord) -> str:
    """`, ranks on 2 nodes (0: 10.0.0.5/3f2a local 0 GPU 0, 1: 10.0.0.6/9c1b local 0 GPU 0)`: each rank's
    node IP and id (its start), its local rank, and the GPUs Ray gave it (none on CPU)."""
    ranks = record.ranks
    if not ranks:
        return ""
    nodes = len({rank.node_id for rank in ranks})
    shown = ", ".join(
        f"{r.rank}: {r.node_ip}/{(r.node_id or '')[:4]} local {r.local_rank or 0}"
        + (f" GPU {','.join(map(str, r.gpus))}" if r.gpus else "")
        for r in ranks
    )
    return f", ranks on {nodes} node{'s' if nodes > 1 else ''} ({shown})"


def stage_state(name: str, folder: Path, running: bool) -> StageState:
    """One stage's state; `running`: whether a live run holds the pipeline's folder."""
    final = folder / name
    published = read_stage(final)
    attempt = latest_attempt(final)
    newer = attempt and attempt[1].started > (published.started if published else 0)
    if published and published.succeeded and not newer:
        started, ended = published.started, published.ended or 0.0
        detail = f"{ended - started:.1f}s, finished {clock(ended)}{where_ranks_ran(published)}"
        return StageState(name, "done", detail, started, ended)
    if not attempt:
        return StageState(name, "pending")
    scratch, record = attempt
    progress = read_progress(scratch / LOGS)
    if record.status == "running" and running:
        return StageState(name, "running", progress_text(progress) if progress else "starting")
    if record.status in ("running", "interrupted"):
        checkpoint = latest_complete(scratch)
        # the progress file is written at most once a second, so a checkpoint may be a few steps past it
        logged = progress.step if progress and progress.step is not None else -1
        step = max(logged, checkpoint[0] if checkpoint else -1)
        total = progress.max_steps if progress else None
        where = "before its first step" if step < 0 else f"at step {step}" + (f"/{total}" if total else "")
        then = f"resumes it from step {checkpoint[0]}" if checkpoint else "starts it over (no checkpoint yet)"
        return StageState(name, "interrupted", f"{where}; `align run` {then} ({scratch})")
    why = (record.error or "no error recorded").strip().splitlines() or ["no error recorded"]
    return StageState(name, "failed", f"{why[0]} ({scratch})")


def outdated(state: StageState, reads: list[str], states: dict[str, StageState]) -> StageState:
    """A done stage whose inputs are not done, or were redone after it started, runs again next time."""
    behind = [dep for dep in reads if states[dep].state != "done" or states[dep].ended > state.started]
    if state.state != "done" or not behind:
        return state
    return replace(state, state="outdated", detail=f"{state.detail}; redone after {', '.join(behind)}")


def run_status(folder: Path, reads: dict[str, list[str]]) -> list[str]:
    """The lines `align status` prints: who runs the pipeline now, then one line per stage, each stage after
    those it reads (`reads`: stage -> the stages whose outputs it names)."""
    holder = live_holder(folder)
    head = f"{folder}: " + (f"running, {describe(holder)}" if holder else "no run in progress")
    states: dict[str, StageState] = {}
    for name in order(reads)[0]:
        states[name] = outdated(stage_state(name, folder, holder is not None), reads[name], states)
    width = max(map(len, states), default=0)
    return [head] + [f"  {s.name:<{width}}  {s.state:<11}  {s.detail}".rstrip() for s in states.values()]


def status_lines(target: Path) -> list[str]:
    """`target` is a pipeline file (every stage it declares) or its run folder (the stages found there)."""
    from align.report.run_folder import latest_record, reads_from, run_target, stage_names

    folder, configs = run_target(target)
    if not configs:
        found = {name: latest_record(folder / name) for name in stage_names(folder)}
        configs = {name: record.config for name, record in found.items() if record}
    if not configs:
        return [f"{folder}: no stage has run here (no {RECORD})"]
    reads = {name: reads_from(config) for name, config in configs.items()}
    return run_status(folder, {name: [dep for dep in deps if dep in reads] for name, deps in reads.items()})
