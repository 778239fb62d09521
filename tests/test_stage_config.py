"""What align adds to a stage's TRL config on the worker: TensorBoard events under the stage's logs/ unless
the `trl:` block sets `report_to` (W&B, MLflow, or nothing), which is passed to TRL as written."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.launch import launch_of
from align.planning.plan import build
from align.run.inputs import resolve_inputs
from align.stages.context import StageContext, stage_config
from pipelines import stage, write_pipeline

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)


def config_for(tmp_path: Path, trl: dict) -> tuple[object, Path]:
    """The SFT stage's TRL config as its worker builds it, and the stage's output folder."""
    sft = stage("sft", trl=trl)
    if "report_to" not in trl:
        del sft["trl"]["report_to"]  # the tests' stages turn reporting off; here it is left to align
    plan = build(load(write_pipeline(tmp_path, "tb", {"sft": sft})), CPU).stages["sft"]
    launch = launch_of(plan, resolve_inputs(plan, {}))
    output = tmp_path / "out"
    return stage_config(StageContext(plan=plan, output_dir=output, launch=launch)), output


def test_tensorboard_is_the_default_and_writes_under_the_stages_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    config, output = config_for(tmp_path, {})
    assert config.report_to == ["tensorboard"]
    assert os.environ["TENSORBOARD_LOGGING_DIR"] == str(output / "logs" / "tensorboard")


@pytest.mark.parametrize("report_to", [[], ["wandb"], ["mlflow", "tensorboard"]])
def test_a_report_to_in_the_trl_block_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, report_to: list[str]
) -> None:
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    config, output = config_for(tmp_path, {"report_to": report_to})
    assert config.report_to == report_to
    expected = str(output / "logs" / "tensorboard") if "tensorboard" in report_to else None
    assert os.environ.get("TENSORBOARD_LOGGING_DIR") == expected
