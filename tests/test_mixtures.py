"""Mixtures: `data.train` as a list of sources, each with a weight or a count of rows and its own renames,
checked at validate, shown by `align plan`, fingerprinted source by source, held out source by source, and
mixed by `datasets` with the source of every training row known."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

from align.config.spec import DataSpec
from align.data.mixtures import stage_rows
from align.errors import ConfigError
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.launch import launch_of
from align.planning.plan import build
from align.report.console import format_plan
from align.run.inputs import fingerprint, resolve_inputs
from pipelines import QUIET_TRL, run, stage_record, write_pipeline

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
RENAMES = {"question": "prompt", "answer": "completion"}


def texts(path: Path, count: int, start: int = 0) -> str:
    """A jsonl file of `count` prompt/completion rows."""
    rows = [{"prompt": f"Say {i}", "completion": f"{i} said"} for i in range(start, start + count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def questions(path: Path, count: int) -> str:
    """A CSV file of `count` question/answer rows."""
    with path.open("w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["question", "answer"])
        writer.writerows([f"What is {i}+{i}?", str(2 * i)] for i in range(count))
    return str(path)


def mixture(tmp_path: Path, a: dict, b: dict, **data: object) -> dict:
    """An SFT stage on two sources: `a` over a jsonl file, `b` over a CSV whose columns it renames."""
    first = {"path": texts(tmp_path / "a.jsonl", 1500), **a}
    second = {"path": questions(tmp_path / "b.csv", 1500), "columns": RENAMES, **b}
    trl = {**QUIET_TRL, "max_steps": 3, "per_device_train_batch_size": 4}
    return {"kind": "sft", "data": {"train": [first, second], **data}, "trl": trl}


def problems(tmp_path: Path, stage: dict) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        load(write_pipeline(tmp_path, "mix", {"sft": stage}))
    return [str(problem) for problem in raised.value.problems]


def test_shares_are_all_weights_all_rows_or_none(tmp_path: Path) -> None:
    assert problems(tmp_path, mixture(tmp_path, {"weight": 0.8}, {"rows": 10})) == [
        "stages.sft.data.train[1].rows: this source has a `rows` and train[0] a `weight`: give every source "
        "a `weight` (each row's source drawn at those odds), or every source `rows` (that many from each), "
        "or none (every row of each)"
    ]
    assert problems(tmp_path, mixture(tmp_path, {"weight": 0.8}, {}))[0].startswith(
        "stages.sft.data.train[1].weight: this source has no weight or rows and train[0] a `weight`"
    )
    assert problems(tmp_path, mixture(tmp_path, {"weight": 0.8}, {"weight": 0})) == [
        "stages.sft.data.train[1].weight: input should be greater than 0 (got 0)"
    ]
    assert problems(tmp_path, mixture(tmp_path, {}, {"weight": 1, "rows": 5})) == [
        "stages.sft.data.train[1].rows: value error, give this source a `weight` or a count of `rows`, not "
        "both (got 5)"
    ]
    assert problems(tmp_path, mixture(tmp_path, {"rows": 5}, {"rows": 5}, mix="all_exhausted"))[0].startswith(
        "stages.sft.data.mix: only sources with a `weight` are interleaved"
    )
    assert problems(tmp_path, mixture(tmp_path, {"rows": 1490}, {"rows": 10})) == [
        "stages.sft.data.train[0].rows: asks for 1490 rows and a.jsonl has 1500, 64 of them held out (no "
        "eval split given); lower `rows`, or give it more rows"
    ]


def test_sources_of_formats_that_cannot_be_mixed_are_refused_naming_both(tmp_path: Path) -> None:
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    stage = mixture(tmp_path, {}, {})
    stage["data"]["train"][0]["path"] = str(chats)
    assert problems(tmp_path, stage) == [
        "stages.sft.data.train[1]: b.csv holds prompt+completion as text rows and chats.jsonl (train[0]) "
        "holds messages: the sources of one mixture must share one format (TRL reads one per dataset); "
        "convert one, or rename its columns with its own `columns:`"
    ]
    stage["data"]["train"][0]["path"] = str(tmp_path / "a.jsonl")
    stage["data"]["train"][1]["columns"] = {"question": "prompt"}  # its own renames, checked as its own
    assert problems(tmp_path, stage)[0].startswith("stages.sft.data.train[1].columns: after renaming, ")


def test_a_weighted_mix_holds_its_weights_and_each_source_gives_its_own_held_out_rows(tmp_path: Path) -> None:
    data = DataSpec.model_validate(mixture(tmp_path, {"weight": 0.8}, {"weight": 0.2})["data"])
    rows = stage_rows(data, "sft", 0, "stages.sft")
    shares = Counter(rows.sources)
    assert len(rows.sources) == len(rows.train) and sum(shares.values()) == len(rows.train)
    assert abs(shares["a.jsonl"] / len(rows.train) - 0.8) < 0.02
    assert [row["prompt"].startswith("What") for row in rows.train] == [s == "b.csv" for s in rows.sources]
    held = [row["prompt"] for row in rows.held_out]
    assert sum(p.startswith("Say") for p in held) == sum(p.startswith("What") for p in held) == 64
    assert not set(held) & set(rows.train["prompt"])


def test_max_eval_rows_limits_the_slice_held_out_of_train_too(tmp_path: Path) -> None:
    """A recipe's GRPO stage asked for 32 held-out prompts with no eval split, and measured its whole 5%."""
    data = DataSpec.model_validate({"train": texts(tmp_path / "a.jsonl", 1500), "max_eval_rows": 8})
    rows = stage_rows(data, "sft", 0, "stages.sft")
    assert len(rows.held_out) == 8 and len(rows.train) == 1500 - 64  # the whole slice still kept out
    assert not set(rows.held_out["prompt"]) & set(rows.train["prompt"])
    stage = {**mixture(tmp_path, {}, {}), "data": data.model_dump(exclude_defaults=True)}
    text = format_plan(build(load(write_pipeline(tmp_path, "slice", {"sft": stage})), CPU))
    said = "held out: a seeded 5% of the training rows (at most 64), kept out of training (no eval split"
    assert f"    {said} given); the first 8 measured\n" in text


def test_counted_rows_are_drawn_from_each_and_shuffled_together(tmp_path: Path) -> None:
    data = DataSpec.model_validate(mixture(tmp_path, {"rows": 30}, {"rows": 20}, eval="none")["data"])
    rows = stage_rows(data, "sft", 0, "stages.sft")
    assert Counter(rows.sources) == {"a.jsonl": 30, "b.csv": 20} and rows.held_out is None
    assert rows.sources[:30] != ["a.jsonl"] * 30  # shuffled, not one source after the other
    again = stage_rows(data, "sft", 0, "stages.sft")
    assert again.train["prompt"] == rows.train["prompt"]  # seeded
    assert stage_rows(data, "sft", 1, "stages.sft").train["prompt"] != rows.train["prompt"]


def test_the_plan_shows_each_sources_rows_and_share(tmp_path: Path) -> None:
    pipeline = load(write_pipeline(tmp_path, "mix", {"sft": mixture(tmp_path, {"weight": 3}, {"weight": 1})}))
    text = format_plan(build(pipeline, CPU))
    assert "    held out: a seeded 5% of each source's rows (at most 64 each)" in text
    assert (
        "    data: 2 sources, mixed at their weights until the first runs out (mix: first_exhausted): "
        "about 1,915 rows\n"
        "      train[0] a.jsonl: 1,500 rows; weight 3, 75% of the mix\n"
        "      train[1] b.csv: 1,500 rows; weight 1, 25% of the mix; columns question -> prompt, answer -> "
        "completion\n"
    ) in text


def test_the_fingerprint_covers_each_sources_weight_and_bytes(tmp_path: Path) -> None:
    def stamp(stage: dict) -> str:
        plan = build(load(write_pipeline(tmp_path, "mix", {"sft": stage})), CPU).stages["sft"]
        return fingerprint(launch_of(plan, resolve_inputs(plan, {})), {})

    first = stamp(mixture(tmp_path, {"weight": 0.8}, {"weight": 0.2}))
    assert stamp(mixture(tmp_path, {"weight": 0.8}, {"weight": 0.2})) == first
    assert stamp(mixture(tmp_path, {"weight": 0.7}, {"weight": 0.2})) != first
    stage = mixture(tmp_path, {"weight": 0.8}, {"weight": 0.2})
    with open(stage["data"]["train"][1]["path"], "a") as file:
        file.write("What is 1+2?,3\n")
    assert stamp(stage) != first


@pytest.mark.integration
def test_a_mixture_of_a_jsonl_and_a_csv_trains_at_its_weights(tmp_path: Path) -> None:
    """One short SFT stage through `align run`: the worker prepares the rows `stage_rows` mixes here."""
    stage = mixture(tmp_path, {"weight": 0.8}, {"weight": 0.2})
    path = write_pipeline(tmp_path, "mix", {"sft": stage})
    done = run(path)
    rows = stage_rows(load(path).stages["sft"].data, "sft", 0, "stages.sft")
    assert f"preparing {len(rows.train):,} training rows" in done.stdout + done.stderr
    shares = Counter(rows.sources)
    assert abs(shares["a.jsonl"] / len(rows.train) - 0.8) < 0.02
    assert abs(shares["b.csv"] / len(rows.train) - 0.2) < 0.02
    assert stage_record(path, "sft")["status"] == "succeeded"


TOOL_ROW = {
    "messages": [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
            ],
        },
        {"role": "tool", "content": '{"temp_c": 3}'},
        {"role": "assistant", "content": "3 degrees."},
    ],
    "tools": json.dumps([{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]),
}
CHAT_ROW = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]}


@pytest.mark.parametrize("tools_first", [True, False])
def test_a_column_or_field_one_source_lacks_is_kept_for_the_rows_that_have_it(
    tmp_path: Path, tools_first
) -> None:
    """Mixing tool rows with plain chats kept only the columns both had: the `tools` schema went, silently
    (and with the chats first, the tool calls could not be mixed at all)."""
    tools, chats = tmp_path / "tools.jsonl", tmp_path / "chats.jsonl"
    tools.write_text(json.dumps(TOOL_ROW) + "\n" * 1)
    chats.write_text((json.dumps(CHAT_ROW) + "\n") * 3)
    sources = [{"path": str(tools), "rows": 1}, {"path": str(chats), "rows": 3}]
    data = DataSpec(train=sources if tools_first else sources[::-1], eval="none")
    rows = stage_rows(data, "sft", 0, "stages.sft")
    by_source = dict(zip(rows.sources, rows.train, strict=True))
    tool_row = by_source["tools.jsonl"]
    assert json.loads(tool_row["tools"])[0]["function"]["name"] == "get_weather"
    call = tool_row["messages"][1]["tool_calls"][0]["function"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"]) == {"city": "Oslo"}
    chat = [row for source, row in zip(rows.sources, rows.train, strict=True) if source == "chats.jsonl"][0]
    assert chat["tools"] is None and [turn["content"] for turn in chat["messages"]] == ["Hi", "Hello!"]
