"""`align status` reads a run's folder as the controller leaves it: published records, attempts with their
progress file, and the run lock's holder. The folders here are laid out by the controller's own record
functions; the killed-driver and killed-worker runs in tests/test_faults.py check it on real runs."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import time
from pathlib import Path

import yaml

from align.cli import main
from align.records import Progress, StageRecord, write_progress
from align.report.console import ProgressLine, format_progress
from align.run.lock import LOCK, process_started
from align.run.records import keep_failed, publish, scratch_name, start_attempt
from align.stages.checkpoints import CHECKPOINTS, COMPLETE
from tests.fake_records import a_record

STAGES = ("sft", "dpo", "rm", "merge")


def pipeline_file(tmp_path: Path) -> Path:
    """Four stages: sft done, dpo running or interrupted, rm failed, merge done before dpo began again."""
    prefs = {"train": "align:chatterbot/prefs/train"}
    stages = {
        "sft": {"kind": "sft", "data": {"train": "align:chatterbot/sft/train"}},
        "dpo": {"kind": "dpo", "model": "${stages.sft.output}", "data": prefs, "lora": {"r": 4}},
        "rm": {"kind": "reward", "model": "${stages.sft.output}", "data": prefs},
        "merge": {"kind": "merge", "model": "${stages.dpo.output}"},
    }
    body = {"name": "p", "base_model": "tiny", "defaults": {"output_root": "runs"}, "stages": stages}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def record(stage: str, started: float, **fields) -> StageRecord:
    return a_record(stage, started=started, **fields)


def lay_out_run(folder: Path) -> None:
    now = time.time()
    sft = scratch_name(folder / "sft")
    sft.mkdir(parents=True)
    publish(sft, folder / "sft", record("sft", now - 60, status="succeeded", ended=now - 30))
    merge = scratch_name(folder / "merge")
    merge.mkdir()
    reads = {"config": {"model": "${stages.dpo.output}"}}
    publish(merge, folder / "merge", record("merge", now - 90, status="succeeded", ended=now - 80, **reads))
    reads = {"config": {"model": "${stages.sft.output}"}}
    dpo = start_attempt(folder / "dpo", record("dpo", now - 20, **reads), None)
    write_progress(dpo / "logs", Progress(step=30, max_steps=60, first_step=0, started=now - 15, time=now))
    rm = record("rm", now - 50, config={"model": "${stages.sft.output}"})
    failed = rm.ended_as("failed", error="DataError: bad row\nmore")
    keep_failed(start_attempt(folder / "rm", rm, None), folder / "rm", failed)


def hold_lock(folder: Path, pid: int, started: float) -> None:
    holder = {"pid": pid, "host": socket.gethostname(), "started": started, "command": "align run p.yaml"}
    (folder / LOCK).write_text(json.dumps(holder))


def status(capsys, target: Path) -> list[str]:
    assert main(["status", str(target)]) == 0
    return capsys.readouterr().out.splitlines()


def test_each_stage_is_done_running_failed_or_pending_while_a_run_holds_the_folder(tmp_path, capsys):
    path = pipeline_file(tmp_path)
    folder = tmp_path / "runs" / "p"
    lay_out_run(folder)
    hold_lock(folder, os.getpid(), process_started())  # this process stands in for the run
    head, sft, dpo, rm, merge = status(capsys, path)
    assert f"running, PID {os.getpid()}" in head
    assert sft.split()[:2] == ["sft", "done"]
    assert dpo.split()[:5] == ["dpo", "running", "step", "30/60", "(50%)"] and "ETA 0:00:" in dpo
    assert rm.split()[:2] == ["rm", "failed"] and "DataError: bad row (" in rm and "more" not in rm
    assert merge.split()[:2] == ["merge", "outdated"] and merge.endswith("; redone after dpo")


def test_a_stage_of_a_dead_run_is_interrupted_and_a_run_folder_names_its_stages(tmp_path, capsys):
    path = pipeline_file(tmp_path)
    folder = tmp_path / "runs" / "p"
    lay_out_run(folder)
    hold_lock(folder, os.getpid(), started=1.0)  # the PID was reused: not the run that held it
    head, _, dpo, *_ = status(capsys, path)
    assert "no run in progress" in head
    assert (
        dpo.split()[:2] == ["dpo", "interrupted"]
        and "at step 30/60; `align run` starts it over (no checkpoint yet)" in dpo
    )
    # a checkpoint a few steps past the last progress write (at most one a second): its step is where
    [dpo_attempt] = folder.glob(".dpo.tmp-*")
    checkpoint = dpo_attempt / CHECKPOINTS / "checkpoint-32"
    checkpoint.mkdir(parents=True)
    (checkpoint / COMPLETE).touch()
    dpo = status(capsys, path)[2]
    assert "at step 32/60; `align run` resumes it from step 32" in dpo
    found = [line.split()[0] for line in status(capsys, folder)[1:]]
    assert found == ["sft", "dpo", "rm", "merge"]  # no pipeline file: the stages that left a folder, each
    # after the stages its record says it reads


def test_a_pipeline_that_never_ran_is_all_pending(tmp_path, capsys):
    lines = status(capsys, pipeline_file(tmp_path))
    assert "no run in progress" in lines[0] and [line.split() for line in lines[1:]] == [
        [name, "pending"] for name in STAGES
    ]


def test_a_missing_pipeline_file_is_named_not_sent_to_a_cluster(tmp_path, capsys):
    assert main(["status", str(tmp_path / "nosuch.yaml")]) == 2
    assert f"{tmp_path / 'nosuch.yaml'}: no such pipeline file or run folder" in capsys.readouterr().err


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def screen(drawn: str) -> list[str]:
    """What a terminal shows after `drawn`: lines, with "up N lines" and "clear below" applied."""
    rows, row = [""], 0
    for token in re.split(r"(\x1b\[\d+F\x1b\[J|\n)", drawn):
        if token == "\n":
            row += 1
            rows += [""] * (row + 1 - len(rows))
        elif match := re.fullmatch(r"\x1b\[(\d+)F\x1b\[J", token):
            row -= int(match.group(1))
            rows[row:] = [""]
        elif token:
            rows[row] += token
    return [line for line in rows if line]


def test_progress_keeps_one_live_line_per_running_stage_below_the_run_lines() -> None:
    terminal = Terminal()
    progress = ProgressLine(terminal)
    entry = {"max_steps": 10, "started": 0.0, "time": 1.0}
    progress.update("left", Progress(**entry, step=1))
    progress.update("right", Progress(**entry, step=2))
    progress.update("left", Progress(**entry, step=3))
    assert screen(terminal.getvalue()) == [
        format_progress("left", Progress(**entry, step=3)),
        format_progress("right", Progress(**entry, step=2)),
    ]
    progress.event("[left] done in 1.0s -> runs/x/left")
    progress.ended("left")  # the controller says so, typed: nobody reads it from the line
    assert screen(terminal.getvalue()) == [
        "[left] done in 1.0s -> runs/x/left",
        format_progress("right", Progress(**entry, step=2)),
    ]


def test_before_its_first_step_a_stage_says_what_it_is_doing() -> None:
    """Loading and tokenizing a large file takes minutes: the line names it, with its clock on a terminal
    and once per phase elsewhere, and the steps replace it."""
    import time

    terminal, log = Terminal(), io.StringIO()
    started = time.time() - 75
    for progress in (ProgressLine(terminal), ProgressLine(log)):
        for phase in ("loading the data", "loading the data", "preparing 2,000 training rows and the model"):
            progress.update("sft", Progress(phase=phase, started=started, time=started))
        progress.update("sft", Progress(step=1, max_steps=10, started=started, time=started + 1))
    assert screen(terminal.getvalue()) == [
        format_progress("sft", Progress(step=1, max_steps=10, started=started, time=started + 1))
    ]
    assert "[sft] preparing 2,000 training rows and the model, 0:01:1" in terminal.getvalue()
    assert log.getvalue().splitlines() == [
        "[sft] loading the data",
        "[sft] preparing 2,000 training rows and the model",
        format_progress("sft", Progress(step=1, max_steps=10, started=started, time=started + 1)),
    ]
