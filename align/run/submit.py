"""Send a pipeline run to a Ray cluster through the Ray Jobs API, and follow it."""

from __future__ import annotations

import shlex
from pathlib import Path

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


def client(address: str):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address)


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
    runtime_env = {"working_dir": str(project), "excludes": EXCLUDES, "env_vars": env}
    return client(address).submit_job(entrypoint=shlex.join(args), runtime_env=runtime_env)


def status(address: str, job_id: str) -> str:
    return str(client(address).get_job_status(job_id))


def logs(address: str, job_id: str) -> str:
    return client(address).get_job_logs(job_id)
