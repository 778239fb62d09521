"""Data files that cannot mean what they say: broken rows, missing columns, empty files, unknown roles, eval
rows that are trained on, pairs with nothing between them, uncached hub datasets, mixtures that cannot mix,
files that cannot be read; and `align data` asked for a count of rows that is not one."""

import json

from tests.bad_inputs import Case, pipeline


def jsonl(*rows: object) -> str:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)


def chat(user: str, answer: str = "Hello", role: str = "user") -> dict:
    return {"messages": [{"role": role, "content": user}, {"role": "assistant", "content": answer}]}


def pair(prompt: str, chosen: str, rejected: str) -> dict:
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def stage(kind: str, data: str) -> str:
    """One stage `s` of `kind` reading `data` (a YAML flow mapping's inside)."""
    return pipeline(f"s:\n  kind: {kind}\n  data: {{{data}}}\n")


SFT = stage("sft", "train: rows.jsonl")
DPO = stage("dpo", "train: rows.jsonl")
WITH_EVAL = stage("sft", "train: rows.jsonl, eval: held.jsonl")
ROWS = [chat(f"Hi {index}") for index in range(6)]
TOOL = {"name": "get_weather", "arguments": "{}"}

CASES = [
    Case(
        "data-bad-json-line",
        pipeline=SFT,
        files={"rows.jsonl": jsonl(chat("Hi"), '{"messages": [')},
        expect=("stages.s.data.train", "rows.jsonl line 2 is not valid JSON"),
    ),
    Case(
        "data-row-not-an-object",
        pipeline=SFT,
        files={"rows.jsonl": jsonl(chat("Hi"), "[1, 2]")},
        expect=("stages.s.data.train", "line 2 is not a JSON object"),
    ),
    Case(
        "data-missing-columns",
        pipeline=SFT,
        files={"rows.jsonl": jsonl({"question": "Hi", "reply": "Hello"})},
        expect=("stages.s.data.train", "rows.jsonl", "question"),
    ),
    Case(
        "data-pairs-lack-rejected",
        pipeline=DPO,
        files={"rows.jsonl": jsonl(pair("Q", "a", "b"), {"prompt": "Q", "chosen": "a"})},
        expect=("stages.s.data.train", "line 2 lacks 'rejected'"),
    ),
    Case(
        "data-empty-file",
        pipeline=SFT,
        files={"rows.jsonl": ""},
        expect=("stages.s.data.train", "rows.jsonl has no rows"),
    ),
    Case(
        "data-only-blank-lines",
        pipeline=SFT,
        files={"rows.jsonl": "\n\n  \n"},
        expect=("stages.s.data.train", "has no rows"),
    ),
    Case(
        "data-empty-text",
        pipeline=SFT,
        files={"rows.jsonl": jsonl({"text": "fine"}, {"text": "  "})},
        expect=("stages.s.data.train", "line 2 has an empty 'text'"),
    ),
    Case(
        "data-unknown-role",
        pipeline=SFT,
        files={"rows.jsonl": jsonl(chat("Hi"), chat("beep", role="robot"))},
        expect=(
            "stages.s.data.train",
            "line 2 has a message with role 'robot'",
            "system, user, assistant, tool",
        ),
    ),
    Case(
        "data-unknown-roles-counted",
        pipeline=SFT,
        files={"rows.jsonl": jsonl(*[chat(f"Hi {i}", role="human") for i in range(5)])},
        expect=("5 of 5 rows have messages with role 'human': lines 1, 2, 3 and 2 more",),
    ),
    Case(
        "data-text-beside-messages",
        pipeline=DPO,
        files={
            "rows.jsonl": jsonl(
                pair("Q", "a", "b"),
                {"prompt": "Q", "chosen": [{"role": "assistant", "content": "a"}], "rejected": "b"},
            )
        },
        expect=("stages.s.data.train", "line 2 mixes text and lists of messages"),
    ),
    Case(
        "data-tool-call-without-name",
        pipeline=SFT,
        files={
            "rows.jsonl": jsonl(
                {
                    "messages": [
                        {"role": "user", "content": "Weather?"},
                        {
                            "role": "assistant",
                            "content": "",
                            "tool_calls": [{"function": {"arguments": "{}"}}],
                        },
                    ]
                }
            )
        },
        expect=("stages.s.data.train", "line 1 has a tool call with no function name"),
    ),
    Case(
        "data-tools-not-a-list",
        pipeline=SFT,
        files={"rows.jsonl": jsonl({**chat("Hi"), "tools": "[{not json"})},
        expect=("stages.s.data.train", "line 1 has a 'tools' that is not a list of function schemas"),
    ),
    Case(
        "data-eval-is-the-train-file",
        pipeline=stage("sft", "train: rows.jsonl, eval: rows.jsonl"),
        files={"rows.jsonl": jsonl(*ROWS)},
        expect=(
            "stages.s.data.eval",
            "is the file data.train reads",
            "held-out rows must never be trained on",
        ),
    ),
    Case(
        "data-eval-is-a-copy-of-train",
        pipeline=WITH_EVAL,
        files={"rows.jsonl": jsonl(*ROWS), "held.jsonl": jsonl(*ROWS)},
        expect=("stages.s.data.eval", "held.jsonl holds the same bytes as the file data.train reads"),
    ),
    Case(
        "data-eval-shares-rows-with-train",
        pipeline=WITH_EVAL,
        files={"rows.jsonl": jsonl(*ROWS), "held.jsonl": jsonl(ROWS[2], chat("new"), ROWS[4])},
        expect=("stages.s.data.eval", "2 of 3 eval rows also appear in data.train", "held.jsonl lines 1, 3"),
    ),
    Case(
        "data-eval-shares-rows-written-another-way",
        pipeline=WITH_EVAL,
        files={
            "rows.jsonl": jsonl(*ROWS),
            "held.jsonl": jsonl(
                '{"messages": [{"content": "Hi 0", "role": "user"}, '
                '{"content": "Hello", "role": "assistant"}]}',
                chat("new"),
            ),
        },
        expect=("stages.s.data.eval", "1 of 2 eval rows also appears in data.train", "held.jsonl line 1"),
    ),
    Case(
        "data-eval-shares-rows-with-a-mixture",
        pipeline=stage(
            "sft", "train: [{path: a.jsonl, weight: 1}, {path: b.jsonl, weight: 1}], eval: held.jsonl"
        ),
        files={
            "a.jsonl": jsonl(*ROWS[:3]),
            "b.jsonl": jsonl(*ROWS[3:]),
            "held.jsonl": jsonl(ROWS[0], ROWS[5]),
        },
        expect=("stages.s.data.eval", "2 of 2 eval rows also appear in data.train"),
    ),
    Case(
        "data-chosen-equals-rejected-everywhere",
        pipeline=DPO,
        files={"rows.jsonl": jsonl(*[pair(f"Q{i}", "same", "same") for i in range(4)])},
        expect=(
            "stages.s.data.train",
            "4 of 4 rows have a 'chosen' equal to their 'rejected': lines 1, 2, 3 and 1 more",
        ),
    ),
    Case(
        "data-chosen-equals-rejected-mostly",
        pipeline=DPO,
        files={"rows.jsonl": jsonl(pair("Q", "yes", "no"), *[pair(f"Q{i}", "x", "x") for i in range(3)])},
        expect=("3 of 4 rows have a 'chosen' equal to their 'rejected': lines 2, 3, 4",),
    ),
    Case(
        "data-chosen-equals-rejected-as-conversations",
        pipeline=DPO,
        files={
            "rows.jsonl": jsonl(
                *[
                    {
                        "prompt": [{"role": "user", "content": f"Q{i}"}],
                        "chosen": [{"role": "assistant", "content": "A"}],
                        "rejected": [{"role": "assistant", "content": "A"}],
                    }
                    for i in range(2)
                ]
            )
        },
        expect=("2 of 2 rows have a 'chosen' equal to their 'rejected'",),
    ),
    Case(
        "data-uncached-hub-dataset",
        argv=("data", "{pipeline}"),
        pipeline=stage("sft", "train: 'hf:nobody/nothing@train'"),
        expect=("stages.s.data.train", "hf:nobody/nothing@train is not in the local datasets cache"),
    ),
    Case(
        "data-hub-ref-of-the-wrong-form",
        pipeline=stage("sft", "train: 'hf:a/b/c@train'"),
        expect=("stages.s.data.train", "hf:a/b/c@train is not a hub ref"),
    ),
    Case(
        "data-mixture-weight-beside-rows",
        pipeline=stage("sft", "train: [{path: a.jsonl, weight: 1}, {path: b.jsonl, rows: 2}]"),
        files={"a.jsonl": jsonl(*ROWS[:3]), "b.jsonl": jsonl(*ROWS[3:])},
        expect=("stages.s.data.train[1]", "give every source a `weight`"),
    ),
    Case(
        "data-mix-without-weights",
        pipeline=stage("sft", "train: [{path: a.jsonl}, {path: b.jsonl}], mix: all_exhausted"),
        files={"a.jsonl": jsonl(*ROWS[:3]), "b.jsonl": jsonl(*ROWS[3:])},
        expect=("stages.s.data.mix", "only sources with a `weight` are interleaved"),
    ),
    Case(
        "data-mixture-asks-more-rows-than-a-source-has",
        pipeline=stage("sft", "train: [{path: a.jsonl, rows: 2}, {path: b.jsonl, rows: 9}]"),
        files={"a.jsonl": jsonl(*ROWS[:3]), "b.jsonl": jsonl(*ROWS[3:])},
        expect=("stages.s.data.train[1].rows", "asks for 9 rows and b.jsonl has 3"),
    ),
    Case(
        "data-mixture-of-two-formats",
        pipeline=stage("sft", "train: [{path: a.jsonl, weight: 1}, {path: b.jsonl, weight: 1}]"),
        files={"a.jsonl": jsonl(*ROWS[:3]), "b.jsonl": jsonl({"text": "plain"}, {"text": "text"})},
        expect=(
            "stages.s.data.train[1]",
            "b.jsonl holds text as text rows and a.jsonl (train[0]) holds messages",
        ),
    ),
    Case(
        "data-csv-without-the-columns",
        pipeline=stage("sft", "train: rows.csv"),
        files={"rows.csv": "question,reply\nHi,Hello\n"},
        expect=("stages.s.data.train", "rows.csv", "question"),
    ),
    Case(
        "data-csv-with-an-empty-cell",
        pipeline=stage("dpo", "train: rows.csv"),
        files={"rows.csv": "prompt,chosen,rejected\nQ,a,b\nQ,,b\n"},
        expect=("stages.s.data.train", "rows.csv line 3 lacks 'chosen'"),
    ),
    Case(
        "data-parquet-that-is-not-parquet",
        pipeline=stage("sft", "train: rows.parquet"),
        files={"rows.parquet": "this is not a parquet file\n"},
        expect=("stages.s.data.train", "rows.parquet", "cannot be read"),
    ),
    Case(
        "data-rows-negative",
        argv=("data", "{pipeline}", "--rows", "-1"),
        pipeline=SFT,
        expect=("--rows", "'-1' is not a count of 1 or more"),
    ),
    Case(
        "data-rows-zero",
        argv=("data", "{pipeline}", "--rows", "0"),
        pipeline=SFT,
        expect=("--rows", "'0' is not a count of 1 or more"),
    ),
    Case(
        "data-rows-not-a-number",
        argv=("data", "{pipeline}", "--rows", "many"),
        pipeline=SFT,
        expect=("--rows", "'many' is not a count of 1 or more"),
    ),
]
