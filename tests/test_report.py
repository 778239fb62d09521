"""`align report` on synthetic runs (no training): which panels each stage kind's log gets, that every
plot is a real PNG with something drawn, and what the HTML and Markdown pages hold. The report of the
real demo run is checked in test_pipeline_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pages import ink, inline_images

from align.cli import main
from align.records import write
from align.report.pages import write_report
from align.report.plots import dag_plot, panels, series, stage_plot
from align.report.run_folder import load_run
from pipelines import stage, write_pipeline
from tests.fake_records import a_record


def history(steps: int, **curves: float) -> list[dict]:
    """A log like TRL's: each key logged every 5 steps, starting from its value, falling a little."""
    return [
        {**{key: start * (1 - 0.02 * n) for key, start in curves.items()}, "epoch": n / steps, "step": 5 * n}
        for n in range(1, steps + 1)
    ]


TRAIN = {"loss": 2.0, "grad_norm": 1.0, "learning_rate": 1e-3}
LOGS = {
    "sft": [
        {"eval_loss": 7.6, "eval_entropy": 7.5, "eval_mean_token_accuracy": 0.01, "step": 0},
        *history(8, **TRAIN, entropy=7.0, mean_token_accuracy=0.1, num_tokens=300.0),
        {"train_runtime": 60.0, "train_loss": 4.6, "total_flos": 1e9, "step": 40},
    ],
    "dpo": history(
        8,
        **TRAIN,
        **{
            "rewards/chosen": -0.3,
            "rewards/rejected": -0.7,
            "rewards/accuracies": 0.9,
            "rewards/margins": 0.4,
        },
        **{"logps/chosen": -80.0, "logps/rejected": -35.0, "logits/chosen": -1.6},
    ),
    "kto": history(
        8, **TRAIN, kl=0.1, **{"rewards/margins": 0.2, "rewards/chosen": 0.1, "logps/chosen": -9.0}
    ),
    "reward": history(8, **TRAIN, accuracy=0.7, margin=0.5, min_reward=-1.0, mean_reward=0.1, max_reward=1.0),
    "grpo": history(
        8,
        **TRAIN,
        reward=0.5,
        reward_std=0.3,
        kl=0.01,
        entropy=2.0,
        **{"rewards/exact_answer/mean": 0.4, "rewards/exact_answer/std": 0.5, "rewards/format/mean": 0.3},
        **{"completions/mean_length": 6.0, "completions/clipped_ratio": 0.1, "clip_ratio/region_mean": 0.0},
    ),
    "ppo": history(
        8,
        **TRAIN,
        reward=0.2,
        completion_length=7.0,
        **{"objective/kl": 0.5, "objective/scores": 0.2, "objective/kl_coef": 0.2},
        **{"rewards/model": 0.2, "rewards/exact_answer": 0.6, "loss/policy_avg": 0.1, "loss/value_avg": 0.3},
    ),
}
PANELS = {
    "sft": ["loss", "learning rate", "gradient norm", "token accuracy", "entropy"],
    "dpo": [
        "loss",
        "learning rate",
        "gradient norm",
        "reward accuracy",
        "reward margin",
        "implicit rewards",
        "log-probs",
    ],
    "kto": ["loss", "learning rate", "gradient norm", "reward margin", "implicit rewards", "log-probs", "KL"],
    "reward": ["loss", "learning rate", "gradient norm", "reward model scores", "accuracy", "score margin"],
    "grpo": ["loss", "learning rate", "gradient norm", "mean reward", "KL", "entropy", "completion length"],
    "ppo": ["loss", "learning rate", "gradient norm", "mean reward", "KL", "completion length", "PPO losses"],
}


@pytest.mark.parametrize("kind", sorted(LOGS))
def test_each_stage_kind_gets_the_panels_its_log_holds_as_a_real_png(kind: str) -> None:
    plot = stage_plot(kind, LOGS[kind])
    assert plot.panels == PANELS[kind]
    assert 0.02 < ink(plot.png) < 0.6


def test_rl_rewards_are_plotted_per_reward_function_and_their_spread_is_not() -> None:
    chosen = dict(panels(list(series(LOGS["grpo"]))))
    assert chosen["mean reward"] == ["reward", "rewards/exact_answer/mean", "rewards/format/mean"]
    assert chosen["loss"] == ["loss"]  # the end-of-run `train_loss` summary is no curve
    assert dict(panels(list(series(LOGS["ppo"]))))["mean reward"] == [
        "reward",
        "rewards/model",
        "rewards/exact_answer",
    ]
    assert dict(panels(list(series(LOGS["sft"]))))["loss"] == ["eval_loss", "loss"]


def test_a_stage_that_logged_nothing_has_no_plot() -> None:
    assert stage_plot("merge", []) is None
    assert stage_plot("odd", history(3, unknown_metric=1.0)) is None


def test_the_dag_is_drawn() -> None:
    plot = dag_plot(["sft", "reward", "ppo"], {"reward": ["sft"], "ppo": ["sft", "reward"]}, {})
    assert ink(plot.png) > 0.01


def write_stage(run: Path, name: str, record: dict, log: list[dict] | None = None, folder: str = "") -> None:
    """A stage folder as `align run` leaves it: its record, its log and one rank's placement file."""
    where = run / (folder or name)
    (where / "logs").mkdir(parents=True)
    write(where / "align-stage.json", a_record(name, **{"pipeline": "demo", **record}))
    if log is not None:
        (where / "logs" / "metrics.jsonl").write_text("".join(json.dumps(entry) + "\n" for entry in log))
        placement = {"rank": 0, "peak_rss_bytes": 7 * 10**8, "param_elements_local": 210240}
        (where / "logs" / "placement-rank0.json").write_text(json.dumps(placement))


def demo_like_run(root: Path) -> Path:
    """sft -> dpo -> merge, finished, with samples (one holding markup) and a memory plan."""
    run = root / "demo"
    resolved = {"backend": "ddp", "workers": 1, "precision": "fp32", "backend_reason": "one CPU rank"}
    common = {"status": "succeeded", "resolved": resolved}
    sample = {"prompt": "user: Hi <b>there</b>", "before": "zzz", "after": "Hello!"}
    plan = [
        {"what": "parameters", "device": 840960, "host": 0},
        {"what": "total", "device": 4 * 10**6, "host": 0},
    ]
    sft = {"kind": "sft", "config": {"kind": "sft"}, "started": 1.0, "ended": 40.0, "memory_plan": plan}
    sft["metrics"] = {"eval_loss_before": 7.6, "eval_loss_after": 4.0, "train_loss_first": 7.2}
    sft["samples"] = [sample] * 4
    write_stage(run, "sft", {**common, **sft}, LOGS["sft"])
    dpo = {"kind": "dpo", "config": {"model": "${stages.sft.output}"}, "started": 41.0, "ended": 90.0}
    dpo["metrics"] = {"preference_accuracy_before": 0.2, "preference_accuracy_after": 0.4}
    write_stage(run, "dpo", {**common, **dpo}, LOGS["dpo"])
    merge = {"kind": "merge", "config": {"model": "${stages.dpo.output}"}, "started": 91.0, "ended": 99.0}
    write_stage(run, "merge", {**common, **merge, "metrics": {"merge_max_abs_logit_delta": 3e-6}})
    (run / "merge" / "logs" / "worker-0.log").write_text("")
    return run


def test_the_report_of_a_run_folder_holds_each_stage_its_plots_samples_and_memory(tmp_path: Path) -> None:
    run = load_run(demo_like_run(tmp_path))
    assert [(s.name, s.reads, s.status) for s in run.stages] == [
        ("sft", [], "succeeded"),
        ("dpo", ["sft"], "succeeded"),
        ("merge", ["dpo"], "succeeded"),
    ]
    page, summary = write_report(run, tmp_path / "out")
    text = page.read_text()
    images = inline_images(text)
    assert set(images) == {"stages and which feeds which", "sft", "dpo"}
    assert images["dpo"][1] == "; ".join(PANELS["dpo"])
    assert all(ink(png) > 0.01 for png, _ in images.values())
    assert "http" not in text.replace("http-equiv", "")  # nothing to fetch
    assert "user: Hi &lt;b&gt;there&lt;/b&gt;" in text and "<b>there" not in text
    assert "841 KB" in text and "700 MB" in text  # the plan beside the measured peak
    markdown = summary.read_text()
    assert [line for line in markdown.splitlines() if line.startswith("## ")] == [
        "## sft",
        "## dpo",
        "## merge",
    ]
    assert "- dpo <- sft" in markdown and "- merge <- dpo" in markdown
    assert "| eval_loss | 7.6 | 4 | -3.6 |" in markdown
    assert "| user: Hi <b>there</b> | zzz | Hello! |" in markdown


def test_a_failed_stage_is_reported_from_its_kept_folder(tmp_path: Path) -> None:
    run = demo_like_run(tmp_path)
    failed = {"kind": "dpo", "status": "failed", "error": "out of memory", "started": 41.0, "ended": 42.0}
    failed["config"] = {"model": "${stages.sft.output}"}
    write_stage(run, "dpo", failed, folder=".dpo.failed-20250101-000000-abcd")
    for name in ("dpo", "merge"):
        for path in sorted((run / name).rglob("*"), reverse=True):
            path.unlink() if path.is_file() else path.rmdir()
        (run / name).rmdir()
    stages = load_run(run).stages
    assert [(s.name, s.status) for s in stages] == [("sft", "succeeded"), ("dpo", "failed")]
    page, _ = write_report(load_run(run), tmp_path / "out")
    assert "out of memory" in page.read_text()


def test_a_pipeline_file_reports_into_its_run_folder_with_the_stages_not_run_yet(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_pipeline(
        tmp_path, "two", {"sft": stage("sft"), "dpo": stage("dpo", model="${stages.sft.output}")}
    )
    record = {"kind": "sft", "status": "succeeded", "config": {}, "started": 1.0, "ended": 2.0}
    write_stage(tmp_path / "runs" / "two", "sft", record, LOGS["sft"])
    assert main(["report", str(path)]) == 0
    assert capsys.readouterr().out.split() == [
        str(tmp_path / "runs" / "two" / "report.html"),
        str(tmp_path / "runs" / "two" / "report.md"),
    ]
    assert "| dpo | dpo | sft | not run |" in (tmp_path / "runs" / "two" / "report.md").read_text()


def test_a_folder_without_a_run_is_refused_plainly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "no stage has run here" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "no such pipeline file or run folder" in capsys.readouterr().err
