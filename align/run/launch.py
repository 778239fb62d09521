"""One attempt at a stage on a warm worker group: run it on every rank, wait, classify the end.

The driver waits here, shows progress, and on Ctrl-C/SIGTERM shuts Ray down, which stops every worker.
A failure is either a lost worker (Ray's own error: a killed or OOM-killed process, a lost node), which
the controller retries from the latest checkpoint on a fresh group, or the stage's own error, which is
not retried and is reported once, with the path of the worker log.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from align.errors import AlignError, StageFailed
from align.planning.plan import StagePlan
from align.run.worker import ERROR, PROGRESS_FILE, RESULT

if TYPE_CHECKING:
    from align.run.workers import WorkerGroup

FORWARDED_ENV = (
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HOME",
    "ALIGN_CACHE",
    "TORCH_EXTENSIONS_DIR",
    "PYTHONHASHSEED",
)
POLL_SECONDS = 0.5
FAILURE_GRACE_S = 5.0


class LostWorkers(StageFailed):
    """Ray lost a worker (killed, out of memory, node gone): worth retrying from the latest checkpoint."""


def worker_env(module_roots: list[str]) -> dict[str, str]:
    """Environment the workers need from the driver (offline switches, caches), and nothing secret.

    A reward function of the user's own (`allow_custom_code`) imports from `module_roots`: where
    `align` was run and the pipeline file's folder."""
    env = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*module_roots, os.environ.get("PYTHONPATH")]))
    return {**env, "TOKENIZERS_PARALLELISM": "false"}


def connect(address: str | None, verbose: bool = False, messages: Path | None = None) -> None:
    """Join the named cluster, or start an embedded local Ray: no dashboard, loopback only. Workers'
    output goes to their log files; `verbose` streams it to the console as well. Otherwise Ray's own
    messages to the driver (a worker died, ...) go to the file `messages`: align says it in one line.
    The workers' environment is not Ray's `runtime_env` but handed to each worker as it starts
    (align/run/workers.py): Ray's pre-started worker processes serve only the default environment."""
    import ray

    if ray.is_initialized():
        return
    if messages is not None and not verbose:
        to_file(messages)
    address = address or os.environ.get("RAY_ADDRESS")
    # Ray's own INFO/WARNING chatter (and the state-API warnings it makes with no dashboard) is noise here
    settings = {
        "log_to_driver": verbose,
        "logging_config": ray.LoggingConfig(log_level="ERROR"),
    }
    if address:
        ray.init(address=address, **settings)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1", **settings)


def to_file(messages: Path) -> None:
    """Send the lines Ray prints on the driver for its cluster events to a file instead of the console.

    Ray has no setting for these (`log_to_driver` covers only the workers' output), so its printer
    is replaced; the lines are kept, not lost."""
    import ray._private.worker as ray_worker

    def write(data: dict[str, Any], ignore_prefix: bool) -> None:
        messages.parent.mkdir(parents=True, exist_ok=True)
        with open(messages, "a") as out:
            out.writelines(f"({data.get('pid', 'ray')}) {line}\n" for line in data.get("lines", []))

    ray_worker.print_to_stdstream = write


def disconnect() -> None:
    """Shut down this driver's Ray connection: an embedded Ray stops with it, and so does every actor
    this driver owns (the run's workers) on a cluster. A run that started no Ray does not import it."""
    if "ray" not in sys.modules:
        return
    import ray

    if ray.is_initialized():
        ray.shutdown()


def lost_workers(stage: str, lost: dict[int, BaseException]) -> LostWorkers:
    """Which ranks Ray lost, and how it noticed."""
    ranks = ", ".join(f"rank {rank} ({type(how).__name__})" for rank, how in sorted(lost.items()))
    return LostWorkers(f"stage '{stage}' lost a worker: {ranks}")


def stage_error(stage: str, rank: int, failure: BaseException) -> StageFailed:
    """The stage's own error in one line: what the first failing rank raised, naming that rank."""
    lines = str(failure).strip().splitlines()
    return StageFailed(
        f"stage '{stage}' failed: {type(failure).__name__}: {lines[-1] if lines else ''}", rank
    )


def read_progress(scratch: Path) -> dict[str, Any] | None:
    try:
        return json.loads((scratch / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None


def ray_launch(
    group: WorkerGroup,
    stage: StagePlan,
    scratch: Path,
    resume: Path | None,
    *,
    verbose: bool = False,
    on_progress: Callable[[dict[str, Any]], None] = lambda _: None,
) -> dict[str, Any]:
    """Run one attempt of the stage on the warm `group` (`stage.workers` ranks), from `resume` (a
    checkpoint folder) if given; return rank 0's result. The driver waits here, showing progress; on
    Ctrl-C/SIGTERM it shuts Ray down, which stops every worker. A failure leaves the group stopped (a rank
    may be dead, or waiting in a collective for one that is)."""
    for stale in (ERROR, RESULT):
        (scratch / stale).unlink(missing_ok=True)
    config = {"plan": stage, "output_dir": str(scratch), "resume": str(resume) if resume else None}
    try:
        failures = wait_for(group, group.run({**config, "verbose": verbose}), scratch, on_progress)
    except BaseException:
        disconnect()  # Ctrl-C or SIGTERM: stops the workers; the caller keeps the stage aside
        raise
    if not failures:
        return json.loads((scratch / RESULT).read_text())
    group.stop()
    if (scratch / ERROR).exists():
        raise AlignError(json.loads((scratch / ERROR).read_text())["message"]) from None
    from ray.exceptions import RayTaskError

    own = {rank: err for rank, err in failures.items() if isinstance(err, RayTaskError)}
    if len(own) < len(failures):
        raise lost_workers(stage.name, {r: e for r, e in failures.items() if r not in own}) from None
    rank = next(iter(own))
    raise stage_error(stage.name, rank, own[rank].cause or own[rank]) from None


def wait_for(
    group: WorkerGroup, runs: list[Any], scratch: Path, on_progress: Callable[[dict[str, Any]], None]
) -> dict[int, BaseException]:
    """Wait for every rank of the group (its start first), showing progress; the ranks that failed, the
    first to fail first: once one has, the others get a moment to report theirs (a rank that lost its
    peer fails in a collective, or hangs in one)."""
    import ray

    rank_of = {ref: rank for rank, ref in enumerate(group.joined)}
    rank_of.update({ref: rank for rank, ref in enumerate(runs)})
    pending, failures = [*group.joined, *runs], {}
    deadline = None
    while pending and (deadline is None or time.monotonic() < deadline):
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_SECONDS)
        for ref in done:
            try:
                ray.get(ref)
            except ray.exceptions.RayError as err:
                failures.setdefault(rank_of[ref], err)
                deadline = deadline or time.monotonic() + FAILURE_GRACE_S
        if (progress := read_progress(scratch)) is not None:
            on_progress(progress)
    return failures
