"""`align data`: the rows as the trainer sees them, loss-bearing tokens marked, and what `max_length` does to
the whole file, counted from the trainer's own preparation and checked here against counts made apart."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from align.cli import main
from align.errors import StageFailed
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.plan import build
from align.report.rows_view import preview
from tests.pipelines import QUIET_TRL, run_in_process, write_pipeline

DEMO = Path(__file__).resolve().parents[1] / "pipelines" / "demo_number_or_word.yaml"
CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
LIMIT = 40
WORDS = "the quick brown fox jumps over a lazy dog and then runs far away".split()


def tiny_tokenizer():
    from transformers import AutoTokenizer

    from align.models.loading import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("tiny"))


def chat_rows(count: int = 60) -> list[dict]:
    """Conversations whose user turns grow, so that some outgrow LIMIT before the answer starts."""
    rows = []
    for index in range(count):
        question = " ".join(WORDS[i % len(WORDS)] for i in range(index))
        answer = f"answer {index}"
        rows.append(
            {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]}
        )
    return rows


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def sft_pipeline(tmp_path: Path, data: Path, **trl) -> Path:
    stage = {
        "kind": "sft",
        "data": {"train": str(data), "eval": "none"},
        "trl": {**QUIET_TRL, "max_steps": 2, "max_length": LIMIT, "assistant_only_loss": True, **trl},
    }
    return write_pipeline(tmp_path, "rows", {"sft": stage})


def test_align_data_marks_only_the_answers_of_the_demo(capsys):
    assert main(["data", str(DEMO), "--rows", "4"]) == 0
    out = capsys.readouterr().out
    rows = out[out.index("row 0:") :]
    spans = re.findall(r"\[\[(.*?)\]\]", rows, flags=re.S)
    assert len(spans) == 4  # one answer per row, and nothing else trains (assistant_only_loss)
    assert all(re.fullmatch(r"(number|word)\.?<\|im_end\|>", span) for span in spans), spans
    assert "Number or word?" in out and not any("Number" in span for span in spans)
    assert "no loss-bearing token" in out  # the counts over the file follow the rows


def test_counts_equal_a_count_made_apart(tmp_path):
    rows = chat_rows()
    path = sft_pipeline(tmp_path, write_rows(tmp_path / "chat.jsonl", rows))
    report = preview(build(load(path), CPU), "sft", 2, colour=False).report
    tokenizer = tiny_tokenizer()
    lengths, emptied = [], 0
    for row in rows:
        rendered = tokenizer.apply_chat_template(
            row["messages"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        lengths.append(len(rendered["input_ids"]))
        emptied += not any(rendered["assistant_masks"][:LIMIT])
    over = sum(length > LIMIT for length in lengths)
    assert 0 < emptied < over < len(rows)  # the file holds every case, so the counts can be wrong
    assert (report.rows, report.longest, report.over, report.emptied) == (
        len(rows),
        max(lengths),
        over,
        emptied,
    )
    assert report.p50 == sorted(lengths)[(len(lengths) - 1) // 2]


def test_pairs_identical_after_the_cut_are_counted(tmp_path):
    tokenizer = tiny_tokenizer()
    stem = " ".join(WORDS * 3)
    rows = [
        {"prompt": f"Say something {index}:", "chosen": f" {stem} yes", "rejected": f" {stem} no"}
        for index in range(20)
    ] + [{"prompt": f"Pick {index}:", "chosen": " yes", "rejected": " no"} for index in range(20)]
    data = write_rows(tmp_path / "prefs.jsonl", rows)
    stage = {
        "kind": "dpo",
        "data": {"train": str(data), "eval": "none"},
        "trl": {**QUIET_TRL, "max_length": LIMIT},
    }
    report = preview(
        build(load(write_pipeline(tmp_path, "pairs", {"dpo": stage})), CPU), None, 1, False
    ).report
    eos = tokenizer.eos_token
    same = 0
    for row in rows:
        chosen = tokenizer(row["prompt"] + row["chosen"] + eos)["input_ids"][:LIMIT]
        rejected = tokenizer(row["prompt"] + row["rejected"] + eos)["input_ids"][:LIMIT]
        same += chosen == rejected
    assert same == 20 and report.identical == same


def test_the_preview_prepares_what_the_trainer_trains_on(tmp_path):
    """The same rows, token for token and label for label, as a TRL SFTTrainer built on them."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM
    from trl import SFTConfig, SFTTrainer

    from align.models.loading import resolve_model
    from align.stages.prepared import prepare

    rows = chat_rows(12)
    dataset = Dataset.from_list(rows)
    tokenizer = tiny_tokenizer()
    config = SFTConfig(
        output_dir=str(tmp_path), assistant_only_loss=True, max_length=None, report_to=[], bf16=False
    )
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(resolve_model("tiny")),
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    ours = prepare("sft", dataset, tokenizer, config)
    assert ours["input_ids"] == trainer.train_dataset["input_ids"]
    assert ours["labels"] == trainer.train_dataset["labels"]


@pytest.mark.integration
def test_a_stage_whose_cut_empties_rows_stops_before_training_and_records_the_counts(tmp_path):
    path = sft_pipeline(tmp_path, write_rows(tmp_path / "chat.jsonl", chat_rows()))
    with pytest.raises(StageFailed) as refused:
        run_in_process(path, "sft", tmp_path / "out", CPU)
    message = str(refused.value)
    emptied = preview(build(load(path), CPU), "sft", 0, False).report
    assert f"{emptied.emptied:,} of 60 rows" in message
    assert f"set trl.max_length: {max(emptied.keeps_all, emptied.keeps_answers):,}" in message
    assert not (tmp_path / "out" / "checkpoints").exists()  # stopped before the trainer was built

    (tmp_path / "kept").mkdir()
    whole = max(emptied.keeps_all, emptied.keeps_answers)
    kept = sft_pipeline(tmp_path / "kept", tmp_path / "chat.jsonl", max_length=whole)
    _, result = run_in_process(kept, "sft", tmp_path / "kept" / "out", CPU)
    assert result.metrics["data_emptied"] == 0
    assert result.metrics["data_rows"] == 60 and result.metrics["data_longest"] == emptied.longest

    allowed = yaml.safe_load(path.read_text())
    allowed["stages"]["sft"]["data"]["max_emptied_share"] = 0.9  # the user accepts losing them
    path.write_text(yaml.safe_dump(allowed))
    _, result = run_in_process(path, "sft", tmp_path / "allowed", CPU)
    assert result.metrics["data_emptied"] == emptied.emptied and result.steps == 2


def test_a_mixture_names_the_source_of_each_row(tmp_path, capsys):
    rows = chat_rows(40)
    first, second = (
        write_rows(tmp_path / "first.jsonl", rows[:20]),
        write_rows(tmp_path / "second.jsonl", rows[20:]),
    )
    path = sft_pipeline(tmp_path, first, max_length=512)
    body = yaml.safe_load(path.read_text())
    body["stages"]["sft"]["data"]["train"] = [
        {"path": str(first), "weight": 0.5},
        {"path": str(second), "weight": 0.5},
    ]
    path.write_text(yaml.safe_dump(body))
    assert main(["data", str(path), "--all"]) == 0
    out = capsys.readouterr().out
    named = re.findall(r"^row \d+ from (\S+):", out, flags=re.M)
    assert set(named) == {"first.jsonl", "second.jsonl"}
    for source, answer in re.findall(r"^row \d+ from (\S+):.*?\[\[answer (\d+)", out, flags=re.M | re.S):
        assert (int(answer) < 20) == (source == "first.jsonl")  # each row is named after the file it is in


def test_a_reward_stage_is_told_its_long_pairs_are_dropped_not_emptied() -> None:
    """TRL's reward trainer drops a pair longer than max_length whole: the stop says so, for that kind."""
    from types import SimpleNamespace

    from align.data.lengths import LengthReport
    from align.stages.prepared import lost_rows_problem

    report = LengthReport(
        rows=152, p50=60, p95=111, longest=229, max_length=64, over=22, emptied=22, identical=0, keeps_all=230
    )
    data = SimpleNamespace(max_emptied_share=None, max_cut_answers_share=None)
    for kind, told in (("reward", "TRL's reward trainer drops them"), ("sft", "keep no loss-bearing token")):
        plan = SimpleNamespace(kind=kind, where=f"stages.{kind}", stage=SimpleNamespace(data=data))
        problem = lost_rows_problem(plan, report)
        assert problem.startswith(f"stages.{kind}: at trl.max_length 64, 22 of 152 rows (14.5%)"), problem
        assert told in problem and "set trl.max_length: 230 to keep them" in problem
