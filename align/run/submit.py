"""Send a pipeline run to a Ray cluster through the Ray Jobs API, and follow it."""

from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path
from typing import Any

from align.errors import AlignError

AGENT_WAIT_S = 120
# Folders that never travel with the job: environments, outputs, caches, version control.
EXCLUDES = [
    ".venv",
    "runs",
    ".git",
    ".cache",
    "**/__pycache__",
    ".pytest_cache",
    ".ruff_cache",
    "bench/results",
]


def local_paths(value: Any) -> list[str]:
    """Every absolute path in a resolved pipeline (data, models, configs, output root) that exists here."""
    if isinstance(value, dict):
        return [path for item in value.values() for path in local_paths(item)]
    if isinstance(value, list):
        return [path for item in value for path in local_paths(item)]
    if isinstance(value, str) and value.startswith("/") and Path(value.split("@")[0]).exists():
        return [value]
    return []


def outside_project(pipeline_file: str, resolved: dict[str, Any], project: Path) -> list[str]:
    """What the job finds on the cluster only if it shares this machine's files: only the project folder
    travels with the job, so the pipeline file or any path it names outside that folder must exist there."""
    paths = {str(Path(pipeline_file).resolve()), *local_paths(resolved)}
    return sorted(path for path in paths if not Path(path).is_relative_to(project))


def client(address: str):
    """A Jobs API client; an unreachable or refusing cluster is a user-facing error, not a traceback."""
    from ray.job_submission import JobSubmissionClient

    try:
        return JobSubmissionClient(address)
    except Exception as err:  # noqa: BLE001 - connection, version and authentication errors alike
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise AlignError(
            f"cannot use the Ray Jobs API at {address}: {first_line}. Check --address (the dashboard, "
            "e.g. http://HOST:8265) and, on clusters with token auth, RAY_AUTH_MODE=token and the token"
        ) from None


def submit(
    address: str,
    pipeline_file: str,
    *,
    overrides: list[str],
    only: list[str],
    force: list[str],
    project: Path,
    env: dict[str, str],
) -> str:
    """Submit `align run` of the same file, with the project as working_dir; returns the job id."""
    args = ["python", "-m", "align.cli", "run", pipeline_file]
    for item in overrides:
        args += ["--set", item]
    for name in only:
        args += ["--stage", name]
    for name in force:
        args += ["--force", name]
    # The driver's settings travel on its command line: `align run` forwards them to its workers itself,
    # and a job-level env_vars would clash with that when the driver joins the cluster.
    assignments = [f"{key}={shlex.quote(value)}" for key, value in env.items()]
    entrypoint = " ".join([*assignments, shlex.join(args)])
    runtime_env = {"working_dir": str(project), "excludes": EXCLUDES}
    logging.getLogger("ray").setLevel(logging.WARNING)  # not a line per file packed into working_dir
    jobs = client(address)
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            return jobs.submit_job(entrypoint=entrypoint, runtime_env=runtime_env)
        except RuntimeError as err:  # a head that just started has no job agent for some seconds
            if "No available agent" not in str(err) or time.monotonic() > deadline:
                raise AlignError(f"the Ray cluster at {address} refused the job: {err}") from None
            time.sleep(2)


def status(address: str, job_id: str) -> str:
    return str(client(address).get_job_status(job_id))


def logs(address: str, job_id: str) -> str:
    return client(address).get_job_logs(job_id)
