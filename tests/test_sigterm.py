"""SIGTERM (what `timeout`, a batch scheduler, `ray job stop` and Kubernetes send) stops a run as Ctrl-C
does, at whatever moment it lands: while Ray starts, while the stage's worker group starts, mid-training,
and as one stage ends and the next starts. Ray installs its own SIGTERM handlers in `ray.init` (a Python
one that exits 15 without a word, then the core worker's C++ one that prints `*** SIGTERM received` and a
stack and exits 1); align holds the signal while Ray starts and puts its own handler back. Each case: exit
143, one line saying where the run stopped and how to resume, the stage kept as `.<stage>.failed-*`, none
of Ray's lines, no process left. On the embedded Ray (ddp, to reach training quickly); the reservation's
wait is in tests/test_cluster.py (an embedded Ray refuses a request it cannot hold before it starts).
`make test-faults`."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.pipelines import running_step, stage, stage_folder, write_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.faults]

DATA = {"train": "align:chatterbot/sft/train", "max_train_rows": 64, "max_eval_rows": 8}


def one_sft(folder: Path, name: str, steps: int) -> Path:
    """A 2-rank ddp SFT of `steps` steps (ddp starts training sooner than the zero2 the plan would pick)."""
    sft = stage("sft", steps=steps, data=DATA, workers=2)
    return write_pipeline(folder, name, {"sft": sft}, backend="ddp")


def start(path: Path, *options: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "align.cli", "run", str(path), *options]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_until(check, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"not reached within {timeout:.0f} s")


def ray_started(proc: subprocess.Popen) -> bool:
    """Ray's first process is up below the driver (not a helper the plan runs before Ray starts)."""
    names = []
    for child in psutil.Process(proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # gone meanwhile
            names += child.cmdline()
    return any("gcs_server" in name or "raylet" in name for name in names)


def stage_workers(proc: subprocess.Popen) -> bool:
    """Whether Ray has started the group's actor processes (they take a few seconds to import torch)."""
    try:
        below = psutil.Process(proc.pid).children(recursive=True)
        return any("StageWorker" in " ".join(p.cmdline()) for p in below)
    except psutil.Error:
        return False


def terminate(proc: subprocess.Popen) -> str:
    """SIGTERM the driver; its stderr, once it has exited 143 and every process below it is gone."""
    below = psutil.Process(proc.pid).children(recursive=True)
    stopped = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, out[-3000:] + "\n" + err[-3000:]
    _, alive = psutil.wait_procs(below, timeout=max(1.0, 20 - (time.monotonic() - stopped)))
    assert all(p.status() == psutil.STATUS_ZOMBIE for p in alive), [p.cmdline() for p in alive]
    for ray_line in ("SIGTERM received", "PC: @", "Traceback"):
        assert ray_line not in out + err, err[-3000:]
    interrupted = [line for line in err.splitlines() if line.startswith("interrupted")]
    assert len(interrupted) == 1, err[-3000:]
    return err


def kept(root: Path, name: str) -> dict:
    [folder] = root.glob(f".{name}.failed-*")
    return json.loads((folder / "align-stage.json").read_text())


def test_sigterm_while_ray_starts(tmp_path: Path) -> None:
    """Inside `ray.init` (its first process is up): the signal is held until Ray can be shut down whole,
    so none of its processes (the dashboard and runtime-env agents) is left running with no parent."""
    path = one_sft(tmp_path, "init", steps=500)
    started = time.time()
    run = start(path)
    wait_until(lambda: ray_started(run), run)
    err = terminate(run)
    assert "interrupted: stopped while Ray started, before stage 'sft' (earlier stages are kept)" in err
    assert f"`align run {path}` resumes it" in err
    time.sleep(2)
    orphans = [
        p.cmdline()
        for p in psutil.process_iter(["ppid", "create_time"])
        if p.info["ppid"] == 1 and p.info["create_time"] >= started and "ray::" in " ".join(p.cmdline())
    ]
    assert not orphans


def test_sigterm_while_the_group_starts(tmp_path: Path) -> None:
    """A forced stage stopped: the line to resume it forces it again (a plain run would call the stage's
    earlier output up to date)."""
    path = one_sft(tmp_path, "start", steps=500)
    run = start(path, "--force", "sft")
    wait_until(lambda: stage_workers(run), run)
    err = terminate(run)
    assert "interrupted: stage 'sft' stopped (no checkpoint yet, so it starts over)" in err
    assert f"`align run {path} --force sft` resumes it" in err
    assert kept(tmp_path / "runs" / "start", "sft")["status"] == "interrupted"


def test_sigterm_mid_training(tmp_path: Path) -> None:
    path = one_sft(tmp_path, "train", steps=5000)
    run = start(path)
    wait_until(lambda: running_step(tmp_path / "runs" / "train") >= 0, run)
    err = terminate(run)
    assert "interrupted: stage 'sft' stopped" in err and f"`align run {path}` resumes it" in err
    assert kept(tmp_path / "runs" / "train", "sft")["status"] == "interrupted"


def test_sigterm_as_one_stage_ends_and_the_next_starts(tmp_path: Path) -> None:
    """The first stage is published whole; the next (a 1-rank merge on a new group) is kept aside, or,
    if the signal lands before it began, the line says the run stopped between stages."""
    stages = {
        "sft": stage("sft", steps=2, data=DATA, lora={"r": 4}, workers=2),
        "merge": {"kind": "merge", "model": "${stages.sft.output}"},
    }
    path = write_pipeline(tmp_path, "between", stages, backend="ddp")
    run = start(path)
    wait_until(lambda: (stage_folder(path, "sft") / "align-stage.json").is_file(), run)
    err = terminate(run)
    assert json.loads((stage_folder(path, "sft") / "align-stage.json").read_text())["status"] == "succeeded"
    merge = list((tmp_path / "runs" / "between").glob(".merge.failed-*"))
    if merge:
        assert "interrupted: stage 'merge' stopped" in err
    else:
        assert "interrupted: stopped between stages" in err
    assert f"`align run {path}` resumes it" in err
