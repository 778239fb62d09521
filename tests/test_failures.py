"""One small pipeline run (Ray starts once) for two things:
- full-parameter DPO with precomputed reference log-probs loads no reference copy, and still trains;
- a stage that fails late (a bad JSON line that validate, reading one row, cannot see) leaves nothing that
  looks done, keeps its partial outputs, and says why plainly; the stages before it stay published.
"""

import json

import pytest

from tests.pipelines import PREF_DATA, run, stage, stage_folder, stage_record, write_pipeline

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fails")
    good = [json.dumps({"prompt": "Hi", "chosen": "Hello!", "rejected": "Whatever."})] * 3
    bad = folder / "prefs.jsonl"
    bad.write_text("\n".join([good[0], "{not json", *good[1:]]) + "\n")  # validate reads only row 1
    stages = {
        "sft": stage("sft", steps=2),
        "precomputed": stage("dpo", steps=3, trl={"precompute_ref_log_probs": True}),
        "dpo": stage("dpo", model="${stages.sft.output}", lora={"r": 4})
        | {"data": {**PREF_DATA, "train": str(bad)}},
    }
    path = write_pipeline(folder, "fails", stages, backend="ddp", precision="fp32")
    return path, run(path, expect=2)


def test_precomputed_reference_trains_without_a_copy(failed_run):
    path, _ = failed_run
    record = stage_record(path, "precomputed")
    assert record["status"] == "succeeded"
    metrics = record["metrics"]
    assert metrics["train_loss_last"] < metrics["train_loss_first"]
    assert metrics["reference_copy_loaded"] == 0.0  # the trainer holds no second model
    assert metrics["trainable_changed"] == 1.0


def test_a_late_data_error_fails_the_stage_cleanly_and_keeps_what_ran(failed_run):
    path, done = failed_run
    assert "stages.dpo.data.train" in done.stderr and "line 2" in done.stderr
    assert "Traceback" not in done.stderr.split("error:")[-1]
    assert json.loads((stage_folder(path, "sft") / "align-stage.json").read_text())["status"] == "succeeded"
    assert not stage_folder(path, "dpo").exists()  # nothing that looks finished
    kept = list(stage_folder(path, "dpo").parent.glob(".dpo.failed-*"))
    assert len(kept) == 1
    record = json.loads((kept[0] / "align-stage.json").read_text())
    assert record["status"] == "failed" and "line 2" in record["error"]
