"""`align validate` reads every row of a local data file (streaming) and every local model's config.json
before anything loads: each defect with its file, places and fix, the verdict cached per file version."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from align.cli import main
from align.data import rows as data_rows
from align.data import scan as data_scan
from align.data.scan import check_data
from align.errors import ConfigError
from align.pipeline.file import load

USER, BOT = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}
BAD_BOT = {"role": "assistant", "content": "Go away."}
PAIR = {"prompt": "Hi", "chosen": "Hello!", "rejected": "Go away."}


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALIGN_CACHE", str(tmp_path / "cache"))


def jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def validate(
    capsys: pytest.CaptureFixture[str], folder: Path, stages: dict, **top: object
) -> tuple[int, str]:
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"name": "scan", "base_model": "tiny", "stages": stages}))
    code = main(["validate", str(path)])
    return code, capsys.readouterr().err


VALID = {
    "sft": {
        "messages": [{"messages": [USER, BOT]}],
        "text": [{"text": "Hi. Hello!"}],
        "prompt-completion": [{"prompt": "Hi", "completion": "Hello!"}],
        "conversational prompt-completion": [{"prompt": [USER], "completion": [BOT]}],
    },
    "preferences": {
        "explicit prompt": [PAIR],
        "conversational explicit prompt": [{"prompt": [USER], "chosen": [BOT], "rejected": [BAD_BOT]}],
        "implicit prompt": [{"chosen": "Hi. Hello!", "rejected": "Hi. Go away."}],
        "conversational implicit prompt": [{"chosen": [USER, BOT], "rejected": [USER, BAD_BOT]}],
    },
    "unpaired": {
        "prompt-completion-label": [{"prompt": "Hi", "completion": "Hello!", "label": True}],
        "conversational unpaired": [{"prompt": [USER], "completion": [BOT], "label": False}],
        "paired, unpaired by the stage": [PAIR],
    },
    "prompts": {
        "prompt as text": [{"prompt": "What is 2 + 2?"}],
        "prompt as a conversation": [{"prompt": [USER]}],
    },
}
CASES = [(kind, name) for kind, formats in VALID.items() for name in formats]


@pytest.mark.parametrize(("kind", "name"), CASES, ids=[f"{kind}:{name}" for kind, name in CASES])
def test_each_trl_format_of_each_data_kind_passes(tmp_path: Path, kind: str, name: str) -> None:
    rows = VALID[kind][name] * 3
    assert check_data(str(jsonl(tmp_path / "rows.jsonl", rows)), kind, "d") is None
    array = tmp_path / "rows.json"
    array.write_text(json.dumps(rows, indent=2))
    assert check_data(str(array), kind, "d") is None
    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    assert check_data(str(parquet), kind, "d") is None


def test_a_bad_json_line_deep_in_the_file_fails_validate_naming_the_file_and_line(tmp_path, capsys) -> None:
    data = tmp_path / "sft.jsonl"
    data.write_text('{"text": "a"}\n{"text": "b"}\n{"text": "c"\n{"text": "d"}\n')
    code, err = validate(capsys, tmp_path, {"sft": {"kind": "sft", "data": {"train": "sft.jsonl"}}})
    assert code == 2
    assert (
        f"  - stages.sft.data.train: {data} line 3 is not valid JSON (Expecting ',' delimiter); "
        "each line must hold one JSON object\n"
    ) in err


def test_rows_missing_a_column_are_counted_with_their_first_lines(tmp_path, capsys) -> None:
    rows = [PAIR] * 12
    for line in (4, 9, 10, 11, 12):
        rows[line - 1] = {"prompt": "Hi", "chosen": "Hello!"}
    data = jsonl(tmp_path / "prefs.jsonl", rows)
    code, err = validate(capsys, tmp_path, {"dpo": {"kind": "dpo", "data": {"train": "prefs.jsonl"}}})
    assert code == 2
    assert (
        f"  - stages.dpo.data.train: {data}: 5 of 12 rows lack 'rejected': lines 4, 9, 10 and 2 more; "
        "each row of preferences data needs one of: prompt+chosen+rejected, chosen+rejected\n"
    ) in err


def test_a_file_none_of_whose_rows_fit_names_the_columns_it_lacks(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "sft.jsonl", [{"question": "Hi", "answer": "Hello"}] * 2)
    assert check_data(str(data), "sft", "d") == (
        f"{data} lacks column 'messages' that sft data needs (it has: question, answer); "
        "expected one of: messages, text, prompt+completion; if they are named otherwise, rename them: "
        "data: {columns: {question: prompt, answer: completion}}"
    )


MESSAGES, TEXT = {"messages": [USER, BOT]}, {"text": "Hi. Hello!"}
STANDARD = {"prompt": "Hi", "completion": "Hello!"}
IMPLICIT = {"chosen": "Hi. Hello!", "rejected": "Hi. Go away."}
LABELLED = {"prompt": "Hi", "completion": "Hello!", "label": True}
BAD_ROWS = [
    ("sft", MESSAGES, {"messages": "Hi"}, "has a 'messages' that is not a list of {role, content} messages"),
    ("sft", MESSAGES, {"messages": [{"role": "user"}]}, "has a 'messages' that is not a list of {role,"),
    ("sft", MESSAGES, {"messages": []}, "has an empty 'messages'"),
    ("sft", MESSAGES, {"text": "Hi"}, "lacks 'messages'"),
    ("sft", TEXT, {"text": "   "}, "has an empty 'text'"),
    ("sft", TEXT, {"text": 42}, "has a 'text' that is not a string"),
    (
        "sft",
        {"prompt": "Hi", "completion": "Hello!"},
        {"prompt": "Hi", "completion": [BOT]},
        "mixes text and",
    ),
    ("preferences", PAIR, {"prompt": "Hi", "chosen": "", "rejected": "No"}, "has an empty 'chosen'"),
    (
        "preferences",
        IMPLICIT,
        {"chosen": [USER, BOT], "rejected": [USER, BAD_BOT]},
        "holds conversations where",
    ),
    ("unpaired", LABELLED, {**LABELLED, "label": 1}, "has a 'label' that is not true or false"),
    ("unpaired", LABELLED, {**LABELLED, "label": "yes"}, "has a 'label' that is not true or false"),
    ("prompts", {"prompt": "Hi"}, {"prompt": None}, "lacks 'prompt'"),
    ("prompts", {"prompt": "Hi"}, [1, 2], "is not a JSON object (a JSON list)"),
]


@pytest.mark.parametrize(("kind", "good", "bad", "expected"), BAD_ROWS)
def test_a_row_the_stage_cannot_use_is_named_by_its_line(tmp_path: Path, kind, good, bad, expected) -> None:
    data = jsonl(tmp_path / "rows.jsonl", [good, good, bad, good])
    problem = check_data(str(data), kind, "d")
    assert problem is not None and problem.startswith(f"{data} line 3 {expected}"), problem


def test_rows_in_another_format_than_the_first_are_refused(tmp_path: Path) -> None:
    implicit = {"chosen": "Hi. Hello!", "rejected": "Hi. Go away."}
    data = jsonl(tmp_path / "prefs.jsonl", [implicit, PAIR, implicit])
    assert check_data(str(data), "preferences", "d") == (
        f"{data} line 2 has 'prompt', which line 1 lacks; "
        "TRL takes one format from the first row: give every row the same columns"
    )


def test_several_defects_are_reported_together_for_one_file(tmp_path: Path) -> None:
    data = tmp_path / "prefs.jsonl"
    data.write_text(json.dumps(PAIR) + "\n{oops\n" + json.dumps({"prompt": "Hi", "chosen": "Yes"}) + "\n")
    problem = check_data(str(data), "preferences", "d")
    assert problem == (
        f"{data}: 1 of 3 rows is not valid JSON: line 2 (Expecting property name enclosed in double quotes); "
        "1 of 3 rows lacks 'rejected': line 3; each line must hold one JSON object; "
        "each row of preferences data needs one of: prompt+chosen+rejected, chosen+rejected"
    )


def test_parquet_rows_are_scanned_in_record_batches(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(data_rows, "BATCH_ROWS", 2)
    rows = [PAIR] * 5 + [{"prompt": "Hi", "chosen": "Hello!", "rejected": None}]
    parquet = tmp_path / "prefs.parquet"
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    assert check_data(str(parquet), "preferences", "d") == (
        f"{parquet} row 5 lacks 'rejected'; "
        "each row of preferences data needs one of: prompt+chosen+rejected, chosen+rejected"
    )
    pq.write_table(pa.Table.from_pylist([{"prompt": "Hi", "chosen": "Hello!"}]), parquet)
    assert "lacks column 'rejected' that preferences data needs" in check_data(
        str(parquet), "preferences", "d"
    )


def test_datasets_folders_are_scanned(tmp_path: Path) -> None:
    from datasets import Dataset

    Dataset.from_list([{"messages": [USER, BOT]}, {"messages": []}]).save_to_disk(tmp_path / "sft")
    assert check_data(str(tmp_path / "sft"), "sft", "d") == (
        f"{tmp_path / 'sft'} row 1 has an empty 'messages'; fill in or drop the empty rows"
    )


def test_a_json_array_is_read_a_chunk_at_a_time(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(data_rows, "CHUNK", 16)  # items cross chunk boundaries
    rows = [{"messages": [USER, {"role": "assistant", "content": "x" * 100}]}] * 4 + [{"messages": []}]
    array = tmp_path / "sft.json"
    array.write_text(json.dumps(rows[:4], indent=1))
    assert check_data(str(array), "sft", "d") is None
    array.write_text(json.dumps(rows, indent=1))
    expected = f"{array} item 4 has an empty 'messages'; fill in or drop the empty rows"
    assert check_data(str(array), "sft", "d") == expected
    array.write_text('[\n {"text": "a"},\n {"text": "b"}\n {"text": "c"}\n]\n')
    assert check_data(str(array), "sft", "d") == (
        f"{array} line 4 is not valid JSON (expected ',' in the array); a .json file holds one array of "
        "objects, or one object per line"
    )
    array.write_text('[\n {"text": "a"},\n {"text": "b\n')
    assert check_data(str(array), "sft", "d").startswith(f"{array} line 3 is not valid JSON (Invalid control")


def test_the_verdict_is_cached_per_version_of_the_file(tmp_path: Path, monkeypatch) -> None:
    data = jsonl(tmp_path / "prefs.jsonl", [PAIR, {"prompt": "Hi"}])
    first = check_data(str(data), "preferences", "d")
    assert first is not None and "line 2 lacks 'chosen', 'rejected'" in first
    scanned = data_scan.scan

    def refuse(*args: object) -> str | None:
        raise AssertionError("scanned again although the file did not change")

    monkeypatch.setattr(data_scan, "scan", refuse)
    assert check_data(str(data), "preferences", "d") == first
    assert list((tmp_path / "cache" / "data-checks").glob("*.json"))
    jsonl(data, [PAIR, PAIR])  # a new version: scanned again
    monkeypatch.setattr(data_scan, "scan", scanned)
    assert check_data(str(data), "preferences", "d") is None
    assert check_data(str(data), "sft", "d") is not None  # another kind is another verdict


def test_builtin_data_needs_no_scan(monkeypatch) -> None:
    monkeypatch.setattr(data_scan, "scan", lambda *args: pytest.fail("a builtin was scanned"))
    assert check_data("align:chatterbot/prefs/train", "preferences", "d") is None


def test_a_quick_scan_prints_nothing(tmp_path: Path, capsys) -> None:
    data = jsonl(tmp_path / "prefs.jsonl", [PAIR] * 100)
    assert check_data(str(data), "preferences", "d") is None
    assert capsys.readouterr().err == ""


def model_folder(path: Path, **config: object) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "llama", **config}))
    return path


def pipeline_with(folder: Path, model: str, **top: object) -> Path:
    body = {
        "name": "custom",
        "base_model": "tiny",
        **top,
        "stages": {"sft": {"kind": "sft", "model": model, "data": {"train": "align:chatterbot/sft/train"}}},
    }
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ({"auto_map": {"AutoModelForCausalLM": "modeling_mine.MyLM"}}, "its config.json has an auto_map"),
        ({"model_type": "my-own-lm"}, "names model_type 'my-own-lm', which transformers"),
    ],
)
def test_a_model_that_runs_its_own_code_needs_the_opt_in(tmp_path: Path, config: dict, reason: str) -> None:
    folder = model_folder(tmp_path / "mine", **config)
    with pytest.raises(ConfigError) as raised:
        load(pipeline_with(tmp_path, "mine"))
    [problem] = raised.value.problems
    assert problem.path == "stages.sft.model"
    assert problem.message.startswith(f"{folder} needs code of its own: ") and reason in problem.message
    assert "set `allow_custom_code: true` at the top of the pipeline file" in problem.message
    assert "or use a model that transformers supports natively" in problem.message
    assert load(pipeline_with(tmp_path, "mine", allow_custom_code=True)).stages["sft"].model == str(folder)


def test_a_model_transformers_knows_needs_no_opt_in(tmp_path: Path) -> None:
    for model_type in ("llama", "qwen2", "gpt-sw3"):
        folder = tmp_path / model_type
        model_folder(folder, model_type=model_type)
        assert load(pipeline_with(tmp_path, model_type)).stages["sft"].model == str(folder)
