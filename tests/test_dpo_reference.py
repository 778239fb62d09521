"""Full-parameter DPO with precomputed reference log-probs: no reference copy, and it still trains."""

import pytest

from tests.pipelines import run, stage, stage_record, write_pipeline

pytestmark = pytest.mark.integration


def test_precomputed_reference_runs_without_a_copy(tmp_path):
    dpo = stage("dpo", steps=3, trl={"precompute_ref_log_probs": True})
    path = write_pipeline(tmp_path, "precomputed", {"dpo": dpo}, backend="ddp", precision="fp32")
    run(path)
    record = stage_record(path, "dpo")
    assert record["status"] == "succeeded"
    metrics = record["metrics"]
    assert metrics["train_loss_last"] < metrics["train_loss_first"]
    assert metrics["reference_copy_loaded"] == 0.0  # the trainer holds no second model
    assert metrics["trainable_changed"] == 1.0
