"""What a run survives, without Ray: resume from the latest complete checkpoint of an earlier attempt,
torn checkpoints, `--restart`, lost workers retried (and stage errors not), interrupts set aside with
a message, the run lock, and an output root that cannot be written. A scripted launcher stands in for
Ray Train; the Ray side of each is tested in test_faults.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from align.errors import AlignError, Interrupted, StageFailed
from align.models.loading import resolve_model
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.plan import build
from align.records import StageResult
from align.run import records
from align.run.controller import run_plan
from align.run.launch import Launched, LostWorkers
from align.run.lock import LOCK, run_lock
from align.stages.checkpoints import COMPLETE, latest_complete
from tests.mounts import tmpfs

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)


class Script:
    """A launcher that plays one scripted step per call: write these checkpoints, then end this way."""

    def __init__(self, *steps: tuple[list[int], BaseException | None], torn: int | None = None) -> None:
        self.steps = list(steps)
        self.torn = torn
        self.resumed: list[Path | None] = []

    def __call__(self, plan, stage, scratch: Path, resume: Path | None) -> Launched:
        self.resumed.append(resume)
        checkpoints, ending = self.steps.pop(0)
        for step in checkpoints:
            folder = scratch / "checkpoints" / f"checkpoint-{step}"
            folder.mkdir(parents=True, exist_ok=True)
            if step != self.torn:
                (folder / COMPLETE).write_text("{}")
        if ending is not None:
            raise ending
        (scratch / "model").mkdir(exist_ok=True)
        return Launched(StageResult(output="model", metrics={"loss": 1.0}, steps=10))


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    base = tmp_path / "base"
    base.mkdir()
    shutil.copy(Path(resolve_model("tiny")) / "config.json", base)  # a model folder, never loaded
    (tmp_path / "sft.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    body = {
        "name": "survive",
        "base_model": str(base),
        "defaults": {"output_root": str(tmp_path / "runs"), "max_failures": 2},
        "stages": {"sft": {"kind": "sft", "data": {"train": str(tmp_path / "sft.jsonl")}}},
    }
    path = tmp_path / "survive.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def run(path: Path, launcher: Script, **options) -> list[str]:
    events: list[str] = []
    run_plan(build(load(path), CPU), launch=launcher, on_event=events.append, **options)
    return events


def stage_folder(path: Path) -> Path:
    return path.parent / "runs" / "survive" / "sft"


def kept(path: Path) -> list[Path]:
    return sorted(stage_folder(path).parent.glob(".sft.failed-*"))


def test_an_interrupted_stage_is_set_aside_then_resumed_from_its_latest_complete_checkpoint(pipeline):
    with pytest.raises(
        Interrupted, match=r"stage 'sft' stopped \(checkpoint at step 4\); kept in .*\.sft\.failed-"
    ):
        run(pipeline, Script(([2, 4], Interrupted(signal.SIGINT))))
    [aside] = kept(pipeline)
    assert records.read_stage(aside).status == "interrupted"
    again = Script(([6], None))
    events = run(pipeline, again)
    resumed_at = next(Path(p) for p in again.resumed)
    assert resumed_at.name == "checkpoint-4" and any("resuming from step 4" in e for e in events)
    record = records.read_stage(stage_folder(pipeline))
    assert (record.resumed_from, record.steps_trained, record.retries) == (4, 6, 0)
    assert kept(pipeline) == [] and not list(stage_folder(pipeline).parent.glob(".sft.tmp-*"))


def test_a_driver_killed_mid_stage_leaves_a_scratch_folder_that_the_next_run_resumes(pipeline):
    with pytest.raises(StageFailed):
        run(pipeline, Script(([3], StageFailed("boom"))))
    [aside] = kept(pipeline)
    aside.rename(aside.parent / ".sft.tmp-deadbeef")  # what a SIGKILLed driver leaves: its scratch folder
    again = Script(([], None))
    run(pipeline, again)
    assert again.resumed[0].name == "checkpoint-3"


def test_a_torn_latest_checkpoint_is_never_used_the_one_before_it_is(pipeline):
    with pytest.raises(Interrupted):
        run(pipeline, Script(([2, 4], Interrupted(signal.SIGTERM)), torn=4))
    again = Script(([], None))
    events = run(pipeline, again)
    assert again.resumed[0].name == "checkpoint-2"
    assert any("unfinished checkpoint(s) at step 4" in e for e in events)


def test_a_checkpoint_of_the_last_step_is_passed_over_for_the_one_before(tmp_path):
    """transformers resumed from its last step trains one step past max_steps (measured: 5 of 4)."""
    for step in (4, 8):
        folder = tmp_path / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        (folder / COMPLETE).write_text("{}")
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 8}))
    assert latest_complete(tmp_path) == (4, tmp_path / "checkpoints" / "checkpoint-4")


def test_restart_throws_the_partial_work_away(pipeline):
    with pytest.raises(Interrupted):
        run(pipeline, Script(([2], Interrupted(signal.SIGINT))))
    fresh = Script(([], None))
    run(pipeline, fresh, restart=["sft"])
    assert fresh.resumed == [None] and kept(pipeline) == []
    assert records.read_stage(stage_folder(pipeline)).resumed_from is None


def test_a_changed_stage_does_not_resume_an_attempt_at_the_old_one(pipeline):
    with pytest.raises(Interrupted):
        run(pipeline, Script(([2], Interrupted(signal.SIGINT))))
    pipeline.write_text(pipeline.read_text().replace("max_failures: 2", "seed: 7\n  max_failures: 2"))
    fresh = Script(([], None))
    run(pipeline, fresh)
    assert fresh.resumed == [None]


def test_lost_workers_are_retried_from_the_latest_checkpoint_up_to_max_failures(pipeline):
    lost = LostWorkers("a worker of stage 'sft' was lost")
    script = Script(([2], lost), ([4], lost), ([], None))
    events = run(pipeline, script)
    assert [p.name if p else None for p in script.resumed] == [None, "checkpoint-2", "checkpoint-4"]
    record = records.read_stage(stage_folder(pipeline))
    assert record.retries == 2 and [a.resumed_from for a in record.attempts] == [None, 2, 4]
    assert sum("retry" in e for e in events) == 2
    with pytest.raises(StageFailed, match=r"gave up after 2 retries \(max_failures: 2\)"):
        run(pipeline, Script(([], lost), ([], lost), ([], lost)), force=["sft"])


def test_a_stage_error_is_not_retried(pipeline):
    script = Script(([], StageFailed("stage 'sft' failed: ValueError: bad", rank=1)))
    with pytest.raises(StageFailed, match=r"full log: .*\.sft\.failed-.*/logs/worker-1\.log"):
        run(pipeline, script)
    assert len(script.resumed) == 1


def test_a_second_run_is_refused_naming_the_first(pipeline):
    with run_lock(stage_folder(pipeline).parent, "align run other.yaml"):
        with pytest.raises(
            AlignError, match=rf"in use by another run: `align run other.yaml`, PID {os.getpid()}"
        ):
            run(pipeline, Script(([], None)))


def test_the_lock_of_a_killed_run_is_taken_over_and_its_processes_stopped(pipeline):
    folder = stage_folder(pipeline).parent
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(folder)], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout.readline().strip() == "locked"
    orphan = int(json.loads((folder / LOCK).read_text())["processes"][0][0])
    holder.kill()
    holder.wait()
    assert not gone(orphan)
    events = run(pipeline, Script(([], None)))
    assert "stopped 1 process(es) left running by a run that was killed" in events
    assert wait_until(lambda: gone(orphan))


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


HOLD_LOCK = """
import subprocess, sys, time
from pathlib import Path
from align.run.lock import run_lock
with run_lock(Path(sys.argv[1]), "align run survive.yaml") as lock:
    subprocess.Popen(["sleep", "300"], start_new_session=True)
    lock.note_processes()
    print("locked", flush=True)
    time.sleep(300)
"""


def test_a_read_only_output_root_is_one_clear_line(pipeline, tmp_path):
    with tmpfs(tmp_path / "readonly", "ro,size=1m") as root:
        plan = build(load(pipeline, [f"defaults.output_root={root}"]), CPU)
        with pytest.raises(AlignError, match=rf"cannot write to {root}/survive: Read-only file system"):
            run_plan(plan, launch=Script(([], None)))


def test_only_secrets_leave_a_trl_config_and_the_hub_token_moves_to_the_environment(monkeypatch, tmp_path):
    """Every secret-named field of every stage kind's TRL config: `hub_token` is emptied (it is pickled into
    training_args.bin) and handed to the hub client through HF_TOKEN; tokenizer and generation `*_token`
    settings (`pad_token`, `eos_token`, PPO's `stop_token`) are not secrets and stay as set."""
    import dataclasses

    from align.config.secrets import is_secret_name
    from align.config.spec import KINDS
    from align.pipeline.trl_args import config_class
    from align.stages.context import without_secrets

    kinds = [name for name, kind in KINDS.items() if kind.config]
    names = {field.name for kind in kinds for field in dataclasses.fields(config_class(kind))}
    assert sorted(n for n in names if is_secret_name(n)) == ["hub_token"]
    monkeypatch.delenv("HF_TOKEN", raising=False)
    config = without_secrets(
        config_class("ppo")(output_dir=str(tmp_path), use_cpu=True, hub_token="hf_secret", stop_token="eos")
    )
    assert config.hub_token is None and config.stop_token == "eos" and os.environ["HF_TOKEN"] == "hf_secret"
