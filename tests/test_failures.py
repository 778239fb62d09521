"""One small pipeline run (Ray starts once) for two things:
- full-parameter DPO with precomputed reference log-probs loads no reference copy, and still trains;
- a stage that fails in its worker with an error align did not foresee (a model folder whose config.json
  no longer matches its weights: the plan reads the config and passes) is not retried, leaves
  nothing that looks done, keeps its partial outputs, and says why in one line that points at the
  worker's log, which holds the traceback; the stages before it stay published.
"""

import json
import shutil

import pytest

from align.models.loading import resolve_model
from tests.pipelines import run, stage, stage_folder, stage_record, write_pipeline

pytestmark = [pytest.mark.integration, pytest.mark.faults]  # make test-faults


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fails")
    edited = shutil.copytree(resolve_model("tiny"), folder / "edited-model")
    config = json.loads((edited / "config.json").read_text())
    config["intermediate_size"] *= 2  # the weights keep the old shapes
    (edited / "config.json").write_text(json.dumps(config))
    stages = {
        "sft": stage("sft", steps=2),
        "precomputed": stage("dpo", steps=3, trl={"precompute_ref_log_probs": True}),
        "dpo": stage("dpo", model=str(edited), lora={"r": 4}),
    }
    path = write_pipeline(folder, "fails", stages, backend="ddp", precision="fp32")
    return path, run(path, expect=1)


def test_precomputed_reference_trains_without_a_copy(failed_run):
    path, _ = failed_run
    record = stage_record(path, "precomputed")
    assert record["status"] == "succeeded"
    metrics = record["metrics"]
    assert metrics["train_loss_last"] < metrics["train_loss_first"]
    assert metrics["reference_copy_loaded"] == 0.0  # the trainer holds no second model
    assert metrics["trainable_changed"] == 1.0


def test_a_stage_error_fails_once_in_one_line_pointing_at_the_worker_log(failed_run):
    path, done = failed_run
    [line] = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert "stage 'dpo' failed: RuntimeError: " in line and "ignore_mismatched_sizes" in line
    assert "Traceback" not in done.stdout + done.stderr and "retry" not in done.stdout  # not retried
    assert json.loads((stage_folder(path, "sft") / "align-stage.json").read_text())["status"] == "succeeded"
    assert not stage_folder(path, "dpo").exists()  # nothing that looks finished
    [kept] = stage_folder(path, "dpo").parent.glob(".dpo.failed-*")
    log = kept / "logs" / "worker-0.log"
    assert f"full log: {log}" in done.stderr and "Traceback" in log.read_text()
    record = json.loads((kept / "align-stage.json").read_text())
    assert record["status"] == "failed" and record["error"] in line
