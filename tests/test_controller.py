"""The driver without Ray: `run_plan` with a fake launcher that writes what a stage would.

Covers what the e2e runs cover slowly: inputs resolved from upstream records (reward models included),
fingerprints that skip what is up to date and rerun what changed, `--stage`/`--force`, atomic publish,
and a failed stage kept aside with its record.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
import yaml

from align.errors import AlignError, Interrupted, StageFailed
from align.models.loading import resolve_model
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.plan import ModelInput, build
from align.records import StageResult
from align.run import records, stop
from align.run.controller import run_plan
from align.run.launch import Launched

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
PREFS = {"prompt": "Hi", "chosen": "Hello!", "rejected": "No comment."}


class FakeLauncher:
    """Writes `adapter/` or `model/` as the stage's kind would, and remembers what each stage was given."""

    def __init__(self, fail: str | None = None) -> None:
        self.calls: list[str] = []
        self.inputs: dict[str, object] = {}
        self.alongside: dict[str, int] = {}  # how many stages the run said ran side by side with it
        self.fail = fail

    def __call__(self, plan, stage, scratch: Path, resume: Path | None) -> Launched:
        self.calls.append(stage.name)
        self.inputs[stage.name] = stage.inputs
        self.alongside[stage.name] = stage.resources.alongside
        output = "adapter" if getattr(stage.stage, "lora", None) else "model"
        (scratch / output).mkdir()
        (scratch / output / "weights.bin").write_text(stage.name)
        if stage.name == self.fail:
            raise StageFailed(f"stage '{stage.name}' failed: boom")
        return Launched(StageResult(output=output, metrics={"loss": 1.0}))


@pytest.fixture
def pipeline(tmp_path: Path) -> Path:
    """sft (LoRA) -> dpo -> merge, and a reward model read by a ppo stage, on a local base folder."""
    base = tmp_path / "base"
    base.mkdir()
    shutil.copy(Path(resolve_model("tiny")) / "config.json", base)  # a model folder, never loaded
    (tmp_path / "sft.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    (tmp_path / "prefs.jsonl").write_text(json.dumps(PREFS) + "\n")
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "Hi"}) + "\n")
    body = {
        "name": "fake",
        "base_model": str(base),
        "defaults": {"output_root": str(tmp_path / "runs")},
        "stages": {
            "sft": {"kind": "sft", "data": {"train": str(tmp_path / "sft.jsonl")}, "lora": {"r": 4}},
            "dpo": {
                "kind": "dpo",
                "model": "${stages.sft.output}",
                "data": {"train": str(tmp_path / "prefs.jsonl")},
                "lora": {"r": 4},
            },
            "merge": {"kind": "merge", "model": "${stages.dpo.output}"},
            "rm": {"kind": "reward", "data": {"train": str(tmp_path / "prefs.jsonl")}},
            "ppo": {
                "kind": "ppo",
                "data": {"train": str(tmp_path / "prompts.jsonl")},
                "rewards": [{"model": "${stages.rm.output}"}, {"function": "length"}],
            },
        },
    }
    path = tmp_path / "fake.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def run(path: Path, launcher: FakeLauncher, **options) -> dict[str, str]:
    outcomes = run_plan(build(load(path), CPU), launch=launcher, **options)
    return {outcome.stage: outcome.status for outcome in outcomes}


def folder(path: Path, stage: str) -> Path:
    return path.parent / "runs" / "fake" / stage


def test_each_stage_reads_its_upstream_outputs_and_records_them(pipeline: Path) -> None:
    launcher = FakeLauncher()
    assert run(pipeline, launcher) == dict.fromkeys(["sft", "dpo", "merge", "rm", "ppo"], "ran")
    assert sorted(launcher.calls) == sorted(["sft", "dpo", "merge", "rm", "ppo"])
    for before, after in [("sft", "dpo"), ("dpo", "merge"), ("rm", "ppo")]:
        assert launcher.calls.index(before) < launcher.calls.index(after)
    base = str(pipeline.parent / "base")
    sft_adapter = str(folder(pipeline, "sft") / "adapter")
    dpo_adapter = str(folder(pipeline, "dpo") / "adapter")
    assert launcher.inputs["dpo"].model == ModelInput(base, (sft_adapter,))
    assert launcher.inputs["merge"].model == ModelInput(base, (sft_adapter, dpo_adapter))
    assert launcher.inputs["ppo"].reward_models == {0: str(folder(pipeline, "rm") / "model")}
    record = records.read_stage(folder(pipeline, "merge"))
    assert record.status == "succeeded" and record.resolved.adapters == [sft_adapter, dpo_adapter]
    assert (folder(pipeline, "dpo") / "adapter" / "weights.bin").read_text() == "dpo"


def test_a_rerun_skips_everything_and_changed_data_reruns_the_stage_and_its_dependents(
    pipeline: Path,
) -> None:
    run(pipeline, FakeLauncher())
    again = FakeLauncher()
    assert set(run(pipeline, again).values()) == {"skipped"} and again.calls == []
    (pipeline.parent / "sft.jsonl").write_text(json.dumps({"text": "hello again"}) + "\n")
    changed = FakeLauncher()
    run(pipeline, changed)
    assert changed.calls == ["sft", "dpo", "merge"]
    assert not list(folder(pipeline, "sft").parent.glob(".sft.old-*"))  # the replaced folder is gone


def test_a_changed_setting_changes_the_fingerprint(pipeline: Path) -> None:
    run(pipeline, FakeLauncher())
    text = pipeline.read_text().replace("r: 4", "r: 8", 1)  # the sft stage's LoRA rank
    pipeline.write_text(text)
    changed = FakeLauncher()
    run(pipeline, changed)
    assert changed.calls == ["sft", "dpo", "merge"]


def test_stage_selects_what_it_needs_and_force_reruns_downstream_only(pipeline: Path) -> None:
    launcher = FakeLauncher()
    assert run(pipeline, launcher, only=["dpo"]) == {"sft": "ran", "dpo": "ran"}
    forced = FakeLauncher()
    run(pipeline, forced, force=["dpo"])
    assert sorted(forced.calls) == ["dpo", "merge", "ppo", "rm"]  # rm and ppo had never run
    with pytest.raises(AlignError, match="unknown stage 'nope'; stages: sft, dpo, merge, rm, ppo"):
        run(pipeline, FakeLauncher(), only=["nope"])


def test_a_failed_stage_is_kept_aside_with_its_record_and_nothing_is_published(pipeline: Path) -> None:
    failing = FakeLauncher(fail="dpo")
    with pytest.raises(StageFailed, match=r"partial outputs kept in .*\.dpo\.failed-"):
        run(pipeline, failing)
    assert "merge" not in failing.calls  # it reads dpo's output
    assert {"rm", "ppo"} <= set(failing.calls) and folder(pipeline, "ppo").is_dir()  # the others finish
    assert not folder(pipeline, "dpo").exists()
    kept = list(folder(pipeline, "dpo").parent.glob(".dpo.failed-*"))
    assert len(kept) == 1 and (kept[0] / "adapter" / "weights.bin").is_file()
    record = json.loads((kept[0] / records.RECORD).read_text())
    assert record["status"] == "failed" and "boom" in record["error"]
    resumed = FakeLauncher()
    run(pipeline, resumed)
    assert resumed.calls == ["dpo", "merge"]  # sft, rm and ppo were published and are reused
    assert not list(folder(pipeline, "dpo").parent.glob(".dpo.failed-*"))  # gone once dpo succeeded


class MeetingLauncher(FakeLauncher):
    """dpo and rm (both ready once sft ends) must be running at the same moment: each waits for the other
    inside its launch, which times out if the controller ran them one after the other."""

    def __init__(self) -> None:
        super().__init__()
        self.meeting = threading.Barrier(2, timeout=10)

    def __call__(self, plan, stage, scratch: Path, resume: Path | None) -> dict:
        if stage.name in ("dpo", "rm"):
            self.meeting.wait()
        return super().__call__(plan, stage, scratch, resume)


def test_stages_whose_inputs_are_ready_run_at_the_same_time(pipeline: Path) -> None:
    """Each stage is told how many run side by side, to take its part of the cores: sft and rm start
    together (neither reads a stage), and dpo starts while rm waits for it."""
    launcher = MeetingLauncher()
    assert set(run(pipeline, launcher).values()) == {"ran"}
    assert launcher.calls[0] == "sft" and set(launcher.calls[1:3]) == {"dpo", "rm"}
    assert {name: launcher.alongside[name] for name in ("sft", "rm", "dpo")} == {"sft": 2, "rm": 2, "dpo": 2}


class InterruptedLauncher(FakeLauncher):
    """rm is interrupted (as a Ctrl-C in its stage) while dpo runs; dpo runs until the run asks it to stop."""

    def __call__(self, plan, stage, scratch: Path, resume: Path | None) -> dict:
        if stage.name == "sft":
            return super().__call__(plan, stage, scratch, resume)
        self.calls.append(stage.name)
        (scratch / "checkpoints").mkdir(exist_ok=True)
        if stage.name == "rm":
            time.sleep(0.5)  # dpo is running by now
            raise KeyboardInterrupt
        while True:
            stop.check()
            time.sleep(0.05)


def test_an_interrupt_stops_every_running_stage_and_keeps_each(pipeline: Path) -> None:
    launcher = InterruptedLauncher()
    with pytest.raises(Interrupted) as stopped:
        run(pipeline, launcher)
    assert sorted(launcher.calls) == ["dpo", "rm", "sft"]  # merge and ppo never started
    for stage in ("dpo", "rm"):
        assert f"stage '{stage}' stopped" in str(stopped.value)
        kept = list(folder(pipeline, stage).parent.glob(f".{stage}.failed-*"))
        assert len(kept) == 1
        assert json.loads((kept[0] / records.RECORD).read_text())["status"] == "interrupted"
    assert records.read_stage(folder(pipeline, "sft")).status == "succeeded"
