"""The records that cross a package or a process: each round-trips through its file, an older file (one
that predates format numbers) is read, a newer one is refused in one line that names its version, and no
module outside align/records/ reads or writes their files by hand."""

from __future__ import annotations

import ast
import json
import math
from pathlib import Path

import pytest

from align.records import (
    EvalResults,
    LoggedStep,
    Progress,
    Record,
    RecordFormatError,
    StageError,
    StageResult,
    SweepState,
    VariantEnd,
    read,
    write,
)
from align.records.result import take_result, write_result
from tests.fake_records import a_record

PACKAGE = Path(__file__).resolve().parents[1] / "align"

EXAMPLES: list[Record] = [
    a_record("dpo", status="succeeded", metrics={"loss": 0.5, "nan_loss": math.nan}, retries=1),
    StageResult(output="adapter", metrics={"loss": 1.0}, steps=10, samples=[{"prompt": "p", "before": "a"}]),
    StageError(type="DataError", message="bad row"),
    EvalResults(baseline="a", models=["a", "b"], rewards=["r"], prompts=2, generation={}, figures={}),
    Progress(
        started=1.0,
        time=2.0,
        step=3,
        max_steps=9,
        value=("loss", 0.5),
        recent=[LoggedStep(step=3, values={})],
    ),
    Progress(started=1.0, time=1.0, phase="loading the data", notes=["said once"]),
    SweepState(spec={"method": "grid"}, variants=(VariantEnd(values={"x": 1}, status="stopped", step=4),)),
]


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda record: type(record).__name__)
def test_each_record_reads_back_as_written(tmp_path: Path, record: Record) -> None:
    write(tmp_path / "r.json", record)
    found = read(tmp_path / "r.json", type(record))
    assert found is not None
    assert found.model_dump_json() == record.model_dump_json()  # NaN compares by its text


@pytest.mark.parametrize("record", EXAMPLES, ids=lambda record: type(record).__name__)
def test_a_record_from_before_format_numbers_is_read_and_a_newer_one_refused(tmp_path, record) -> None:
    data = json.loads(record.model_dump_json())
    del data["format"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    assert read(tmp_path / "old.json", type(record)).model_dump_json() == record.model_dump_json()
    (tmp_path / "new.json").write_text(json.dumps({**data, "format": 9}))
    with pytest.raises(RecordFormatError) as refused:
        read(tmp_path / "new.json", type(record))
    message = str(refused.value)
    assert "\n" not in message and f"{type(record).__name__} format 9" in message
    assert "upgrade align" in message


def test_a_torn_or_foreign_file_reads_as_none(tmp_path: Path) -> None:
    (tmp_path / "torn.json").write_text('{"pipeline": ')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "other.json").write_text(json.dumps({"format": 1, "unrelated": True}))
    for name in ("torn.json", "list.json", "other.json", "absent.json"):
        assert read(tmp_path / name, StageResult) is None


def test_the_launcher_takes_rank_zeros_result_out_of_the_stage_folder(tmp_path: Path) -> None:
    write_result(tmp_path, StageResult(output="model"))
    assert take_result(tmp_path) == StageResult(output="model")
    assert list(tmp_path.iterdir()) == [] and take_result(tmp_path) is None


RECORD_FILES = {"align-stage.json", ".result.json", ".error.json", "results.json", "sweep.json"}


def test_no_module_outside_records_names_a_record_file() -> None:
    """Each record's file name is said once, in align/records/: nobody else builds the path and parses it
    by key."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path.parent.name == "records" and path.parent.parent == PACKAGE:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in RECORD_FILES:
                found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.value}")
    assert found == []
