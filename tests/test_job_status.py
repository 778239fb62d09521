"""`align status JOB` of a failed job says why it failed (issue 37), with a fake Jobs API client."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from ray.job_submission import JobStatus

import align.run.submit as submit
from align.cli import main

MERGE_FAILED = (
    "error: stage 'merge' failed: StageFailed: the merged model differs from the adapter model: relative "
    "logit delta 0.0134 > stages.merge.tolerance 0.001"
)


class FakeJobs:
    """What `align status` asks of a JobSubmissionClient, answered from fixed values."""

    def __init__(self, state: JobStatus, log: str = "", message: str | None = None) -> None:
        self.state, self.log, self.message = state, log, message

    def get_job_status(self, job_id: str) -> JobStatus:
        return self.state

    def get_job_logs(self, job_id: str) -> str:
        return self.log

    def get_job_info(self, job_id: str) -> SimpleNamespace:
        return SimpleNamespace(message=self.message)


def job_status(monkeypatch, capsys, jobs: FakeJobs) -> tuple[int, list[str]]:
    monkeypatch.setattr(submit, "client", lambda address: jobs)
    code = main(["status", "raysubmit_abc", "--address", "http://head:8265"])
    return code, capsys.readouterr().out.splitlines()


def test_a_failed_job_prints_its_last_error_line(monkeypatch, capsys):
    log = f"stage sft done in 12 s\nerror: an earlier line\n{MERGE_FAILED}\n"

    code, lines = job_status(monkeypatch, capsys, FakeJobs(JobStatus.FAILED, log=log))

    assert code == 0 and lines[:2] == ["FAILED", MERGE_FAILED]
    assert "align logs raysubmit_abc" in lines[2]


@pytest.mark.parametrize(
    ("log", "message", "why"),
    [
        (
            "Traceback (most recent call last):\n  ...\nRuntimeError: CUDA error\n",
            None,
            "RuntimeError: CUDA error",
        ),
        ("", "Job supervisor actor died\nmore", "Job supervisor actor died"),
        ("", None, "the job left no log and Ray gave no reason"),
    ],
    ids=["traceback", "ray-message", "nothing"],
)
def test_without_an_error_line_the_log_or_ray_says_why(monkeypatch, capsys, log, message, why):
    _, lines = job_status(monkeypatch, capsys, FakeJobs(JobStatus.FAILED, log=log, message=message))

    assert lines[:2] == ["FAILED", why]


def test_a_job_that_did_not_fail_prints_only_its_state(monkeypatch, capsys):
    _, lines = job_status(monkeypatch, capsys, FakeJobs(JobStatus.RUNNING, log=MERGE_FAILED))

    assert lines == ["RUNNING"]
