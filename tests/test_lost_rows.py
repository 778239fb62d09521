"""Rows lost to the cut stop the stage before its model loads (issue 34): pairs identical after it, and
conversations whose last answer it cuts, counted apart from the rows it empties; and what carries loss in
SFT rows is decided once (assistant turns only by default, tool results and the tools schema never)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from align.data.lengths import length_report
from align.data.loss_scope import ASSISTANT_TURNS, sft_loss_scope
from align.errors import StageFailed
from align.planning.hardware import Hardware
from tests.pipelines import QUIET_TRL, run_in_process, write_pipeline
from tests.test_tool_rows import TOOLS, tool_row

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
STEM = " ".join(["the quick brown fox jumps over a lazy dog"] * 8)


def write_rows(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def stopped(tmp_path: Path, stage: dict) -> str:
    """The message the stage stops with, run in this process (no Ray); it stops before the model loads."""
    path = write_pipeline(tmp_path, "lost", {"s": stage})
    with pytest.raises(StageFailed) as refused:
        run_in_process(path, "s", tmp_path / "out", CPU)
    assert not (tmp_path / "out" / "checkpoints").exists()
    return str(refused.value)


def test_dpo_pairs_identical_after_the_cut_stop_the_stage_with_their_count(tmp_path: Path) -> None:
    late = [{"prompt": f"Q{i}:", "chosen": f" {STEM} yes", "rejected": f" {STEM} no"} for i in range(20)]
    early = [{"prompt": f"Q{i}:", "chosen": " yes", "rejected": " no"} for i in range(20)]
    data = write_rows(tmp_path / "pairs.jsonl", late + early)
    stage = {"kind": "dpo", "data": {"train": data, "eval": "none"}, "trl": {**QUIET_TRL, "max_length": 64}}
    message = stopped(tmp_path, stage)
    assert "stages.s: at trl.max_length 64, 20 of 40 pairs (50.0%) are identical after it" in message
    assert "above data.max_emptied_share 0.01" in message and "drop those rows" in message


def test_conversations_whose_answers_are_cut_stop_the_stage_with_their_count(tmp_path: Path) -> None:
    rows = [
        {"messages": [{"role": "user", "content": f"Say it {i}"}, {"role": "assistant", "content": STEM}]}
        for i in range(30)
    ]
    data = write_rows(tmp_path / "chat.jsonl", rows)
    stage = {"kind": "sft", "data": {"train": data, "eval": "none"}, "trl": {**QUIET_TRL, "max_length": 32}}
    message = stopped(tmp_path, stage)
    assert "30 of 30 rows (100.0%) lose their last answer, wholly or in part" in message, message
    assert "keep no loss-bearing token" not in message  # each keeps the start of its answer


def labels_table(rows: list[list[int]], column: str = "messages") -> pa.Table:
    return pa.table({"labels": rows, column: ["x"] * len(rows)})


def test_answers_cut_are_counted_apart_from_rows_emptied_and_go_into_the_record() -> None:
    """-100 is a masked token; keep_start at 4: row 0 keeps its answer whole, row 1 loses half of it, row 2
    loses all of it (emptied), row 3 loses only its second answer."""
    rows = [[-100, 5, 6, -100], [-100, -100, 5, 6, 7, 8], [-100] * 5 + [5], [5, -100, -100, -100, 6, 7]]
    report = length_report(labels_table(rows), "sft", 4)
    assert (report.emptied, report.answers_cut, report.keeps_answers) == (1, 2, 6)
    assert report.metrics()["data_answers_cut"] == 2.0
    ends = length_report(labels_table(rows), "sft", 4, "keep_end")  # keeps each row's last 4 tokens
    assert (ends.emptied, ends.answers_cut) == (0, 0)
    assert length_report(labels_table(rows, "text"), "sft", 4).answers_cut == 0  # text is only shorter


@pytest.mark.parametrize(
    ("trl", "form", "markable", "tools", "only", "words"),
    [
        ({}, "messages", True, 3, True, ASSISTANT_TURNS),
        (
            {"assistant_only_loss": False},
            "messages",
            True,
            0,
            False,
            "every token (assistant_only_loss: false)",
        ),
        ({}, "messages", False, 0, False, "every token (the chat template mine.jinja has no"),
        ({}, "prompt", None, 0, False, "the completion only (the prompt masked)"),
        ({}, "text", True, 0, False, "every token (text rows)"),
        ({}, "conversational prompt", False, 2, False, "the completion (the prompt masked; the chat"),
    ],
)
def test_what_carries_loss_is_decided_from_the_block_the_rows_and_the_template(
    trl, form, markable, tools, only, words
) -> None:
    scope = sft_loss_scope(trl, form, markable, tools, "mine.jinja")
    assert scope.assistant_only is only and scope.words.startswith(words) and scope.problem is None


def test_tool_rows_that_would_carry_loss_are_refused() -> None:
    opted_out = sft_loss_scope({"assistant_only_loss": False}, "messages", True, 5, "chatml-tools")
    assert opted_out.problem.startswith("5 rows hold tool results or a tools schema, which would carry loss")
    assert "drop assistant_only_loss: false" in opted_out.problem
    unmarked = sft_loss_scope({}, "messages", False, 5, "mine.jinja")
    assert "set `chat_template: chatml-tools`" in unmarked.problem


def test_by_default_tool_results_and_the_schema_carry_no_loss_and_the_answers_do(tmp_path: Path) -> None:
    """A tool-call conversation prepared with the stage's own settings (as `align data` and the trainer
    prepare it): the assistant's call and answer bear loss, the tool result and the schema none; with
    `assistant_only_loss: false` on plain conversations every token does."""
    from align.pipeline.file import load
    from align.planning.plan import build
    from align.report.rows_view import preview

    data = write_rows(tmp_path / "tools.jsonl", [tool_row(i) for i in range(4)])
    trl = {**QUIET_TRL, "max_length": 512}
    stage = {
        "kind": "sft",
        "chat_template": "chatml-tools",
        "data": {"train": data, "eval": "none"},
        "trl": trl,
    }
    path = write_pipeline(tmp_path, "tools", {"s": stage})
    shown = preview(build(load(path), CPU), "s", 1, colour=False)
    assert f"loss: {ASSISTANT_TURNS}" in shown.notes and shown.problem is None
    row = shown.rows[0]
    trained = " ".join(row[row.index("[[", at) + 2 : row.index("]]", at)] for at in find_all(row, "[["))
    assert '"name": "get_weather"' in trained and "It is 10 degrees in Paris." in trained
    assert "temp_c" not in trained and "The weather now in a city" not in trained and "user" not in trained
    assert json.dumps(TOOLS[0]["function"]["description"]) in row  # the schema is there, unmarked

    messages = tool_row(0)["messages"]
    plain = write_rows(tmp_path / "plain.jsonl", [{"messages": [messages[1], messages[4]]}] * 4)
    stage["data"]["train"], stage["trl"]["assistant_only_loss"] = plain, False
    path = write_pipeline(tmp_path, "plain", {"s": stage})
    shown = preview(build(load(path), CPU), "s", 1, colour=False)
    assert shown.rows[0].count("[[") == 1 and "[[<|im_start|>user" in shown.rows[0], shown.rows[0]


def find_all(text: str, needle: str) -> list[int]:
    found, at = [], text.find(needle)
    while at != -1:
        found.append(at)
        at = text.find(needle, at + 1)
    return found


def test_a_mixture_that_leaves_most_rows_unused_says_so_at_plan_and_counts_them_at_the_start(
    tmp_path: Path,
) -> None:
    """Sources of 300, 100 and 3 rows at weights 0.5/0.3/0.2 until the first runs out: a few rows train."""
    from align.data.mixtures import stage_rows
    from align.pipeline.file import load
    from align.planning.plan import build
    from align.report.console import format_plan

    sources = []
    for name, count, weight in (("big", 300, 0.5), ("mid", 100, 0.3), ("small", 3, 0.2)):
        turns = [
            [{"role": "user", "content": f"{name} {i}"}, {"role": "assistant", "content": "ok"}]
            for i in range(count)
        ]
        data = write_rows(tmp_path / f"{name}.jsonl", [{"messages": messages} for messages in turns])
        sources.append({"path": data, "weight": weight})
    stage = {"kind": "sft", "data": {"train": sources}, "trl": {**QUIET_TRL}}
    plan = build(load(write_pipeline(tmp_path, "mix", {"s": stage})), CPU)
    said = format_plan(plan)
    assert "the mixture uses about 15 of its 383 rows and leaves 368 unused" in said, said
    assert "small.jsonl 3 of 3" in said and "`mix: all_exhausted`" in said and "`rows:`" in said

    found = stage_rows(plan.stages["s"].stage.data, "sft", 0, "stages.s")
    used = sum(found.mixed.values())
    assert found.offered == {"big.jsonl": 285, "mid.jsonl": 95, "small.jsonl": 3}
    assert used == len(found.train) < 383 / 2 and found.mixed["small.jsonl"] == 3
    assert found.unused_note().startswith(f"the mixture uses {used} of its 383 rows")
    assert found.mixture_counts()["data_mix_used[small.jsonl]"] == 3.0
