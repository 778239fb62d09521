"""A stage's folder and its record (`align-stage.json`): what produced it, and whether it is done.

Outputs are written into a scratch folder (`.NAME.tmp-ID`) and renamed into place only when complete,
with the record written last, so a folder that looks done is done. The scratch folder holds a record
from its start (status "running", the fingerprint), so a later run can resume it. A failed or
interrupted stage's folder is kept beside it (`.NAME.failed-TIME`) until the stage succeeds: nothing is
lost on a crash. Every file is written whole or not at all (a temporary file renamed into place).
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from align.fingerprint import file_digest
from align.records import StageRecord, read, write
from align.records.stage import STAGE_RECORD as RECORD
from align.stages.checkpoints import latest_complete

PACKAGES = (
    "align",
    "torch",
    "transformers",
    "trl",
    "peft",
    "deepspeed",
    "accelerate",
    "datasets",
    "ray",
    "bitsandbytes",
)


def pipeline_dir(output_root: str, pipeline: str) -> Path:
    """Where a pipeline's stages, its run lock and Ray's messages live."""
    return Path(output_root).resolve() / pipeline


def stage_dir(output_root: str, pipeline: str, stage: str) -> Path:
    return pipeline_dir(output_root, pipeline) / stage


def scratch_name(final: Path) -> Path:
    """A fresh name beside `final` that no reader mistakes for a finished stage."""
    return final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"


def attempts(final: Path) -> list[Path]:
    """Earlier unfinished attempts at a stage: scratch folders of runs that died, kept failed ones."""
    prefixes = (f".{final.name}.tmp-", f".{final.name}.failed-")
    if not final.parent.is_dir():
        return []
    return sorted(p for p in final.parent.iterdir() if p.is_dir() and p.name.startswith(prefixes))


def resumable(final: Path, fingerprint: str) -> tuple[Path, int] | None:
    """The earlier attempt with this fingerprint that got furthest (its latest complete checkpoint)."""
    found = []
    for folder in attempts(final):
        record = read_stage(folder)
        checkpoint = latest_complete(folder)
        if record and record.fingerprint == fingerprint and checkpoint:
            found.append((checkpoint[0], folder.stat().st_mtime, folder))
    if not found:
        return None
    step, _, folder = max(found)
    return folder, step


def start_attempt(final: Path, record: StageRecord, resume: Path | None) -> Path:
    """The scratch folder of this attempt, holding its "running" record: an earlier attempt's folder
    (renamed back to a scratch name) when resuming, else a new one."""
    scratch = scratch_name(final)
    if resume is not None:
        os.rename(resume, scratch)
    else:
        scratch.mkdir(parents=True)
    write(scratch / RECORD, record.ended_as("running"))
    return scratch


def clear_attempts(final: Path) -> None:
    """Once a stage has succeeded, its earlier attempts are of no use: remove them."""
    for folder in attempts(final):
        shutil.rmtree(folder, ignore_errors=True)


def read_stage(folder: Path) -> StageRecord | None:
    """The record of a stage folder (finished, or an attempt's), or None."""
    return read(folder / RECORD, StageRecord)


def model_identity(model_dir: str) -> dict[str, Any]:
    """What identifies an input model cheaply: its config and its weight files' names and sizes."""
    path = Path(model_dir)
    if not path.is_dir():
        return {"hub_id": model_dir}
    weights = sorted(
        (p.name, p.stat().st_size) for p in path.iterdir() if p.suffix in {".safetensors", ".bin"}
    )
    config = path / "config.json"
    return {"config": file_digest(config) if config.exists() else None, "weights": weights}


def versions() -> dict[str, str | None]:
    """Installed versions of the packages that decide what a stage computes."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def git_sha() -> str | None:
    """The commit of the code that ran, when it runs from a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def publish(scratch: Path, final: Path, record: StageRecord) -> None:
    """Write the record last, then swap the scratch folder into place."""
    write(scratch / RECORD, record)
    if final.exists():
        retired = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, retired)
        os.rename(scratch, final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.rename(scratch, final)


def keep_failed(scratch: Path, final: Path, record: StageRecord) -> Path:
    """Set a failed stage's partial outputs aside with a record of the failure. On a full disk the record
    may not fit; the folder is moved aside all the same, keeping its "running" record."""
    try:
        write(scratch / RECORD, record)
    except OSError:
        pass
    failed = final.parent / f".{final.name}.failed-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:4]}"
    os.rename(scratch, failed)
    return failed
