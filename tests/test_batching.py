"""SFT batches padding-free by default: the same loss, step for step, as padded batches, on the shipped chat
rows and on rows of very different lengths, some cut by `max_length` from either end. In this process, no
Ray; the tokens/s gain is measured by `make bench` (bench/batching.py), not asserted here."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
import yaml
from datasets import Dataset

from align.data.batching import PACKED, PADDED, PADDING_FREE, sft_batching, truncated
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.plan import build
from align.report.console import format_plan
from tests.pipelines import logged_losses, run_in_process

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
WORDS = "the a cat dog sat ran on under over mat tree house river quickly slowly red blue green".split()


def pipeline(folder: Path, data: str, **trl) -> Path:
    body = {
        "name": "batching",
        "base_model": "tiny",
        "defaults": {"output_root": str(folder), "precision": "fp32", "seed": 0, "backend": "ddp"},
        "stages": {
            "sft": {
                "kind": "sft",
                "data": {
                    "train": data,
                    "max_train_rows": 88,
                    "max_emptied_share": 1.0,  # rows cut from either end, on purpose
                    "max_cut_answers_share": 1.0,
                },
                "trl": {
                    "max_steps": 5,
                    "logging_steps": 1,
                    "per_device_train_batch_size": 8,
                    "learning_rate": 1e-3,
                    "max_length": 64,
                    "save_strategy": "no",
                    "report_to": "none",
                    **trl,
                },
            }
        },
    }
    folder.mkdir(parents=True)
    path = folder / "batching.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def sft_run(folder: Path, data: str, **trl) -> tuple[str, list[float], dict[str, float]]:
    """(how the plan batched, the logged losses, the recorded metrics) of five SFT steps."""
    plan, result = run_in_process(pipeline(folder, data, **trl), "sft", folder / "out", CPU)
    return plan.batching[0], logged_losses(folder / "out"), result.metrics


def varied_rows(folder: Path) -> str:
    """Prompt-completion rows from 2 to 120 words: most batches hold one row several times the others'
    length, and some rows are longer than max_length."""
    rng = random.Random(0)
    rows = [
        {
            "prompt": " ".join(rng.choices(WORDS, k=rng.randint(1, 60))),
            "completion": " " + " ".join(rng.choices(WORDS, k=rng.randint(1, 60))),
        }
        for _ in range(96)
    ]
    path = folder / "varied.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


@pytest.mark.integration
@pytest.mark.parametrize("truncation_mode", ["keep_start", "keep_end"])
def test_padding_free_sft_loses_exactly_what_padded_sft_loses(tmp_path: Path, truncation_mode: str) -> None:
    data = varied_rows(tmp_path)
    free = sft_run(tmp_path / "free", data, truncation_mode=truncation_mode)
    padded = sft_run(tmp_path / "padded", data, truncation_mode=truncation_mode, padding_free=False)
    assert (free[0], padded[0]) == (PADDING_FREE, PADDED)
    assert len(free[1]) == 5
    torch.testing.assert_close(torch.tensor(free[1]), torch.tensor(padded[1]), rtol=1e-5, atol=1e-5)
    for key in ("eval_loss_before", "eval_loss_after"):
        assert free[2][key] == pytest.approx(padded[2][key], rel=1e-5)


@pytest.mark.integration
def test_padding_free_sft_on_the_shipped_chat_rows_matches_padded(tmp_path: Path) -> None:
    free = sft_run(tmp_path / "free", "align:chatterbot/sft/train")
    padded = sft_run(tmp_path / "padded", "align:chatterbot/sft/train", padding_free=False)
    torch.testing.assert_close(torch.tensor(free[1]), torch.tensor(padded[1]), rtol=1e-5, atol=1e-5)


def test_the_trl_block_chooses_padded_or_packed_batches_and_the_plan_says_so(tmp_path: Path) -> None:
    assert sft_batching({})[0] == PADDING_FREE
    assert sft_batching({"padding_free": True})[0] == PADDING_FREE
    assert sft_batching({"padding_free": False})[0] == PADDED
    assert sft_batching({"packing": True})[0] == PACKED
    printed = format_plan(build(load(pipeline(tmp_path / "plan", "align:chatterbot/sft/train")), CPU))
    assert "batching: padding-free" in printed


@pytest.mark.parametrize(
    ("mode", "kept"), [("keep_start", ([1, 2, 3], [-100, 2, 3])), ("keep_end", ([3, 4, 5], [3, 4, 5]))]
)
def test_rows_are_cut_as_trl_cuts_them_and_rows_left_with_nothing_to_learn_are_dropped(mode, kept) -> None:
    rows = Dataset.from_dict(
        {
            "input_ids": [[1, 2, 3, 4, 5], [7, 8, 9, 10]],
            "labels": [[-100, 2, 3, 4, 5], [-100, -100, -100, 10]],
        }
    )
    cut = truncated(rows, 3, mode)
    first = (cut["input_ids"][0], cut["labels"][0])
    assert first == kept
    assert len(cut) == (1 if mode == "keep_start" else 2)  # [7, 8, 9] has no label left from the start


def test_padding_free_dpo_is_refused_naming_the_field(tmp_path: Path, capsys) -> None:
    from align.cli import main

    dpo = {"kind": "dpo", "data": {"train": "align:chatterbot/prefs/train"}, "trl": {"padding_free": True}}
    path = tmp_path / "dpo.yaml"
    path.write_text(yaml.safe_dump({"name": "dpo", "base_model": "tiny", "stages": {"dpo": dpo}}))
    assert main(["validate", str(path)]) == 2
    assert "stages.dpo.trl.padding_free: the pinned TRL turns padding-free DPO off" in capsys.readouterr().err
