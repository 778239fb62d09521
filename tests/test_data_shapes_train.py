"""Each dataset shape people bring trains end to end: an SFT stage on a ShareGPT file and on an Alpaca file,
a DPO stage on an ultrafeedback-shaped parquet, written outside the project (slow tier: tests/conftest.py
SLOW_SUITES). The conversions row by row are tests/test_data_shapes.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from datasets import Dataset

from tests.test_data_shapes import bot, jsonl, user

E2E_ROWS = 100  # enough for a held-out slice (5%, at least 40 rows left to train), so samples are taken
SYSTEM = "You are a friendly bot."
INSTRUCTION = "Reply to the message."


def chatterbot_pairs() -> list[tuple[str, str]]:
    from align.data.corpora import builtin_path

    lines = builtin_path("align:chatterbot/sft/train").read_text().splitlines()[:E2E_ROWS]
    return [(m[0]["content"], m[1]["content"]) for m in (json.loads(line)["messages"] for line in lines)]


def shaped_files(folder: Path) -> dict[str, str]:
    """ShareGPT as jsonl, Alpaca as a JSON array, ultrafeedback-shaped pairs as parquet (read as Arrow)."""
    pairs = chatterbot_pairs()
    sharegpt = [
        {
            "id": f"chat-{index}",
            "conversations": [
                {"from": "system", "value": SYSTEM},
                {"from": "human", "value": said},
                {"from": "gpt", "value": reply},
            ],
        }
        for index, (said, reply) in enumerate(pairs)
    ]
    alpaca = [{"instruction": INSTRUCTION, "input": said, "output": reply} for said, reply in pairs]
    ultrafeedback = [
        {
            "prompt": said,
            "prompt_id": f"p{index}",
            "chosen": [user(said), bot(reply)],
            "rejected": [user(said), bot(pairs[(index + 7) % len(pairs)][1])],  # a reply to another message
            "messages": [user(said), bot(reply)],
            "score_chosen": 9.0,
            "score_rejected": 3.0,
        }
        for index, (said, reply) in enumerate(pairs)
    ]
    jsonl(folder / "sharegpt.jsonl", sharegpt)
    (folder / "alpaca.json").write_text(json.dumps(alpaca))
    Dataset.from_list(ultrafeedback).to_parquet(folder / "ultrafeedback.parquet")
    return {"sharegpt": "sharegpt.jsonl", "alpaca": "alpaca.json", "ultrafeedback": "ultrafeedback.parquet"}


@pytest.mark.integration
def test_sharegpt_alpaca_and_ultrafeedback_files_train(tmp_path: Path) -> None:

    from tests.pipelines import QUIET_TRL, losses, run, stage_record, write_pipeline

    folder = tmp_path / "shapes"
    folder.mkdir()
    files = shaped_files(folder)
    steps = {**QUIET_TRL, "max_steps": 3, "per_device_train_batch_size": 4, "learning_rate": 5e-3}
    steps["max_length"] = 128  # an alpaca row runs to 115 tokens: at 64 one keeps nothing to learn
    stages = {
        "sft_sharegpt": {"kind": "sft", "data": {"train": files["sharegpt"]}, "trl": steps},
        "sft_alpaca": {"kind": "sft", "data": {"train": files["alpaca"]}, "trl": steps},
        "dpo_ultrafeedback": {
            "kind": "dpo",
            "data": {"train": files["ultrafeedback"]},
            "lora": {"r": 8},
            "trl": steps,
        },
    }
    path = write_pipeline(folder, "shapes", stages, precision="fp32", seed=0)
    run(path, cwd=tmp_path)
    for name in stages:
        record = stage_record(path, name)
        assert record["status"] == "succeeded", name
        logged = losses(path, name)
        assert len(logged) == 3 and all(math.isfinite(loss) for loss in logged), (name, logged)
        assert record["metrics"]["trainable_changed"] == 1.0
        assert len(record["samples"]) == 4
    said = {pair[0] for pair in chatterbot_pairs()}
    # the held-out prompts are read from the rows as loaded: converted, with chat roles
    for sample in stage_record(path, "sft_sharegpt")["samples"]:
        head, _, turn = sample["prompt"].partition("\nuser: ")
        assert head == f"system: {SYSTEM}" and turn in said, sample["prompt"]
    for sample in stage_record(path, "sft_alpaca")["samples"]:
        assert sample["prompt"].removeprefix(f"user: {INSTRUCTION}\n\n") in said, sample["prompt"]
    for sample in stage_record(path, "dpo_ultrafeedback")["samples"]:
        assert sample["prompt"].removeprefix("user: ") in said, sample["prompt"]  # the shared turn only
    metrics = stage_record(path, "dpo_ultrafeedback")["metrics"]
    assert math.isfinite(metrics["dpo_reward_margin_after"]) and math.isfinite(
        metrics["preference_margin_after"]
    )
    for name in ("sft_sharegpt", "sft_alpaca"):
        metrics = stage_record(path, name)["metrics"]
        assert metrics["eval_loss_after"] < metrics["eval_loss_before"], name
