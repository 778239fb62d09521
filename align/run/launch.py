"""One attempt at a stage on Ray Train: join (or start) Ray, run the worker group, wait, classify the end.

`trainer.fit()` runs in a thread, so that Ray Train's own SIGINT handler (which exits 0) is never
installed and align's stays in charge: the driver waits here, shows progress, and on Ctrl-C/SIGTERM
shuts Ray down, which stops every worker. A failure is either a lost worker (Ray's own error: a
killed or OOM-killed process, a lost node), which the controller retries from the latest checkpoint,
or the stage's own error, which is not retried and is reported once, with the path of the worker log.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from align.errors import AlignError, StageFailed
from align.plan import Plan, StagePlan
from align.run.worker import ERROR, PROGRESS_FILE, RESULT, train_loop

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


class LostWorkers(StageFailed):
    """Ray lost a worker (killed, out of memory, node gone): worth retrying from the latest checkpoint."""


def worker_env(module_roots: list[str]) -> dict[str, str]:
    """Environment the workers need from the driver (offline switches, caches), and nothing secret.

    A reward function of the user's own (`allow_custom_code`) imports from `module_roots`: where
    `align` was run and the pipeline file's folder."""
    env = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*module_roots, os.environ.get("PYTHONPATH")]))
    # Ray Train's print patch defeats dill's stdout capture, flooding the log with bytecode
    return {**env, "TOKENIZERS_PARALLELISM": "false", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}


def connect(
    address: str | None,
    verbose: bool = False,
    messages: Path | None = None,
    module_roots: list[str] | None = None,
) -> None:
    """Join the named cluster, or start an embedded local Ray: no dashboard, loopback only. Workers'
    output goes to their log files; `verbose` streams it to the console as well. Otherwise Ray's own
    messages to the driver (a worker died, ...) go to the file `messages`: align says it in one line."""
    import ray

    if ray.is_initialized():
        return
    if messages is not None and not verbose:
        to_file(messages)
    address = address or os.environ.get("RAY_ADDRESS")
    # Ray's own INFO/WARNING chatter (and the state-API warnings it makes with no dashboard) is noise here
    settings = {
        "runtime_env": {"env_vars": worker_env(module_roots or [os.getcwd()])},
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
    this driver owns (the run's controller and its workers) on a cluster."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def is_lost_worker(error: BaseException) -> bool:
    """Whether a Ray Train failure is Ray's (a worker died or stopped answering) rather than the stage's:
    Ray reports a dead worker with its own exception types, and a stage error as the stage raised it."""
    failures = getattr(error, "worker_failures", None) or {}
    return any(type(failure).__module__.startswith("ray.") for failure in failures.values())


def lost_workers(stage: str, error: BaseException) -> LostWorkers:
    """Which ranks Ray lost, and how it noticed."""
    lost = {rank: type(failure).__name__ for rank, failure in error.worker_failures.items()}
    ranks = ", ".join(f"rank {rank} ({how})" for rank, how in sorted(lost.items()))
    return LostWorkers(f"stage '{stage}' lost a worker: {ranks}")


def stage_error(stage: str, error: BaseException) -> StageFailed:
    """The stage's own error in one line: what the lowest failing rank raised, naming that rank."""
    failures = getattr(error, "worker_failures", None) or {}
    rank, failure = min(failures.items(), key=lambda item: item[0], default=(0, error))
    lines = str(failure).strip().splitlines()
    return StageFailed(
        f"stage '{stage}' failed: {type(failure).__name__}: {lines[-1] if lines else ''}", rank
    )


def run_in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Start `work` in a daemon thread; its result or exception lands in the returned dict."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = work()
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread as is
            outcome["error"] = err

    thread = threading.Thread(target=target, name="align-fit", daemon=True)
    thread.start()
    return thread, outcome


def read_progress(scratch: Path) -> dict[str, Any] | None:
    try:
        return json.loads((scratch / PROGRESS_FILE).read_text())
    except (OSError, ValueError):
        return None


def ray_launch(
    plan: Plan,
    stage: StagePlan,
    scratch: Path,
    resume: Path | None,
    *,
    address: str | None = None,
    verbose: bool = False,
    on_progress: Callable[[dict[str, Any]], None] = lambda _: None,
) -> dict[str, Any]:
    """Run one attempt of the stage on `stage.workers` Ray Train workers, from `resume` (a checkpoint
    folder) if given; return rank 0's result. Ray is joined (or started) here, so a run whose stages
    are all up to date never starts it."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    connect(address, verbose)
    for stale in (ERROR, RESULT):
        (scratch / stale).unlink(missing_ok=True)
    gpu = plan.hardware.accelerator
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)) // stage.workers)
    config = {"plan": stage, "output_dir": str(scratch), "resume": str(resume) if resume else None}
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={**config, "verbose": verbose},
        scaling_config=ScalingConfig(
            num_workers=stage.workers, use_gpu=gpu, resources_per_worker=None if gpu else {"CPU": cpus}
        ),
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        run_config=RunConfig(
            name=f"{plan.pipeline.name}-{stage.name}-{scratch.name[-8:]}",
            storage_path=str(scratch.parent / ".ray"),
        ),
    )
    thread, outcome = run_in_thread(trainer.fit)
    try:
        while thread.is_alive():
            thread.join(POLL_SECONDS)
            if (progress := read_progress(scratch)) is not None:
                on_progress(progress)
    except BaseException:
        disconnect()  # Ctrl-C or SIGTERM: stops the workers; the caller keeps the stage aside
        raise
    if "error" not in outcome:
        return json.loads((scratch / RESULT).read_text())
    error = outcome["error"]
    if (scratch / ERROR).exists():
        raise AlignError(json.loads((scratch / ERROR).read_text())["message"]) from None
    if is_lost_worker(error):
        raise lost_workers(stage.name, error) from None
    raise stage_error(stage.name, error) from None
