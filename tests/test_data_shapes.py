"""The dataset shapes people bring (ShareGPT, Alpaca, ultrafeedback-style preference pairs) and
`data.columns`: each conversion row by row with its exact output, each refusal naming its field and place,
the same rows read by the validate-time scan and by the training-time load, and the plan saying what it
does."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from datasets import Dataset

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from align.cli import main  # noqa: E402
from align.config.spec import DataSpec  # noqa: E402
from align.data.loading import load_data  # noqa: E402
from align.data.scan import check_data, data_shape  # noqa: E402
from align.data.shapes import Normalizer, RowProblem, detect, suggest_columns  # noqa: E402
from align.errors import DataError  # noqa: E402


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def bot(text: str) -> dict:
    return {"role": "assistant", "content": text}


SHAREGPT = {
    "id": "chat-1",
    "conversations": [
        {"from": "system", "value": "Be brief."},
        {"from": "human", "value": "Hi"},
        {"from": "gpt", "value": "Hello!"},
        {"from": "human", "value": "Who are you?"},
        {"from": "gpt", "value": "A bot."},
    ],
}
ALPACA = {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"}
ULTRAFEEDBACK = {
    "prompt": "Hi",
    "prompt_id": "abc123",
    "chosen": [user("Hi"), bot("Hello!")],
    "rejected": [user("Hi"), bot("Go away.")],
    "messages": [user("Hi"), bot("Hello!")],
    "score_chosen": 8.5,
    "score_rejected": 2.0,
}


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ALIGN_CACHE", str(tmp_path / "cache"))


def jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def convert(row: dict, columns: dict | None = None) -> dict:
    return Normalizer(columns)(row)


# ShareGPT


def test_sharegpt_conversations_become_messages_with_chat_roles() -> None:
    assert convert(SHAREGPT) == {
        "id": "chat-1",
        "messages": [
            {"role": "system", "content": "Be brief."},
            user("Hi"),
            bot("Hello!"),
            user("Who are you?"),
            bot("A bot."),
        ],
    }


def test_sharegpt_system_column_and_messages_of_from_value() -> None:
    row = {
        "system": "Be kind.",
        "messages": [{"from": "user", "value": "Hi"}, {"from": "assistant", "value": "Yo"}],
    }
    assert convert(row) == {"messages": [{"role": "system", "content": "Be kind."}, user("Hi"), bot("Yo")]}


def test_sharegpt_unknown_speaker_is_refused_with_its_value() -> None:
    row = {"conversations": [{"from": "narrator", "value": "Once"}, {"from": "gpt", "value": "upon"}]}
    with pytest.raises(RowProblem) as caught:
        convert(row)
    assert str(caught.value).startswith(
        "has a 'conversations' turn from an unknown speaker (from: 'narrator'); a turn's `from` is one of: "
        "human, user, gpt"
    )


def test_sharegpt_scan_names_the_line_of_a_bad_turn(tmp_path: Path) -> None:
    empty_turn = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": " "}]}
    data = jsonl(tmp_path / "chats.jsonl", [SHAREGPT, SHAREGPT, empty_turn])
    assert check_data(data, "sft", "d") == (
        f"{data} line 3 has a 'conversations' turn with no text in `value`; fill in or drop the empty turns"
    )
    assert check_data(jsonl(tmp_path / "ok.jsonl", [SHAREGPT, SHAREGPT]), "sft", "d") is None


# Alpaca


def test_alpaca_becomes_conversational_prompt_and_completion() -> None:
    assert convert(ALPACA) == {"prompt": [user("Add the numbers.\n\n2 and 3")], "completion": [bot("5")]}
    formatted = "Below is an instruction...\n\n### Instruction:\nSay hi.\n\n### Response:\nHi"
    assert convert(
        {"instruction": "Say hi.", "input": "", "output": "Hi", "source": "x", "text": formatted}
    ) == {
        "source": "x",
        "prompt": [user("Say hi.")],
        "completion": [bot("Hi")],
    }


def test_alpaca_system_and_history_come_before_the_instruction() -> None:
    row = {**ALPACA, "system": "You add.", "history": [["1 and 1?", "2"]]}
    assert convert(row) == {
        "prompt": [
            {"role": "system", "content": "You add."},
            user("1 and 1?"),
            bot("2"),
            user(ALPACA["instruction"] + "\n\n2 and 3"),
        ],
        "completion": [bot("5")],
    }


def test_alpaca_scan_names_the_line_without_an_output(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "alpaca.jsonl", [ALPACA, {"instruction": "Say hi.", "output": ""}])
    assert check_data(data, "sft", "d") == (
        f"{data} line 2 has no text in 'output'; an Alpaca row holds text in `instruction` and `output` "
        "(and optionally `input`)"
    )


# ultrafeedback-style preference pairs


def test_preference_conversations_become_explicit_prompt_chosen_rejected() -> None:
    assert convert(ULTRAFEEDBACK) == {
        "prompt": [user("Hi")],
        "prompt_id": "abc123",
        "chosen": [bot("Hello!")],
        "rejected": [bot("Go away.")],
        "messages": [user("Hi"), bot("Hello!")],
        "score_chosen": 8.5,
        "score_rejected": 2.0,
    }


def test_preference_conversations_keep_a_shared_system_turn_in_the_prompt() -> None:
    system = {"role": "system", "content": "Be kind."}
    row = {
        "prompt": "Hi",
        "chosen": [system, user("Hi"), bot("Hello!")],
        "rejected": [system, user("Hi"), bot("No.")],
    }
    assert convert(row) == {
        "prompt": [system, user("Hi")],
        "chosen": [bot("Hello!")],
        "rejected": [bot("No.")],
    }


@pytest.mark.parametrize(
    ("row", "wording"),
    [
        (
            {**ULTRAFEEDBACK, "prompt": "Hello there"},
            "has a 'prompt' that is not the user turn 'chosen' and 'rejected' share",
        ),
        (
            {**ULTRAFEEDBACK, "rejected": [user("Bye"), bot("Go away.")]},
            "has 'chosen' and 'rejected' that do not start with the same user turn",
        ),
        (
            {**ULTRAFEEDBACK, "chosen": [user("Hi")], "rejected": [user("Hi"), bot("No")]},
            "has a 'chosen' or 'rejected' that does not end with an assistant reply",
        ),
    ],
    ids=["prompt differs", "turns differ", "no reply"],
)
def test_preference_rows_whose_turns_do_not_match_are_refused_by_file_and_line(
    tmp_path: Path, row: dict, wording: str
) -> None:
    data = jsonl(tmp_path / "prefs.jsonl", [ULTRAFEEDBACK, row])
    assert check_data(data, "preferences", "d") == (
        f"{data} line 2 {wording}; 'chosen' and 'rejected' each repeat the prompt's turns (the last one the "
        "user's `prompt`), then differ in the assistant's reply"
    )


def test_ultrafeedback_rows_with_extra_columns_pass_the_scan(tmp_path: Path) -> None:
    """They used to fail with 'rows mix text and lists of messages'."""
    data = jsonl(tmp_path / "prefs.jsonl", [ULTRAFEEDBACK, ULTRAFEEDBACK])
    assert check_data(data, "preferences", "d") is None
    assert check_data(data, "unpaired", "d") is None  # KTO unpairs them afterwards


# data.columns


def test_columns_rename_before_anything_reads_the_row() -> None:
    columns = {"question": "prompt", "answer": "completion"}
    assert convert({"question": "Hi", "answer": "Hello!", "n": 1}, columns) == {
        "prompt": "Hi",
        "completion": "Hello!",
        "n": 1,
    }
    # a rename can lead into a known shape: it is converted after
    assert convert({"dialog": SHAREGPT["conversations"][1:3]}, {"dialog": "conversations"}) == {
        "messages": [user("Hi"), bot("Hello!")]
    }


def test_columns_that_are_absent_or_clash_are_refused() -> None:
    with pytest.raises(RowProblem, match=r"^lacks 'question', which data.columns renames"):
        convert({"prompt": "Hi"}, {"question": "prompt"})
    with pytest.raises(
        RowProblem, match=r"^already has 'prompt', which data.columns renames another column to"
    ):
        convert({"prompt": "Hi", "question": "Hi?"}, {"question": "prompt"})


def test_columns_block_refuses_two_columns_renamed_to_one_name() -> None:
    with pytest.raises(ValueError, match="several columns are renamed to 'prompt'"):
        DataSpec(train="x.jsonl", columns={"question": "prompt", "query": "prompt"})
    assert "columns" not in DataSpec(train="x.jsonl").model_dump()  # old stage fingerprints stay the same


def test_scan_suggests_the_mapping_when_a_known_shape_is_near(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "qa.jsonl", [{"question": "Hi", "response": "Hello!"}])
    assert check_data(data, "sft", "d") == (
        f"{data} lacks column 'messages' that sft data needs (it has: question, response); "
        "expected one of: messages, text, prompt+completion; if they are named otherwise, rename them: "
        "data: {columns: {question: prompt, response: completion}}"
    )
    assert check_data(data, "sft", "d", {"question": "prompt", "response": "completion"}) is None
    prefs = ["prompt", "chosen_response", "rejected_response"]
    assert suggest_columns(prefs, [("prompt", "chosen", "rejected")]) == (
        "data: {columns: {chosen_response: chosen, rejected_response: rejected}}"
    )
    assert suggest_columns(["id", "body_html"], [("prompt", "completion")]) is None


def validate(
    capsys: pytest.CaptureFixture[str], folder: Path, data: dict, kind: str = "sft"
) -> tuple[int, str]:
    path = folder / "pipeline.yaml"
    stages = {"train": {"kind": kind, "data": data}}
    path.write_text(yaml.safe_dump({"name": "shapes", "base_model": "tiny", "stages": stages}))
    code = main(["validate", str(path)])
    return code, capsys.readouterr().err


def test_validate_names_data_columns_for_a_bad_mapping(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    data = jsonl(tmp_path / "qa.jsonl", [{"question": "Hi", "response": "Hello!"}])
    code, err = validate(
        capsys, tmp_path, {"train": data, "columns": {"query": "prompt", "response": "completion"}}
    )
    assert code == 2
    assert (
        f"stages.train.data.columns: {data}: its first row lacks 'query', which data.columns renames; "
        "data.columns maps a column the file has to the name align reads; it has: question, response"
    ) in err
    code, err = validate(capsys, tmp_path, {"train": data, "columns": {"question": "prompt"}})
    assert code == 2
    assert f"stages.train.data.columns: after renaming, {data} lacks column 'completion'" in err
    code, _ = validate(
        capsys, tmp_path, {"train": data, "columns": {"question": "prompt", "response": "completion"}}
    )
    assert code == 0


# the training-time load: the same conversion, through real `datasets`


def test_load_converts_each_shape_as_the_scan_does(tmp_path: Path) -> None:
    sharegpt = load_data(jsonl(tmp_path / "chats.jsonl", [SHAREGPT]), "sft", "d")
    assert sharegpt.column_names == ["id", "messages"] and sharegpt[0] == convert(SHAREGPT)
    parquet = tmp_path / "alpaca.parquet"
    Dataset.from_list([ALPACA, {**ALPACA, "input": ""}]).to_parquet(parquet)
    alpaca = load_data(str(parquet), "sft", "d")
    assert sorted(alpaca.column_names) == ["completion", "prompt"]
    assert list(alpaca) == [convert(ALPACA), convert({**ALPACA, "input": ""})]
    prefs = load_data(jsonl(tmp_path / "prefs.jsonl", [ULTRAFEEDBACK]), "preferences", "d")
    assert prefs[0] == convert(ULTRAFEEDBACK)
    renamed = load_data(
        jsonl(tmp_path / "qa.jsonl", [{"question": "Hi", "answer": "Hello!"}]),
        "sft",
        "d",
        {"question": "prompt", "answer": "completion"},
    )
    assert list(renamed) == [{"prompt": "Hi", "completion": "Hello!"}]


def test_load_refuses_a_bad_row_naming_the_field_and_row(tmp_path: Path) -> None:
    data = jsonl(tmp_path / "prefs.jsonl", [ULTRAFEEDBACK, {**ULTRAFEEDBACK, "prompt": "Other"}])
    with pytest.raises(DataError) as caught:
        load_data(data, "preferences", "stages.dpo.data.train")
    assert str(caught.value).startswith(
        f"stages.dpo.data.train: {data} row 1 has a 'prompt' that is not the user turn 'chosen' and "
        "'rejected' share"
    )


def test_trl_formats_are_left_as_they_are(tmp_path: Path) -> None:
    for row in ({"messages": [user("Hi"), bot("Yo")]}, {"prompt": "Hi", "completion": "Yo"}, {"text": "Hi"}):
        assert detect(row) is None
    data = jsonl(tmp_path / "chat.jsonl", [{"messages": [user("Hi"), bot("Yo")]}])
    assert data_shape(data, None) is None


# align plan


def test_plan_says_which_conversion_applies(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    stages = {
        "sharegpt": {"kind": "sft", "data": {"train": jsonl(tmp_path / "chats.jsonl", [SHAREGPT])}},
        "alpaca": {"kind": "sft", "data": {"train": jsonl(tmp_path / "alpaca.jsonl", [ALPACA])}},
        "prefs": {"kind": "dpo", "data": {"train": jsonl(tmp_path / "prefs.jsonl", [ULTRAFEEDBACK])}},
        "renamed": {
            "kind": "sft",
            "data": {
                "train": jsonl(tmp_path / "qa.jsonl", [{"question": "Hi", "answer": "Yo"}]),
                "columns": {"question": "prompt", "answer": "completion"},
            },
        },
    }
    path = tmp_path / "pipeline.yaml"
    body = {"name": "shapes", "base_model": "tiny", "stages": stages}
    path.write_text(yaml.safe_dump(body, sort_keys=False))  # the renames in the order written
    assert main(["plan", str(path)]) == 0
    shown, stage = {}, None
    for line in capsys.readouterr().out.splitlines():
        if line[:1].isdigit():
            stage = line.split()[1]  # `1. sharegpt  kind=sft ...`
        elif line.strip().startswith("data:"):
            shown[stage] = line.strip()
    assert shown == {
        "sharegpt": "data: sharegpt -> conversational messages (conversations: from/value)",
        "alpaca": "data: alpaca -> conversational prompt/completion (instruction/input/output)",
        "prefs": "data: preference conversations -> conversational prompt/chosen/rejected "
        "(prompt text, chosen/rejected repeating it)",
        "renamed": "data: columns question -> prompt, answer -> completion",
    }
