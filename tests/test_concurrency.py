"""Stages the DAG leaves independent run side by side on the embedded Ray: two children of one SFT stage,
with default resources, each take half the cores and train at the same time (their records' start, after
any wait for resources, and end), the pipeline takes less than the sum of its stages, and `align status`
shows both running at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from align.report.status import status_lines
from tests.pipelines import stage, stage_record, write_pipeline

pytestmark = pytest.mark.integration


def child(rank: int) -> dict:
    """An SFT stage on the parent's adapter, with align's default resources."""
    return stage("sft", steps=12, model="${stages.sft.output}", lora={"r": rank})


def test_two_children_of_one_stage_run_at_the_same_time(tmp_path: Path) -> None:
    stages = {"sft": stage("sft", steps=2, lora={"r": 4}), "left": child(4), "right": child(8)}
    path = write_pipeline(tmp_path, "fork", stages)
    command = [sys.executable, "-m", "align.cli", "run", str(path)]
    running_together = 0
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as run:
        while run.poll() is None:
            lines = status_lines(path)
            running_together = max(running_together, sum(" running " in line for line in lines[1:]))
            time.sleep(0.3)
        out, err = run.communicate()
    assert run.returncode == 0, out[-3000:] + err[-3000:]

    left, right, parent = (stage_record(path, name) for name in ("left", "right", "sft"))
    working = [(record["started"] + record["waited_s"], record["ended"]) for record in (left, right)]
    overlap = min(end for _, end in working) - max(start for start, _ in working)
    assert overlap > 0.5 * min(end - start for start, end in working)  # neither waited for the other
    half = os.cpu_count() / 2
    assert [rank["cpus"] for record in (left, right) for rank in record["ranks"]] == [half, half]
    assert [rank["cpus"] for rank in parent["ranks"]] == [os.cpu_count()]  # it ran alone: every core
    assert min(left["started"], right["started"]) >= parent["ended"]  # and both read the parent's output
    spans = [(record["started"], record["ended"]) for record in (parent, left, right)]
    wall = max(end for _, end in spans) - min(start for start, _ in spans)
    assert wall < sum(end - start for start, end in spans)
    assert running_together == 2
    share = f"beside 1 other stage: {half:g} of this machine's {os.cpu_count()} cores"
    for name in ("left", "right"):  # each stage's lines carry its name, and its share of the cores
        running = next(line for line in out.splitlines() if f"[{name}] running sft on 1 worker(s)" in line)
        assert running.endswith(share) and f"[{name}] done in" in out
