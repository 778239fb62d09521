"""Build small pipeline files in a test's tmp folder and run them through the real `align` CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

SFT_DATA = {
    "train": "align:chatterbot/sft/train",
    "eval": "align:chatterbot/sft/test",
    "max_train_rows": 256,
    "max_eval_rows": 32,
}
PREF_DATA = {
    "train": "align:chatterbot/prefs/train",
    "eval": "align:chatterbot/prefs/test",
    "max_train_rows": 128,
    "max_eval_rows": 32,
}
QUIET_TRL = {
    "logging_steps": 1,
    "eval_strategy": "no",
    "save_strategy": "no",
    "report_to": [],
    "max_length": 64,
}


def stage(kind: str, *, steps: int = 5, batch: int = 4, trl: dict | None = None, **fields: Any) -> dict:
    """A training stage of `kind` on the builtin chatterbot data, with a few quiet steps and no held-out
    samples (a test that reads them asks for them: `samples=4`), which cost seconds a stage."""
    data = SFT_DATA if kind == "sft" else PREF_DATA
    block = {
        **QUIET_TRL,
        "max_steps": steps,
        "per_device_train_batch_size": batch,
        "learning_rate": 1e-3,
        **(trl or {}),
    }
    return {"kind": kind, "data": data, "trl": block, "samples": 0, **fields}


def write_pipeline(folder: Path, name: str, stages: dict[str, dict], **defaults: Any) -> Path:
    """A pipeline file whose outputs go under `folder/runs`."""
    body = {
        "name": name,
        "base_model": "tiny",
        "defaults": {"output_root": str(folder / "runs"), **defaults},
        "stages": stages,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def run(
    path: Path, *extra: str, expect: int = 0, timeout: int = 900, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    """`align run` in a fresh process (its own embedded Ray), in `cwd`; asserts the exit code."""
    done = subprocess.run(
        [sys.executable, "-m", "align.cli", "run", str(path), *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
    )
    assert done.returncode == expect, done.stdout[-4000:] + "\n" + done.stderr[-4000:]
    return done


def running_step(pipeline_dir: Path, stage_name: str = "sft") -> int:
    """The step the running attempt at a stage has reached by its progress file; -1 before its first step
    (the file then names a phase) or without one."""
    for progress in pipeline_dir.glob(f".{stage_name}.tmp-*/logs/progress.json"):
        try:
            return json.loads(progress.read_text()).get("step", -1)
        except (OSError, ValueError):
            return -1
    return -1


def stage_folder(path: Path, stage_name: str) -> Path:
    """Where a stage of the pipeline file publishes; a relative output root is read from the file's folder."""
    body = yaml.safe_load(path.read_text())
    return path.parent / body["defaults"]["output_root"] / body["name"] / stage_name


def stage_record(path: Path, stage_name: str) -> dict:
    return json.loads((stage_folder(path, stage_name) / "align-stage.json").read_text())


def placement_reports(path: Path, stage_name: str) -> list[dict]:
    """Each rank's `logs/placement-rank{R}.json`, in rank order."""
    logs = stage_folder(path, stage_name) / "logs"
    return [json.loads(p.read_text()) for p in sorted(logs.glob("placement-rank*.json"))]


def logged_losses(stage_dir: Path) -> list[float]:
    """The training loss at every logged step of the stage written in `stage_dir`."""
    lines = (stage_dir / "logs" / "metrics.jsonl").read_text().splitlines()
    return [entry["loss"] for entry in map(json.loads, lines) if "loss" in entry]


def losses(path: Path, stage_name: str) -> list[float]:
    """The training loss at every logged step of a stage of the pipeline file."""
    return logged_losses(stage_folder(path, stage_name))


def run_in_process(path: Path, stage_name: str, output_dir: Path, hardware: Any) -> tuple[Any, Any]:
    """(its plan, its result): a stage of the pipeline file run by align's own runner in this process, no
    Ray: planned for `hardware`, its inputs resolved as the controller resolves them, seeded."""
    from align.pipeline.file import load
    from align.planning.launch import launch_of
    from align.planning.plan import build
    from align.run.inputs import resolve_inputs
    from align.stages import run_seeded
    from align.stages.context import StageContext

    plan = build(load(path), hardware).stages[stage_name]
    launch = launch_of(plan, resolve_inputs(plan, {}))
    return plan, run_seeded(StageContext(plan=plan, output_dir=output_dir, launch=launch))
