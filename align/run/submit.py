"""Send a pipeline run to a Ray cluster through the Ray Jobs API, and follow it."""

from __future__ import annotations

import logging
import shlex
import time
from pathlib import Path

from align.compat.ray import PACKAGING_LOGGER
from align.errors import AlignError

AGENT_WAIT_S = 120
ALIGN_PACKAGE = Path(__file__).resolve().parents[1]  # align itself, shipped as a py_module


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
    folder: Path,
    pipeline_file: str,
    *,
    only: list[str],
    force: list[str],
    env: dict[str, str],
) -> str:
    """Submit `align run` of the packed pipeline file (align/run/package.py), with `folder` as the job's
    working directory and this align as a module of its environment; returns the job id."""
    args = ["python", "-m", "align.cli", "run", pipeline_file]
    for name in only:
        args += ["--stage", name]
    for name in force:
        args += ["--force", name]
    # The driver's settings travel on its command line: `align run` forwards them to its workers itself,
    # and a job-level env_vars would clash with that when the driver joins the cluster.
    assignments = [f"{key}={shlex.quote(value)}" for key, value in env.items()]
    entrypoint = " ".join([*assignments, shlex.join(args)])
    runtime_env = {"working_dir": str(folder), "py_modules": [str(ALIGN_PACKAGE)]}
    for name in ("ray", PACKAGING_LOGGER):  # not a line per folder packed
        logging.getLogger(name).setLevel(logging.WARNING)
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
    """The job's state; a failed job's is followed by the line that says why."""
    from ray.job_submission import JobStatus

    jobs = client(address)
    state = jobs.get_job_status(job_id)
    if state != JobStatus.FAILED:
        return str(state)
    why = last_error_line(jobs.get_job_logs(job_id), jobs.get_job_info(job_id).message)
    return f"{state}\n{why}\n(`align logs {job_id}` prints the whole log)"


def last_error_line(log: str, ray_message: str | None) -> str:
    """Why a job failed: the last `error: ...` line align printed (its CLI ends every failure so), else the
    log's last line (a traceback's exception), else Ray's message (a job that failed before it started)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    if errors:
        return errors[-1]
    if lines:
        return lines[-1]
    message = (ray_message or "").strip()
    return message.splitlines()[0] if message else "the job left no log and Ray gave no reason"


def logs(address: str, job_id: str) -> str:
    return client(address).get_job_logs(job_id)
