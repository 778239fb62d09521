"""An eval stage's figures as rows a person reads, from the record's flat metrics (align/stages/eval.py
names them `eval/<model>/<reward>` with `/low`, `/high`, `/n`, `/win`, `/win_low`, `/win_high`, and
`lm_eval/<model>/<task>/<metric>`): the summary's table, and the report's."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from align.records import EVAL_RESULTS, EvalResults, StageRecord, read

EVAL_HEADER = ["model", "reward", "mean [95% CI]", "n", "win rate vs baseline [95% CI]"]
LM_EVAL_HEADER = ["model", "task", "metric", "value"]


@dataclass(frozen=True)
class Figure:
    """One model's figure on one reward: mean and interval over n prompts; win rate and its interval
    against the baseline (None for the baseline itself)."""

    model: str
    reward: str
    mean: float
    low: float
    high: float
    n: int
    win: tuple[float, float, float] | None


def is_eval(metrics: dict[str, float]) -> bool:
    return any(key.startswith(("eval/", "lm_eval/")) for key in metrics)


def figures(metrics: dict[str, float]) -> list[Figure]:
    """Every (model, reward) figure, in the order the stage recorded them."""
    found = []
    for key, value in metrics.items():
        parts = key.split("/")
        if len(parts) != 3 or parts[0] != "eval" or f"{key}/low" not in metrics:
            continue
        win = None
        if f"{key}/win" in metrics:
            win = (metrics[f"{key}/win"], metrics[f"{key}/win_low"], metrics[f"{key}/win_high"])
        low, high, n = metrics[f"{key}/low"], metrics[f"{key}/high"], int(metrics[f"{key}/n"])
        found.append(Figure(parts[1], parts[2], value, low, high, n, win))
    return found


def harness_rows(metrics: dict[str, float]) -> list[list[str]]:
    """(model, task, metric, value) of each lm-evaluation-harness score."""
    rows = []
    for key, value in metrics.items():
        if key.startswith("lm_eval/"):
            _, model, task, metric = key.split("/", 3)
            rows.append([model, task, metric, f"{value:.4g}"])
    return rows


def baseline(metrics: dict[str, float]) -> str:
    """The model the others were compared with: the one with no win rate."""
    return next((figure.model for figure in figures(metrics) if figure.win is None), "baseline")


def header(metrics: dict[str, float]) -> list[str]:
    return [*EVAL_HEADER[:-1], f"win rate vs {baseline(metrics)} [95% CI], ties half"]


def interval(mean: float, low: float, high: float) -> str:
    return f"{mean:.3f} [{low:.3f}, {high:.3f}]"


def table_rows(metrics: dict[str, float]) -> list[list[str]]:
    """EVAL_HEADER's rows."""
    return [
        [
            figure.model,
            figure.reward,
            interval(figure.mean, figure.low, figure.high),
            str(figure.n),
            interval(*figure.win) if figure.win else "(baseline)",
        ]
        for figure in figures(metrics)
    ]


def text_table(top: list[str], rows: list[list[str]], indent: str = "    ") -> list[str]:
    """A header and rows as aligned text lines, for the console."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(top, *rows, strict=True)]
    return [
        (indent + "  ".join(f"{cell:<{width}}" for cell, width in zip(row, widths, strict=True))).rstrip()
        for row in [top, *rows]
    ]


def format_eval(metrics: dict[str, float], indent: str = "    ") -> list[str]:
    """The eval table and any harness scores as aligned text lines, for the run's summary."""
    lines = []
    for top, rows in ((header(metrics), table_rows(metrics)), (LM_EVAL_HEADER, harness_rows(metrics))):
        if rows:
            lines += text_table(top, rows, indent)
    return lines


def side_by_side(record: StageRecord) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of the few prompts an eval stage shows with every model's first answer, read from its
    eval/results.json; empty when there is none."""
    found = read(Path(record.output.path) / EVAL_RESULTS, EvalResults) if record.output else None
    if found is None:
        return [], []
    models = found.models
    rows = [
        [sample["prompt"], *(sample[name].replace("\n", "⏎") for name in models)] for sample in found.samples
    ]
    return ["prompt", *models], rows
