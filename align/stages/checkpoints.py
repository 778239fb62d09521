"""Which of a stage's checkpoints can be resumed from.

The Trainer writes `checkpoints/checkpoint-STEP/` file by file, so a crash can leave one torn. Every
rank finishes its part before rank 0 writes the marker (`align/stages/checkpointing.py`); a folder
without it is never resumed from. Kept free of torch: the driver reads this to say where a run resumes.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

CHECKPOINTS = "checkpoints"
KEEP = 2  # complete checkpoints kept unless `trl.save_total_limit` says otherwise
COMPLETE = "align-complete"
TRAINER_STATE = "trainer_state.json"
STEP_FOLDER = re.compile(r"checkpoint-(\d+)")


def checkpoint_steps(stage_dir: Path) -> dict[int, Path]:
    """Every checkpoint folder under a stage's scratch folder, complete or not, by step."""
    root = stage_dir / CHECKPOINTS
    found = {}
    for folder in root.iterdir() if root.is_dir() else ():
        match = STEP_FOLDER.fullmatch(folder.name)
        if match and folder.is_dir():
            found[int(match.group(1))] = folder
    return found


def latest_complete(stage_dir: Path) -> tuple[int, Path] | None:
    """The step and folder of the newest checkpoint that every rank finished, or None. A checkpoint of a
    run's last step (a run killed while it published) is passed over for the one before: resumed from
    there, transformers would train one step past `max_steps`."""
    complete = [
        (step, path)
        for step, path in checkpoint_steps(stage_dir).items()
        if (path / COMPLETE).exists() and not at_the_last_step(path)
    ]
    return max(complete) if complete else None


def at_the_last_step(checkpoint: Path) -> bool:
    try:
        state = json.loads((checkpoint / TRAINER_STATE).read_text())
    except (OSError, ValueError):
        return False
    return 0 < state.get("max_steps", 0) <= state.get("global_step", 0)


def remove_torn(stage_dir: Path) -> list[int]:
    """Delete checkpoints that a crash left unfinished (no marker), so that nothing reads or rotates them."""
    torn = [step for step, path in checkpoint_steps(stage_dir).items() if not (path / COMPLETE).exists()]
    for step in torn:
        shutil.rmtree(stage_dir / CHECKPOINTS / f"checkpoint-{step}", ignore_errors=True)
    return sorted(torn)
