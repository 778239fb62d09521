"""Faults injected into real runs (Ray, 2 gloo ranks, the tiny model): a killed worker, a killed
driver, Ctrl-C, a second run, a torn checkpoint, a full disk, and secrets that must not reach the disk.

Every run trains the same 2-rank fp32 SFT, so each interrupted run's loss curve must equal the
uninterrupted one. The runs are shared through module fixtures; all are `faults`, run by `make
test-faults` (the worker-kill, driver-kill and secrets cases share one 2-rank baseline run: together
about 2.5 minutes, which kept `make test` over its 10).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from align.data.corpora import builtin_path
from align.stages.checkpoints import COMPLETE, latest_complete
from tests.mounts import tmpfs
from tests.pipelines import QUIET_TRL, losses, running_step, stage_record

pytestmark = pytest.mark.integration

SECRET = "hf_notARealTokenButSecret123"
ENV_SECRET = "wandb_env_secret_456"
CHECKPOINTS = {"save_strategy": "steps", "save_steps": 16}
TRL = {**QUIET_TRL, **CHECKPOINTS, "max_steps": 240, "per_device_train_batch_size": 2, "learning_rate": 1e-3}
# past the first checkpoint, well before the end: 2 ranks train ~30 steps/s on 2 cores, and go on for a
# second or two once their driver is killed
KILL_AFTER = 24


def write(folder: Path, name: str, *, data: str, output_root: str, trl: dict | None = None) -> Path:
    """A one-stage 2-rank SFT pipeline file written in `folder`."""
    body = {
        "name": name,
        "base_model": "tiny",
        "defaults": {"output_root": output_root, "workers": 2, "backend": "ddp", "precision": "fp32"},
        "stages": {"sft": {"kind": "sft", "data": {"train": data}, "trl": {**TRL, **(trl or {})}}},
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def start(path: Path | str, *extra: str, cwd: Path, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "align.cli", "run", str(path), *extra],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def status(target: Path | str, cwd: Path) -> str:
    """`align status` of a pipeline file, as a user runs it beside a run."""
    command = [sys.executable, "-m", "align.cli", "status", str(target)]
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=60, check=True)
    return done.stdout


def finish(proc: subprocess.Popen, expect: int = 0, timeout: int = 600) -> tuple[str, str]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == expect, out[-3000:] + "\n" + err[-3000:]
    return out, err


def wait_for_step(pipeline_dir: Path, step: int, proc: subprocess.Popen, timeout: float = 300) -> None:
    """Until the running attempt's progress file shows `step`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if running_step(pipeline_dir) >= step:
            return
        time.sleep(0.2)
    raise AssertionError(f"no step {step} within {timeout}s")


def train_workers(driver: int) -> list[psutil.Process]:
    """The stage worker processes below a driver (its embedded Ray's raylet starts them)."""
    return [
        p for p in psutil.Process(driver).children(recursive=True) if "StageWorker" in " ".join(p.cmdline())
    ]


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def all_gone(processes: list[psutil.Process], seconds: float = 15) -> bool:
    _, alive = psutil.wait_procs(processes, timeout=seconds)
    return all(p.status() == psutil.STATUS_ZOMBIE for p in alive)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The training rows as a plain jsonl of the user's own, in a project folder."""
    project = tmp_path_factory.mktemp("project")
    (project / "data").mkdir()
    rows = builtin_path("align:chatterbot/sft/train").read_text().splitlines()[:256]
    (project / "data" / "sft.jsonl").write_text("\n".join(rows) + "\n")
    return project


@pytest.fixture(scope="module")
def baseline(data: Path) -> dict:
    """The uninterrupted run, given a hub token with `--set` and secrets in its environment."""
    path = write(data / "baseline", "baseline", data=str(data / "data" / "sft.jsonl"), output_root="runs")
    proc = start(
        path,
        "--set",
        f"stages.sft.trl.hub_token={SECRET}",
        cwd=data,
        env={"HF_TOKEN": SECRET, "WANDB_API_KEY": ENV_SECRET},
    )
    out, err = finish(proc)
    return {
        "path": path,
        "losses": losses(path, "sft"),
        "output": out + err,
        "root": data / "baseline" / "runs",
    }


@pytest.mark.faults
def test_a_killed_worker_is_replaced_and_training_continues_from_the_checkpoint(data, baseline):
    path = write(data / "workerkill", "workerkill", data="../data/sft.jsonl", output_root="runs")
    proc = start(path, cwd=data)
    pipeline_dir = path.parent / "runs" / "workerkill"
    wait_for_step(pipeline_dir, KILL_AFTER, proc)
    workers = train_workers(proc.pid)
    assert len(workers) == 2
    workers[-1].kill()
    [head, sft] = status(path, cwd=data).splitlines()  # while the run retries
    assert f"running, PID {proc.pid}" in head and sft.split()[:2] == ["sft", "running"]
    second = start(path, cwd=data)  # a run started by mistake while the first retries
    _, refused = finish(second, expect=2, timeout=120)
    assert f"in use by another run: `align run {path}`, PID {proc.pid}" in refused
    out, err = finish(proc)
    record = stage_record(path, "sft")
    assert record["retries"] == 1 and record["attempts"][1]["resumed_from"] >= CHECKPOINTS["save_steps"]
    assert "lost a worker" in out and "retry 1 of 2" in out
    assert "Traceback" not in out + err and "(raylet)" not in out + err  # Ray's own lines go to a file
    assert losses(path, "sft") == pytest.approx(baseline["losses"], rel=1e-4), record["attempts"]


@pytest.mark.faults
def test_a_killed_driver_is_resumed_by_the_next_run_from_another_folder(data, baseline, tmp_path):
    """Relative paths (data, output root) mean the pipeline file's folder, wherever `align` runs from."""
    path = write(data / "pipelines", "driverkill", data="../data/sft.jsonl", output_root="../runs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    relative = os.path.relpath(path, elsewhere)
    proc = start(relative, cwd=elsewhere)
    pipeline_dir = data / "runs" / "driverkill"
    wait_for_step(pipeline_dir, KILL_AFTER + CHECKPOINTS["save_steps"], proc)  # two complete checkpoints
    below, workers = descendants(proc.pid), train_workers(proc.pid)
    proc.kill()
    proc.wait()
    assert all_gone(workers, seconds=30)  # they die with the embedded Ray; its agents outlive the driver
    [attempt] = pipeline_dir.glob(".sft.tmp-*")
    step, checkpoint = latest_complete(attempt)
    (checkpoint / COMPLETE).unlink()  # as if the driver died while writing it: torn, never used
    before = latest_complete(attempt)[0]
    [head, sft] = status(relative, cwd=elsewhere).splitlines()
    assert "no run in progress" in head and sft.split()[:4] == ["sft", "interrupted", "at", "step"]
    assert f"`align run` resumes it from step {before} (" in sft  # not from the torn checkpoint
    out, _ = finish(start(relative, cwd=elsewhere))
    assert "process(es) left running by a run that was killed" in out
    assert all_gone(below)
    record = stage_record(path, "sft")
    assert record["resumed_from"] == before < step and record["steps_trained"] == TRL["max_steps"] - before
    assert f"resuming from step {before}" in out and f"unfinished checkpoint(s) at step {step}" in out
    assert not list(pipeline_dir.glob(".sft.*-*"))  # earlier attempts are removed once the stage is done
    assert losses(path, "sft") == pytest.approx(baseline["losses"], rel=1e-4)


@pytest.mark.faults
def test_no_secret_reaches_any_file_the_run_writes_or_its_console(baseline):
    assert SECRET not in baseline["output"] and ENV_SECRET not in baseline["output"]
    written = [p for p in baseline["root"].rglob("*") if p.is_file()]
    assert any(p.name == "training_args.bin" for p in written)  # the pickle that used to hold it
    leaks = [
        str(p) for p in written if SECRET.encode() in p.read_bytes() or ENV_SECRET.encode() in p.read_bytes()
    ]
    assert leaks == []
    record = stage_record(baseline["path"], "sft")
    assert record["config"]["trl"]["hub_token"] == "***"


@pytest.mark.faults
def test_ctrl_c_stops_every_process_keeps_the_stage_aside_and_says_how_to_resume(data, tmp_path):
    path = write(tmp_path, "ctrlc", data=str(data / "data" / "sft.jsonl"), output_root="runs")
    proc = start(path, cwd=tmp_path)
    wait_for_step(tmp_path / "runs" / "ctrlc", KILL_AFTER, proc)
    below = descendants(proc.pid)
    stopped = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, err = finish(proc, expect=130, timeout=60)
    assert all_gone(below, seconds=15 - (time.monotonic() - stopped))
    [kept] = (tmp_path / "runs" / "ctrlc").glob(".sft.failed-*")
    step = latest_complete(kept)[0]
    assert f"interrupted: stage 'sft' stopped (checkpoint at step {step}); kept in {kept}" in err
    assert f"`align run {path}` resumes it" in err and "Traceback" not in err
    assert json.loads((kept / "align-stage.json").read_text())["status"] == "interrupted"


@pytest.mark.faults
def test_an_output_root_without_room_is_refused_before_training(data, tmp_path):
    with tmpfs(tmp_path / "small", "size=2m") as root:
        path = write(tmp_path, "full", data=str(data / "data" / "sft.jsonl"), output_root=str(root))
        started = time.monotonic()
        _, err = finish(start(path, cwd=tmp_path), expect=2, timeout=120)
        assert time.monotonic() - started < 30  # refused before Ray or a model
        [line] = [line for line in err.splitlines() if line.startswith("error:")]
        assert f"{root}/full has" in line and "free; stage 'sft' needs about" in line
        assert not list((root / "full").glob(".sft.*"))
