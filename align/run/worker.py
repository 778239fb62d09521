"""What each worker runs for a stage: the stage's runner on this rank, under the planned backend.

Each rank's whole output (library warnings, tracebacks) goes to `logs/worker-RANK.log` in the stage's
folder, not to the console: the driver shows one progress line and, on failure, one error line that
points at the log. `align run -v` streams the workers' output as well.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from align.records import StageError, WorkerConfig, write_error, write_result


def quiet_libraries() -> None:
    """Keep worker output to training progress: no per-map progress bars or library chatter."""
    import datasets
    import transformers

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    transformers.logging.set_verbosity_warning()
    logging.getLogger("deepspeed").setLevel(logging.WARNING)
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # a missing optional hub kernel: harmless


@contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Send this process's stdout and stderr (Python's and any library's, at the descriptor level) to
    `log` while the stage runs, then give them back."""
    log.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "a") as file:
        os.dup2(file.fileno(), 1)
        os.dup2(file.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def train_loop(config: WorkerConfig) -> None:
    """One rank of one stage: run it; rank 0 leaves its result for the driver."""
    rank = int(os.environ.get("RANK", "0"))
    config = config.checked()
    output_dir = Path(config.output_dir)
    if config.verbose:
        run_stage(config, rank, output_dir)
        return
    with output_to(output_dir / "logs" / f"worker-{rank}.log"):
        run_stage(config, rank, output_dir)


def run_stage(config: WorkerConfig, rank: int, output_dir: Path) -> None:
    from align.errors import AlignError
    from align.stages import run_seeded
    from align.stages.context import StageContext

    quiet_libraries()
    resume = Path(config.resume) if config.resume else None
    context = StageContext(
        plan=config.launch.plan,
        output_dir=output_dir,
        rank=rank,
        resume_from=resume,
        services=config.services,
        launch=config.launch,
    )
    try:
        result = run_seeded(context)
    except AlignError as err:  # a user error found late: the driver reports it plainly
        if rank == 0:
            write_error(output_dir, StageError(type=type(err).__name__, message=str(err)))
        raise
    except BaseException:
        traceback.print_exc()  # into this rank's log, which the driver's one-line error points at
        raise
    if rank == 0:
        write_result(output_dir, result)
