"""What each Ray Train worker runs: the stage's runner on this rank, under the planned backend."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

RESULT = ".result.json"
ERROR = ".error.json"


def quiet_libraries() -> None:
    """Keep worker output to training progress: no per-map progress bars or library chatter."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    transformers.logging.set_verbosity_warning()
    logging.getLogger("deepspeed").setLevel(logging.WARNING)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # a missing optional hub kernel: harmless


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: run the stage; rank 0 leaves its result for the driver."""
    from align.errors import AlignError
    from align.stages import runner_for
    from align.stages.context import StageContext

    quiet_libraries()
    output_dir = Path(config["output_dir"])
    rank = int(os.environ.get("RANK", "0"))
    plan = config["plan"]
    context = StageContext(plan=plan, output_dir=output_dir, rank=rank)
    try:
        result = runner_for(plan.kind).run(context)
    except AlignError as err:  # a user error found late (bad data rows): the driver reports it plainly
        if rank == 0:
            (output_dir / ERROR).write_text(json.dumps({"type": type(err).__name__, "message": str(err)}))
        raise
    if rank == 0:
        (output_dir / RESULT).write_text(json.dumps(asdict(result)))
