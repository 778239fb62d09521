"""An RL stage with nothing to learn from says so (issue 28): the watch on TRL's `frac_reward_zero_std` (and
PPO's), its settings, the start check on held-out rewards, the console's once-only notes, and one tiny GRPO
run through the real CLI whose reward never fires."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from align.cli import main
from align.config.spec import NoSignalSpec
from align.models.tiny import train_tokenizer
from align.records import read_progress
from align.report.console import ProgressLine, format_outcomes
from align.stages.progress import add_note, note_phase
from align.stages.signal import Scored, SignalWatch, constant_rewards, flat_start
from tests.pipelines import QUIET_TRL, run, run_in_process, stage_record


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


def tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


DEFAULTS = NoSignalSpec()


def watch(tmp_path: Path, tokenizer, latest: Scored | None, settings=DEFAULTS, limit: int = 4):
    return SignalWatch(settings, tmp_path, lambda: latest, tokenizer, limit)


def feed(signal: SignalWatch, shares: list[float], clipped: float = 1.0) -> None:
    for step, share in enumerate(shares, 1):
        logs = {"loss": 0.0, "frac_reward_zero_std": share, "completions/clipped_ratio": clipped}
        signal.on_log(None, SimpleNamespace(global_step=step), None, logs=logs)


def notes(folder: Path) -> list[str]:
    return read_progress(folder).notes


# --- the watch, on logged values ---


def test_flat_groups_over_the_window_are_said_once_with_the_cut_and_the_silent_reward(tmp_path, tokenizer):
    long, short = "the cat sat on the mat and more", "ok"
    assert tokens(tokenizer, long) >= 4 > tokens(tokenizer, short)  # what the example's cut is counted on
    latest = Scored([short, long], {"exact_answer": [0.0, 0.0], "format": [1.0, 0.0]})
    signal = watch(tmp_path, tokenizer, latest)
    feed(signal, [1.0, 0.95, 1.0, 1.0, 1.0])
    said = signal.metrics()
    assert said["no_signal_step"] == 3.0  # the third log of three at 0.9 or more, and only once
    line = said["no_signal"]
    assert line.startswith("no learning signal: 98% of the groups had identical rewards over the last 3 logs")
    assert (
        f"100% of completions were cut at max_completion_length=4 before they could finish, e.g. {long!r}"
        in line
    )
    assert f"reward exact_answer never fired: 0 for all 2 completions, e.g. {short!r} scored 0" in line
    assert "format" not in line  # it told the completions apart
    assert notes(tmp_path) == [line]


def test_a_window_broken_by_one_log_below_the_share_starts_again(tmp_path, tokenizer):
    signal = watch(tmp_path, tokenizer, None, NoSignalSpec(share=0.8, logs=3))
    feed(signal, [1.0, 1.0, 0.5, 0.9, 0.85], clipped=0.0)
    assert "no_signal" not in signal.metrics()
    feed(signal, [0.5, 0.9, 0.9, 0.9], clipped=0.0)
    assert signal.metrics()["no_signal_step"] == 4.0
    assert "tell prompts apart but not the completions of one prompt" in signal.metrics()["no_signal"]


def test_no_signal_null_never_says_it(tmp_path, tokenizer):
    signal = watch(tmp_path, tokenizer, Scored(["x"], {"r": [0.0]}, [0.0]), settings=None)
    feed(signal, [1.0] * 5)
    signal.at_start(Scored(["x"], {"r": [0.0]}, [0.0]))
    assert signal.metrics() == {}
    assert read_progress(tmp_path) is None


def test_rewards_that_never_vary_are_named_with_their_value_and_none_counts_as_no_opinion():
    scored = Scored(["a", "b"], {"zero": [0.0, 0.0], "one": [1.0, 1.0], "none": [math.nan] * 2, "ok": [0, 1]})
    assert constant_rewards(scored) == {"zero": 0.0, "one": 1.0, "none": None}


def test_a_start_whose_held_out_reward_is_the_same_everywhere_is_said(tokenizer):
    flat = Scored(["no", "nope"], {"exact_answer": [0.0, 0.0]}, [0.0, 0.0])
    line = flat_start(flat, tokenizer, limit=64)
    assert line.startswith(
        "no learning signal at the start: the starting model's held-out reward is 0 on every"
    )
    assert "reward exact_answer never fired: 0 for all 2 completions, e.g. 'no' scored 0" in line
    assert "cut at" not in line  # none of them reached 64 tokens
    varied = Scored(["no", "yes"], {"exact_answer": [0.0, 1.0]}, [0.0, 1.0])
    assert flat_start(varied, tokenizer, limit=64) is None


# --- where it is shown: the progress file, the console, the summary ---


def test_a_note_survives_later_progress_writes_and_is_printed_once(tmp_path):
    note_phase(tmp_path, "loading the data")
    add_note(tmp_path, "no learning signal at the start: ...")
    add_note(tmp_path, "no learning signal at the start: ...")  # said once
    note_phase(tmp_path, "training")
    entry = read_progress(tmp_path)
    assert entry.phase == "training" and entry.notes == ["no learning signal at the start: ..."]
    log = io.StringIO()
    progress = ProgressLine(log)
    progress.update("grpo", entry)
    progress.update("grpo", entry)
    assert log.getvalue().count("[grpo] no learning signal at the start: ...\n") == 1


def test_the_summary_repeats_what_a_stage_said():
    outcome = SimpleNamespace(
        stage="grpo",
        status="ran",
        seconds=3.0,
        metrics={"reward_mean_before": 0.0, "no_signal": "no learning"},
    )
    assert format_outcomes([outcome]).splitlines()[2] == "    no learning"


def test_bad_no_signal_settings_are_refused_naming_the_key(tmp_path, capsys):
    stage = {
        "kind": "grpo",
        "data": {"train": "align:toy/number-or-word/train"},
        "rewards": [{"function": "exact_answer"}],
        "no_signal": {"share": 1.5, "window": 3},
    }
    body = {"name": "s", "base_model": "tiny", "stages": {"grpo": stage}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(body))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "stages.grpo.no_signal.share" in err
    assert "stages.grpo.no_signal.window" in err


# --- a reward that never fires, on the tiny model through the CLI ---


@pytest.mark.integration
def test_grpo_whose_reward_never_fires_says_so_at_the_start_and_within_its_first_logs(tmp_path):
    """The random-init tiny model never writes `number` or `word`: exact_answer is 0 on every completion, and
    four new tokens rarely end in EOS. Both lines name the reward; the record keeps them."""
    grpo = {
        "kind": "grpo",
        "data": {
            "train": "align:toy/number-or-word/train",
            "eval": "align:toy/number-or-word/test",
            "max_eval_rows": 8,
        },
        "rewards": [{"function": "exact_answer"}],
        "no_signal": {"share": 0.9, "logs": 2},
        "trl": {
            **{key: value for key, value in QUIET_TRL.items() if key != "max_length"},
            "max_steps": 3,
            "per_device_train_batch_size": 8,
            "num_generations": 4,
            "max_completion_length": 4,
        },
    }
    body = {"name": "flat", "base_model": "tiny", "defaults": {"output_root": str(tmp_path / "runs")}}
    path = tmp_path / "flat.yaml"
    path.write_text(yaml.safe_dump({**body, "stages": {"grpo": grpo}}, sort_keys=False))
    out = run(path, timeout=300).stdout
    metrics = stage_record(path, "grpo")["metrics"]
    start, during = metrics["no_signal_at_start"], metrics["no_signal"]
    assert f"[grpo] {start}\n" in out and f"[grpo] {during}\n" in out
    # said before training (a progress line per step is not printed on a loaded machine: its clock decides)
    assert out.index(start) < out.index(during)
    assert "held-out reward is 0 on every one of 32 samples" in start
    assert "reward exact_answer never fired: 0 for all" in start
    assert during.startswith(
        "no learning signal: 100% of the groups had identical rewards over the last 2 logs"
    )
    assert "reward exact_answer never fired: 0 for all 8 completions" in during
    assert metrics["no_signal_step"] == 2.0


@pytest.mark.integration
def test_ppo_logs_rollouts_without_spread_and_says_so(tmp_path):
    """align's PPO logs `frac_reward_zero_std` (1 for a rollout whose scores have no spread) and the cut share
    as GRPO does; the watch reads them as rollouts. In process, without Ray."""
    from align.planning.hardware import Hardware

    stage = {
        "kind": "ppo",
        "data": {"train": "align:toy/number-or-word/train", "eval": "align:toy/number-or-word/test"},
        "rewards": [{"function": "exact_answer"}],
        "lora": {"r": 4},
        "no_signal": {"share": 1.0, "logs": 2},
        "trl": {
            **{key: value for key, value in QUIET_TRL.items() if key != "max_length"},
            "max_steps": 3,
            "num_ppo_epochs": 1,
            "per_device_train_batch_size": 4,
            "max_completion_length": 4,
        },
    }
    stage["data"]["max_eval_rows"] = 2
    body = {
        "name": "p",
        "base_model": "tiny",
        "defaults": {"output_root": str(tmp_path)},
        "stages": {"ppo": stage},
    }
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(body))
    cpu = Hardware(accelerator=False, device_memory=80 * 10**9)
    _, result = run_in_process(tmp_path / "p.yaml", "ppo", tmp_path / "out", cpu)
    logged = [json.loads(line) for line in (tmp_path / "out/logs/metrics.jsonl").read_text().splitlines()]
    rollouts = [entry for entry in logged if "frac_reward_zero_std" in entry]
    assert [entry["frac_reward_zero_std"] for entry in rollouts] == [1.0, 1.0, 1.0]
    assert [entry["reward_std"] for entry in rollouts] == [0.0, 0.0, 0.0]
    clipped = [1 - entry["val/num_eos_tokens"] for entry in rollouts]
    assert [entry["completions/clipped_ratio"] for entry in rollouts] == pytest.approx(clipped)
    line = result.metrics["no_signal"]
    assert line.startswith(
        "no learning signal: 100% of the rollouts had identical rewards over the last 2 logs"
    )
    assert "reward exact_answer never fired: 0 for all 4 completions" in line
    assert result.metrics["no_signal_step"] == 2.0
    assert "held-out reward is 0 on every one of 8 samples" in result.metrics["no_signal_at_start"]
