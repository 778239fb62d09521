"""Datasets: the builtin chatterbot splits, local formats, and the errors users see."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from datasets import Dataset, DatasetDict

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from align.data.corpora import BUILTIN_DATA, build_chatterbot  # noqa: E402
from align.data.loading import load_data, resolve_data  # noqa: E402
from align.data.scan import check_data  # noqa: E402
from align.errors import DataError  # noqa: E402

PREFS = [
    {
        "prompt": [{"role": "user", "content": "Hi"}],
        "chosen": [{"role": "assistant", "content": "Hello!"}],
        "rejected": [{"role": "assistant", "content": "Paella"}],
    },
    {
        "prompt": [{"role": "user", "content": "Who are you?"}],
        "chosen": [{"role": "assistant", "content": "A bot."}],
        "rejected": [{"role": "assistant", "content": "Blue."}],
    },
]


@pytest.fixture(scope="module")
def chatterbot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("chatterbot")
    build_chatterbot(out)
    return out


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def sft_prompts(path: Path) -> set[str]:
    return {row["messages"][0]["content"] for row in read_jsonl(path)}


def test_chatterbot_splits_hold_out_whole_prompts(chatterbot: Path) -> None:
    train, test = sft_prompts(chatterbot / "sft-train.jsonl"), sft_prompts(chatterbot / "sft-test.jsonl")
    assert not train & test
    assert 0.08 < len(test) / len(train | test) < 0.12
    pref_train = {row["prompt"][0]["content"] for row in read_jsonl(chatterbot / "prefs-train.jsonl")}
    pref_test = {row["prompt"][0]["content"] for row in read_jsonl(chatterbot / "prefs-test.jsonl")}
    assert pref_train == train and pref_test == test


def test_chatterbot_rows_are_conversational(chatterbot: Path) -> None:
    sft = read_jsonl(chatterbot / "sft-train.jsonl")
    assert len(sft) + len(read_jsonl(chatterbot / "sft-test.jsonl")) > 1100
    assert all([m["role"] for m in row["messages"]] == ["user", "assistant"] for row in sft)
    replies: dict[str, set[str]] = {}
    for row in sft:
        replies.setdefault(row["messages"][0]["content"], set()).add(row["messages"][1]["content"])
    prefs = read_jsonl(chatterbot / "prefs-train.jsonl")
    assert len(prefs) == len(sft)
    for row in prefs:
        assert set(row) == {"prompt", "chosen", "rejected"}
        assert [row["prompt"][0]["role"], row["chosen"][0]["role"], row["rejected"][0]["role"]] == [
            "user",
            "assistant",
            "assistant",
        ]
        own = replies[row["prompt"][0]["content"]]
        assert row["chosen"][0]["content"] in own and row["rejected"][0]["content"] not in own


def test_chatterbot_is_deterministic_for_a_seed(chatterbot: Path, tmp_path: Path) -> None:
    build_chatterbot(tmp_path / "same")
    build_chatterbot(tmp_path / "other", seed=1)
    for name in ("sft-train.jsonl", "prefs-train.jsonl", "prefs-test.jsonl"):
        assert (chatterbot / name).read_bytes() == (tmp_path / "same" / name).read_bytes()
    assert sft_prompts(tmp_path / "other" / "sft-test.jsonl") != sft_prompts(chatterbot / "sft-test.jsonl")


def test_builtin_refs_materialize_once_in_the_cache(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ALIGN_CACHE", str(tmp_path))
    assert check_data("align:chatterbot/prefs/train", "preferences", "stages.dpo.data") is None
    assert not (tmp_path / "data").exists()  # validating builds nothing
    path = resolve_data("align:chatterbot/prefs/train", "stages.dpo.data")
    assert path == tmp_path / "data" / "chatterbot" / "prefs-train.jsonl"
    assert sorted(p.name for p in path.parent.iterdir()) == sorted(name for name, _ in BUILTIN_DATA.values())
    dataset = load_data("align:chatterbot/sft/test", "sft", "stages.sft.eval_data")
    assert dataset.column_names == ["messages"] and len(dataset) > 50


def test_unknown_builtin_lists_the_builtins() -> None:
    problem = check_data("align:chatterbot/sft/dev", "sft", "x")
    assert problem is not None and "align:chatterbot/sft/train" in problem


def test_check_data_on_builtin_reports_a_kind_mismatch() -> None:
    problem = check_data("align:chatterbot/sft/train", "preferences", "x")
    assert problem is not None and "lacks columns 'chosen', 'rejected'" in problem


def test_jsonl_json_and_parquet_load(tmp_path: Path) -> None:
    jsonl = write_jsonl(tmp_path / "prefs.jsonl", PREFS)
    array = tmp_path / "prefs.json"
    array.write_text(json.dumps(PREFS, indent=2))
    parquet = tmp_path / "prefs.parquet"
    columns = {"prompt": ["Hi", "Yo"], "chosen": ["Hello", "Hey"], "rejected": ["No", "Bye"]}
    pd.DataFrame(columns).to_parquet(parquet)
    for path in (jsonl, array, parquet):
        assert check_data(str(path), "preferences", "d") is None
        dataset = load_data(str(path), "preferences", "d")
        assert isinstance(dataset, Dataset) and len(dataset) == 2
        assert dataset.column_names == ["prompt", "chosen", "rejected"]
    assert load_data(str(jsonl), "preferences", "d")[0]["chosen"] == [
        {"role": "assistant", "content": "Hello!"}
    ]


def test_datasets_folders_load_and_a_dataset_dict_needs_a_split(tmp_path: Path) -> None:
    splits = DatasetDict(train=Dataset.from_list(PREFS), test=Dataset.from_list(PREFS[:1]))
    splits.save_to_disk(tmp_path / "dd")
    splits["train"].save_to_disk(tmp_path / "single")
    assert check_data(str(tmp_path / "single"), "preferences", "d") is None
    assert len(load_data(str(tmp_path / "single"), "preferences", "d")) == 2
    assert check_data(f"{tmp_path / 'dd'}@test", "preferences", "d") is None
    assert len(load_data(f"{tmp_path / 'dd'}@test", "preferences", "d")) == 1
    assert resolve_data(f"{tmp_path / 'dd'}@test", "d") == tmp_path / "dd" / "test"
    assert "holds several splits (train, test): name one, as" in check_data(
        str(tmp_path / "dd"), "preferences", "d"
    )
    assert "has no split 'dev'; it has: train, test" in check_data(
        f"{tmp_path / 'dd'}@dev", "preferences", "d"
    )
    assert "that `datasets` save_to_disk did not write (no state.json)" in check_data(
        str(tmp_path), "preferences", "d"
    )


def test_missing_file_names_the_field_and_the_path(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match=rf"^stages\.sft\.data: {missing} does not exist; give a \.jsonl"):
        load_data(missing, "sft", "stages.sft.data")
    with pytest.raises(DataError, match=r"^stages\.sft\.data: .* does not exist"):
        resolve_data(missing, "stages.sft.data")
    assert check_data(missing, "sft", "stages.sft.data").startswith(f"{missing} does not exist; give")


def test_missing_column_names_the_file_the_column_and_the_choices(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "prefs.jsonl", [{"prompt": "Hi", "chosen": "Hello"}])
    expected = (
        "data/prefs.jsonl lacks column 'rejected' that preferences data needs (it has: prompt, chosen); "
        "expected one of: prompt+chosen+rejected, chosen+rejected"
    )
    assert check_data("data/prefs.jsonl", "preferences", "stages.dpo.data") == expected
    with pytest.raises(DataError) as error:
        load_data("data/prefs.jsonl", "preferences", "stages.dpo.data")
    assert str(error.value) == f"stages.dpo.data: {expected}"
    assert check_data("data/prefs.jsonl", "sft", "d").startswith("data/prefs.jsonl lacks column 'completion'")


def test_bad_json_lines_are_reported_with_their_line_number(tmp_path: Path) -> None:
    bad_first = tmp_path / "bad_first.jsonl"
    bad_first.write_text('\n{"text": "ok"\n')
    assert check_data(str(bad_first), "sft", "d") == (
        f"{bad_first} line 2 is not valid JSON (Expecting ',' delimiter); each line must hold one JSON object"
    )
    bad_third = tmp_path / "bad_third.jsonl"
    bad_third.write_text('{"text": "a"}\n{"text": "b"}\n["text"]\n')
    assert check_data(str(bad_third), "sft", "d") == (  # validate reads every row
        f"{bad_third} line 3 is not a JSON object (a JSON list); "
        "each row must be one JSON object of named columns"
    )
    with pytest.raises(DataError, match=r"^d: .*bad_third\.jsonl line 3 is a JSON list; each line must be"):
        load_data(str(bad_third), "sft", "d")


def test_empty_and_unreadable_files_are_errors(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert check_data(str(empty), "sft", "d") == f"{empty} has no rows"
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    assert check_data(str(binary), "sft", "d") == f"{binary} is not UTF-8 text"
    not_parquet = tmp_path / "rows.parquet"
    not_parquet.write_text("text\n")
    assert check_data(str(not_parquet), "sft", "d").startswith(f"{not_parquet} cannot be read")
    text = tmp_path / "rows.txt"  # .csv and .tsv are read since issue 27 (tests/test_csv.py)
    text.write_text("text\nhi\n")
    assert "is not a format align reads" in check_data(str(text), "sft", "d")
