"""A stage's folder and its record (`align-stage.json`): what produced it, and whether it is done.

Outputs are written into a scratch folder and renamed into place only when complete, with the
record written last, so a folder that looks done is done. A failed stage's scratch folder is
kept beside it (`.NAME.failed-TIME`) with a record saying why: nothing is lost on a crash.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from align.fingerprint import file_digest

RECORD = "align-stage.json"
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
SECRET_KEY = re.compile(r"token|secret|password|api_key|credential", re.IGNORECASE)


def stage_dir(output_root: str, pipeline: str, stage: str) -> Path:
    return Path(output_root).resolve() / pipeline / stage


def scratch_dir(final: Path) -> Path:
    """A fresh folder beside `final` that no reader mistakes for a finished stage."""
    scratch = final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:8]}"
    scratch.mkdir(parents=True)
    return scratch


def read_record(folder: Path) -> dict[str, Any] | None:
    """The record of a finished stage folder, or None."""
    try:
        return json.loads((folder / RECORD).read_text())
    except (OSError, ValueError):
        return None


def redact(value: Any) -> Any:
    """A copy of a config with anything that looks like a secret masked, for records and logs."""
    if isinstance(value, dict):
        return {k: "***" if SECRET_KEY.search(str(k)) and v else redact(v) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v) for v in value]
    return value


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


def publish(scratch: Path, final: Path, record: dict[str, Any]) -> None:
    """Write the record last, then swap the scratch folder into place."""
    (scratch / RECORD).write_text(json.dumps(record, indent=2, default=str) + "\n")
    if final.exists():
        retired = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, retired)
        os.rename(scratch, final)
        shutil.rmtree(retired, ignore_errors=True)
    else:
        os.rename(scratch, final)


def keep_failed(scratch: Path, final: Path, record: dict[str, Any]) -> Path:
    """Set a failed stage's partial outputs aside with a record of the failure."""
    (scratch / RECORD).write_text(json.dumps(record, indent=2, default=str) + "\n")
    failed = final.parent / f".{final.name}.failed-{time.strftime('%Y%m%d-%H%M%S')}"
    os.rename(scratch, failed)
    return failed
