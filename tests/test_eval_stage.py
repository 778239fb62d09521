"""The eval stage (issue 21): figures with their uncertainty, the checks `align validate` makes, DPO's
reward accuracy before training, and one pipeline run through the CLI on two ranks: SFT and a reward model
trained on the number-or-word task, then an eval comparing the base model, the SFT model and the SFT model
again under a rule reward, the reward model, a function of the user's own and an lm-eval local task; and
`align chat --prompt` answering from a stage's output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from align.cli import main
from align.measures.stats import mean_interval, outcomes, win_rate
from align.report.eval_tables import format_eval
from tests.pipelines import QUIET_TRL, run, stage_folder, stage_record

TOY = "align:toy/number-or-word"


# --- the statistics ---


def test_the_interval_holds_the_mean_and_narrows_with_more_prompts() -> None:
    rng = np.random.default_rng(0)
    small, large = mean_interval(rng.normal(1.0, 1.0, 20)), mean_interval(rng.normal(1.0, 1.0, 500))
    for found in (small, large):
        assert found.low < found.mean < found.high
    assert large.high - large.low < 0.5 * (small.high - small.low)
    assert large.low < 1.0 < large.high and (small.n, large.n) == (20, 500)
    assert mean_interval([0.0, 1.0] * 32, seed=3) == mean_interval([0.0, 1.0] * 32, seed=3)  # seeded


def test_a_model_against_itself_wins_exactly_half_and_ties_count_half() -> None:
    scores = [0.0, 1.0, 0.5, 1.0]
    same = win_rate(scores, scores)
    assert (same.mean, same.low, same.high, same.n) == (0.5, 0.5, 0.5, 4)
    assert outcomes([1.0, 0.0, 2.0], [0.0, 0.0, 3.0]) == [1.0, 0.5, 0.0]
    better = win_rate([1.0] * 30 + [0.0] * 2, [0.0] * 32)
    assert better.mean == 31 / 32 and better.low > 0.5  # 30 wins and 2 ties
    with pytest.raises(ValueError, match="pair them by prompt"):
        win_rate([1.0], [1.0, 0.0])


def test_the_summary_table_says_each_figure_with_its_interval_and_the_baseline() -> None:
    metrics = {
        "eval/sft/exact_answer": 0.75,
        "eval/sft/exact_answer/low": 0.6,
        "eval/sft/exact_answer/high": 0.9,
        "eval/sft/exact_answer/n": 64.0,
        "eval/dpo/exact_answer": 0.8,
        "eval/dpo/exact_answer/low": 0.7,
        "eval/dpo/exact_answer/high": 0.9,
        "eval/dpo/exact_answer/n": 64.0,
        "eval/dpo/exact_answer/win": 0.55,
        "eval/dpo/exact_answer/win_low": 0.45,
        "eval/dpo/exact_answer/win_high": 0.65,
        "lm_eval/dpo/toy/exact_match": 0.5,
    }
    lines = format_eval(metrics)
    assert "win rate vs sft" in lines[0]
    assert lines[1].split() == ["sft", "exact_answer", "0.750", "[0.600,", "0.900]", "64", "(baseline)"]
    assert lines[2].split()[-2:] == ["[0.450,", "0.650]"] and "0.550" in lines[2]
    assert lines[-1].split() == ["dpo", "toy", "exact_match", "0.5"]


def test_a_metric_measured_before_and_after_only_is_two_markers_not_a_line() -> None:
    from align.report.plots import series_style

    assert series_style("eval_rewards/accuracies", 2) == ("none", "o")
    assert series_style("eval_loss", 5) == ("--", "o")
    assert series_style("loss", 100) == ("-", None)


def test_sampled_answers_come_num_samples_per_prompt_and_repeat_with_their_seed() -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from align.config.eval_settings import GenerationSpec
    from align.models.loading import resolve_model
    from align.stages.eval_answers import answers

    folder = resolve_model("tiny")
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")
    prompts = [[{"role": "user", "content": f"Number or word? {item}"}] for item in ("7", "cat")]
    sampled = GenerationSpec(max_new_tokens=5, temperature=1.0, num_samples=3)
    first = answers(model, tokenizer, prompts, sampled, seed=1)
    assert len(first) == 6 and first == answers(model, tokenizer, prompts, sampled, seed=1)
    assert len(set(first)) > 1  # a random-init model sampled at temperature 1 does not repeat itself
    plain = GenerationSpec(max_new_tokens=5)
    greedy = answers(model, tokenizer, prompts, plain, seed=1)
    assert len(greedy) == 2 and greedy == answers(model, tokenizer, prompts, plain, seed=9)  # no seed needed


# --- validate ---


def eval_pipeline(folder: Path, eval_stage: dict, **top) -> Path:
    body = {
        "name": "evals",
        "base_model": "tiny",
        **top,
        "defaults": {"output_root": str(folder / "runs")},
        "stages": {"eval": {"kind": "eval", **eval_stage}},
    }
    path = folder / "evals.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("stage", "where", "says"),
    [
        (
            {"models": {"a": "tiny"}, "baseline": "b", "data": {"prompts": f"{TOY}/test"}},
            "stages.eval",
            "baseline 'b' is not one of models: a",
        ),
        (
            {"models": {"a": "tiny"}, "lm_eval": {"tasks": ["arc_easy"]}, "generation": {"num_samples": 4}},
            "stages.eval.generation",
            "greedy decoding",
        ),
        (
            {"models": {"a": "tiny"}, "data": {"prompts": f"{TOY}/test"}, "rewards": [{"function": "nope"}]},
            "stages.eval.rewards[0].function",
            "not a shipped reward function",
        ),
        (
            {"models": {"a": "no/such/folder/"}, "lm_eval": {"tasks": ["arc_easy"]}},
            "stages.eval.models.a",
            "",
        ),
        (
            {"models": {"a": "tiny"}, "lm_eval": {"tasks": ["hellaswagg"]}},
            "stages.eval.lm_eval.tasks",
            "no task 'hellaswagg' in lm-eval's own tasks (close: hellaswag",
        ),
        (
            {"models": {"a": "tiny"}, "data": {"prompts": f"{TOY}/sft"}, "rewards": [{"function": "format"}]},
            "stages.eval.data.prompts",
            "prompt",
        ),
    ],
)
def test_validate_refuses_an_eval_stage_naming_the_yaml_path(tmp_path, capsys, stage, where, says) -> None:
    path = eval_pipeline(tmp_path, stage)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert where in err and says in err, err


# --- one run through the CLI, two ranks ---

OWN_REWARD = '''
def shorter(completions, **kwargs):
    """1 for an answer of at most one word."""
    return [float(len(c[-1]["content"].split()) <= 1) for c in completions]
'''


def lm_eval_task(folder: Path) -> Path:
    """The held-out number-or-word items as an lm-eval generate-until task with exact match (no hub)."""
    from align.data.corpora import builtin_path

    tasks = folder / "tasks"
    tasks.mkdir()
    rows = [json.loads(line) for line in builtin_path(f"{TOY}/test").read_text().splitlines()]
    with open(tasks / "items.jsonl", "w") as out:
        for row in rows:
            out.write(json.dumps({"question": row["prompt"][-1]["content"], "answer": row["answer"]}) + "\n")
    task = {
        "task": "number_or_word",
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {"test": str(tasks / "items.jsonl")}},
        "test_split": "test",
        "output_type": "generate_until",
        "doc_to_text": "{{question}}",
        "doc_to_target": "{{answer}}",
        "generation_kwargs": {"until": ["\n"], "max_gen_toks": 6, "do_sample": False},
        "metric_list": [
            {"metric": "exact_match", "aggregation": "mean", "higher_is_better": True, "ignore_case": True}
        ],
    }
    (tasks / "number_or_word.yaml").write_text(yaml.safe_dump(task, sort_keys=False))
    return tasks


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("evals")
    (folder / "own_rewards.py").write_text(OWN_REWARD)
    trl = {**QUIET_TRL, "max_steps": 40, "learning_rate": 1e-2, "per_device_train_batch_size": 32}
    stages = {
        "sft": {
            "kind": "sft",
            "data": {"train": f"{TOY}/sft", "eval": "none"},
            "trl": {**trl, "assistant_only_loss": True},
        },
        "reward": {
            "kind": "reward",
            "model": "${stages.sft.output}",
            "data": {"train": f"{TOY}/prefs/train", "eval": "none"},
            "trl": {**trl, "learning_rate": 3e-3},
        },
        "eval": {
            "kind": "eval",
            "workers": 2,
            "models": {"base": "tiny", "sft": "${stages.sft.output}", "again": "${stages.sft.output}"},
            "baseline": "sft",
            "data": {"prompts": f"{TOY}/test"},
            "rewards": [
                {"function": "exact_answer"},
                {"model": "${stages.reward.output}"},
                {"function": "own_rewards.shorter"},
            ],
            "generation": {"max_new_tokens": 6},
            "lm_eval": {"tasks": ["number_or_word"], "include_path": str(lm_eval_task(folder)), "limit": 16},
        },
    }
    body = {
        "name": "evals",
        "base_model": "tiny",
        "allow_custom_code": True,
        "defaults": {"output_root": str(folder / "runs")},
        "stages": stages,
    }
    path = folder / "evals.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    done = run(path, cwd=folder)
    (folder / "summary.txt").write_text(done.stdout)
    return path


@pytest.mark.integration
def test_eval_on_two_ranks_scores_every_held_out_prompt_of_every_model(eval_run) -> None:
    record = stage_record(eval_run, "eval")
    metrics = record["metrics"]
    assert len(record["ranks"]) == 2
    for name in ("base", "sft", "again"):
        for reward in ("exact_answer", "model", "shorter", "total"):
            key = f"eval/{name}/{reward}"
            assert metrics[f"{key}/n"] == 64.0
            assert metrics[f"{key}/low"] <= metrics[key] <= metrics[f"{key}/high"]
    answers = (stage_folder(eval_run, "eval") / "eval" / "answers.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in answers]
    assert [row["row"] for row in rows] == list(range(64))  # both ranks' halves, back in order
    assert all(row["answers"]["sft"] == row["answers"]["again"] for row in rows)
    assert metrics["eval/sft/exact_answer"] >= 0.9 and metrics["eval/base/exact_answer"] == 0.0


@pytest.mark.integration
def test_a_model_against_itself_wins_half_and_the_reward_model_prefers_one_model(eval_run) -> None:
    metrics = stage_record(eval_run, "eval")["metrics"]
    for reward in ("exact_answer", "model", "shorter", "total"):
        key = f"eval/again/{reward}"
        assert (metrics[f"{key}/win"], metrics[f"{key}/win_low"], metrics[f"{key}/win_high"]) == (0.5,) * 3
        assert f"eval/sft/{reward}/win" not in metrics  # the baseline
    # the reward model (trained on `number.` over a wrong word or none) tells base and SFT apart on nearly
    # every prompt: the win rate's interval leaves 0.5, on the side of the higher mean
    base = {key: metrics[f"eval/base/model{key}"] for key in ("", "/win", "/win_low", "/win_high")}
    assert base["/win_low"] > 0.5 or base["/win_high"] < 0.5
    assert (base["/win"] > 0.5) == (base[""] > metrics["eval/sft/model"])


@pytest.mark.integration
def test_lm_eval_scores_each_model_on_the_local_task(eval_run) -> None:
    metrics = stage_record(eval_run, "eval")["metrics"]
    scores = {
        name: metrics[f"lm_eval/{name}/number_or_word/exact_match"] for name in ("base", "sft", "again")
    }
    assert scores["base"] == 0.0 and scores["sft"] >= 0.75 and scores["sft"] == scores["again"]


@pytest.mark.integration
def test_the_summary_and_the_report_show_the_table(eval_run) -> None:
    summary = (eval_run.parent / "summary.txt").read_text()
    assert "win rate vs sft [95% CI], ties half" in summary
    assert any(line.split()[:3] == ["again", "exact_answer", "1.000"] for line in summary.splitlines())
    done = subprocess.run(
        [sys.executable, "-m", "align.cli", "report", str(eval_run)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    markdown = Path(done.stdout.split()[1]).read_text()
    assert "| again | model |" in markdown and "| again | number_or_word | exact_match |" in markdown
    page = Path(done.stdout.split()[0]).read_text()
    assert 'alt="eval: intervals"' in page and "Answers side by side" in page


@pytest.mark.integration
def test_align_chat_answers_once_from_a_stage_output(eval_run) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "align.cli",
            "chat",
            str(eval_run),
            "--stage",
            "sft",
            "--prompt",
            "Number or word? 42",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "number"
    refused = subprocess.run(
        [sys.executable, "-m", "align.cli", "chat", str(eval_run), "--stage", "eval", "--prompt", "hi"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 2 and "an eval stage writes no model" in refused.stderr
