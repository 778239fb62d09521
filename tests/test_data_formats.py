"""Every TRL data format a stage accepts, end to end through the real CLI: one pipeline whose stages each
read one format, from the tiny model, in the file types users have (jsonl, json, parquet, a `datasets`
folder), by paths relative to the pipeline file. No stage gives `eval`, so each holds out a slice of its
own rows and scores it before and after: the path that used to crash on implicit-prompt pairs.

The rows are the builtin chatterbot conversations and preference pairs (a real reply preferred to a
brush-off), rewritten into each format; the RL stage reads the toy task's prompts as plain text.
One run (about 2 minutes on 2 cores), in the `slow` tier.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from align.data.corpora import builtin_path
from tests.pipelines import QUIET_TRL, run, stage_record, write_pipeline

pytestmark = pytest.mark.integration

ROWS = 160  # enough for a held-out slice (5%, at least 40 rows left to train)
STEPS = {"max_steps": 6, "per_device_train_batch_size": 4, "learning_rate": 5e-3}


def turn(role: str, content: str) -> list[dict]:
    return [{"role": role, "content": content}]


def sft_formats() -> dict[str, list[dict]]:
    conversations = [json.loads(line)["messages"] for line in read("align:chatterbot/sft/train")]
    pairs = [(c[0]["content"], c[1]["content"]) for c in conversations]
    return {
        "sft_messages": [{"messages": c} for c in conversations],
        "sft_text": [{"text": f"{user}\n{reply}"} for user, reply in pairs],
        "sft_prompt_completion": [{"prompt": user, "completion": f" {reply}"} for user, reply in pairs],
        "sft_prompt_completion_conversational": [
            {"prompt": turn("user", user), "completion": turn("assistant", reply)} for user, reply in pairs
        ],
    }


def preference_formats() -> dict[str, list[dict]]:
    rows = [json.loads(line) for line in read("align:chatterbot/prefs/train")]
    text = [(r["prompt"][0]["content"], r["chosen"][0]["content"], r["rejected"][0]["content"]) for r in rows]
    return {
        "explicit_conversational": rows,
        "explicit_text": [{"prompt": p, "chosen": f" {c}", "rejected": f" {r}"} for p, c, r in text],
        "implicit_conversational": [
            {"chosen": row["prompt"] + row["chosen"], "rejected": row["prompt"] + row["rejected"]}
            for row in rows
        ],
        "implicit_text": [{"chosen": f"{p} {c}", "rejected": f"{p} {r}"} for p, c, r in text],
        "unpaired_text": [
            {"prompt": p, "completion": f" {reply}", "label": good}
            for p, c, r in text
            for reply, good in ((c, True), (r, False))
        ],
    }


def read(ref: str) -> list[str]:
    return builtin_path(ref).read_text().splitlines()[:ROWS]


def write_rows(folder: Path, name: str, rows: list[dict], kind: str) -> str:
    """The rows as a file (or folder) of `kind`; returns its path relative to `folder`."""
    import datasets

    if kind == "jsonl":
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif kind == "json":
        (folder / f"{name}.json").write_text(json.dumps(rows))
    elif kind == "parquet":
        datasets.Dataset.from_list(rows).to_parquet(folder / f"{name}.parquet")
    else:
        datasets.Dataset.from_list(rows).save_to_disk(folder / name)
    return f"data/{name}{'' if kind == 'folder' else '.' + kind}"


STAGES = {  # stage: (kind, rows, file type)
    "sft_messages": ("sft", "sft_messages", "jsonl"),
    "sft_text": ("sft", "sft_text", "parquet"),
    "sft_prompt_completion": ("sft", "sft_prompt_completion", "json"),
    "sft_prompt_completion_conv": ("sft", "sft_prompt_completion_conversational", "folder"),
    "dpo_explicit_text": ("dpo", "explicit_text", "jsonl"),
    "dpo_implicit_conv": ("dpo", "implicit_conversational", "jsonl"),
    "dpo_implicit_text": ("dpo", "implicit_text", "parquet"),
    "reward_implicit_conv": ("reward", "implicit_conversational", "json"),
    "reward_explicit_text": ("reward", "explicit_text", "folder"),
    "kto_unpaired_text": ("kto", "unpaired_text", "jsonl"),
    "kto_paired_implicit_conv": ("kto", "implicit_conversational", "jsonl"),
}


@pytest.fixture(scope="module")
def formats_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("formats")
    (folder / "data").mkdir()
    rows = {**sft_formats(), **preference_formats()}
    stages = {}
    for name, (kind, format_name, file_type) in STAGES.items():
        data = write_rows(folder / "data", f"{name}-{format_name}", rows[format_name], file_type)
        trl = {**QUIET_TRL, **STEPS}
        if kind == "reward":  # TRL drops a pair longer than max_length: these rows run to 230 tokens
            trl["max_length"] = 256
        stages[name] = {"kind": kind, "data": {"train": data}, "trl": trl}
        if kind in ("dpo", "kto"):
            stages[name]["lora"] = {"r": 8}
    toy = [json.loads(line) for line in read("align:toy/number-or-word/train")]
    (folder / "data" / "prompts.jsonl").write_text(
        "".join(
            json.dumps({"prompt": row["prompt"][0]["content"], "answer": row["answer"]}) + "\n" for row in toy
        )
    )
    rl = {key: value for key, value in QUIET_TRL.items() if key != "max_length"}
    stages["grpo_text_prompts"] = {
        "kind": "grpo",
        "data": {"train": "data/prompts.jsonl"},
        # the random model never answers right: a length reward in characters gives GRPO's groups spread
        "rewards": [
            {"function": "exact_answer"},
            {"function": "length", "args": {"target": 12, "unit": "chars"}},
        ],
        "trl": {
            **rl,
            "max_steps": 2,
            "per_device_train_batch_size": 8,
            "num_generations": 4,
            "max_completion_length": 4,
        },
    }
    path = write_pipeline(folder, "formats", stages, precision="fp32", seed=0)
    text = path.read_text().replace(f"output_root: {folder / 'runs'}", "output_root: runs")
    path.write_text(text)  # every path in the file relative to it
    run(path, cwd=folder.parent)
    return path


@pytest.mark.parametrize("name", [*STAGES, "grpo_text_prompts"])
def test_each_format_trains_and_is_measured_on_rows_it_held_out(formats_run, name):
    record = stage_record(formats_run, name)
    metrics = record["metrics"]
    assert record["status"] == "succeeded"
    assert metrics["trainable_changed"] == 1.0  # every trainable tensor moved
    measured = {key[: -len("_after")] for key in metrics if key.endswith("_after")}
    assert measured and all(math.isfinite(metrics[f"{key}_after"]) for key in measured)
    if record["kind"] != "reward":  # a reward model scores; it does not complete prompts
        samples = record["samples"]
        assert len(samples) == 4 and all(sample["prompt"].strip() for sample in samples)  # a prompt, found


@pytest.mark.parametrize("name", [name for name, (kind, *_) in STAGES.items() if kind == "sft"])
def test_sft_lowers_the_held_out_loss_in_every_format(formats_run, name):
    metrics = stage_record(formats_run, name)["metrics"]
    # measured after 6 steps: 7.60 -> 7.13 (text), 7.26 (prompt-completion), lower for conversations
    assert metrics["eval_loss_after"] < metrics["eval_loss_before"] - 0.2


@pytest.mark.parametrize("name", ["dpo_explicit_text", "dpo_implicit_conv", "dpo_implicit_text"])
def test_dpo_learns_the_preference_whether_or_not_the_prompt_is_its_own_column(formats_run, name):
    metrics = stage_record(formats_run, name)["metrics"]
    assert metrics["dpo_reward_accuracy_after"] > 0.5  # against the reference, on the held-out pairs
    assert metrics["preference_margin_after"] > metrics["preference_margin_before"]


def test_an_implicit_prompt_is_the_shared_start_of_the_pair(formats_run):
    """Held-out samples are prompted with what TRL splits off as the prompt, not a whole pair or nothing."""
    rows = preference_formats()["implicit_text"]
    for sample in stage_record(formats_run, "dpo_implicit_text")["samples"]:
        prompt = sample["prompt"]
        assert any(r["chosen"].startswith(prompt) and r["rejected"].startswith(prompt) for r in rows)
    for sample in stage_record(formats_run, "dpo_implicit_conv")["samples"]:
        assert sample["prompt"].startswith("user: ") and "assistant" not in sample["prompt"]
