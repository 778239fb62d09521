"""A stage that fails leaves nothing that looks done, keeps its partial outputs, and says why plainly."""

import json

import pytest

from tests.pipelines import PREF_DATA, run, stage, stage_folder, write_pipeline

pytestmark = pytest.mark.integration


def test_a_late_data_error_fails_the_stage_cleanly_and_keeps_what_ran(tmp_path):
    good = [json.dumps({"prompt": "Hi", "chosen": "Hello!", "rejected": "Whatever."})] * 3
    bad = tmp_path / "prefs.jsonl"
    bad.write_text("\n".join([good[0], "{not json", *good[1:]]) + "\n")  # validate reads only row 1
    stages = {
        "sft": stage("sft", steps=2),
        "dpo": stage("dpo", model="${stages.sft.output}", lora={"r": 4})
        | {"data": {**PREF_DATA, "train": str(bad)}},
    }
    path = write_pipeline(tmp_path, "fails", stages)
    done = run(path, expect=2)

    assert "stages.dpo.data.train" in done.stderr and "line 2" in done.stderr
    assert "Traceback" not in done.stderr.split("error:")[-1]
    assert json.loads((stage_folder(path, "sft") / "align-stage.json").read_text())["status"] == "succeeded"
    assert not stage_folder(path, "dpo").exists()  # nothing that looks finished
    kept = list(stage_folder(path, "dpo").parent.glob(".dpo.failed-*"))
    assert len(kept) == 1
    record = json.loads((kept[0] / "align-stage.json").read_text())
    assert record["status"] == "failed" and "line 2" in record["error"]
