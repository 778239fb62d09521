"""The figures of `align report`, as PNG bytes: a stage's logged curves over steps, and the pipeline's DAG.

Panels are chosen by the keys a stage's `logs/metrics.jsonl` holds, not by its kind: TRL's trainers and
align's PPO log different names for the same idea, and a panel with no series is left out. Drawn with
matplotlib's Agg canvas directly (no pyplot, no display, no global backend), imported only here.
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PANELS: tuple[tuple[str, str], ...] = (
    ("loss", r"(eval_)?loss"),
    ("learning rate", r"learning_rate"),
    ("gradient norm", r"grad_norm"),
    ("token accuracy", r"(eval_)?mean_token_accuracy"),
    ("reward accuracy", r"(eval_)?rewards/accuracies"),
    ("reward margin", r"(eval_)?rewards/margins"),
    ("implicit rewards", r"(eval_)?rewards/(chosen|rejected)"),
    ("log-probs", r"(eval_)?logps/(chosen|rejected)"),
    ("reward model scores", r"(eval_)?(min|mean|max)_reward"),
    ("accuracy", r"(eval_)?accuracy"),
    ("score margin", r"(eval_)?margin"),
    ("mean reward", r"reward|rewards/(?!accuracies$|margins$|chosen$|rejected$)[^/]+(/mean)?"),
    ("KL", r"(eval_)?(objective/)?kl"),
    ("entropy", r"(eval_)?entropy"),
    ("completion length", r"completions/mean_length|completion_length"),
    ("PPO losses", r"loss/(policy|value)_avg"),
)
"""(title, log keys it plots, as a full-match pattern), in the order they are drawn. The first panel whose
pattern matches a key takes it; eval series (`eval_*`) are dashed beside their training series."""
COLUMNS = 3
MARKERS_UNDER = 25  # a series with fewer points (an eval at the start and end) gets markers


@dataclass(frozen=True)
class Plot:
    """A figure as PNG bytes, with the title of each panel it holds."""

    png: bytes
    panels: list[str]


def read_log(path: Path) -> list[dict[str, Any]]:
    """The logged steps of `logs/metrics.jsonl` (TRL's log history); none when the stage logged nothing."""
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def series(history: list[dict[str, Any]]) -> dict[str, tuple[list[int], list[float]]]:
    """Each numeric key's (steps, values), in the order keys first appear."""
    found: dict[str, tuple[list[int], list[float]]] = {}
    for entry in history:
        step = entry.get("step")
        for key, value in entry.items():
            if step is None or key in ("step", "epoch") or isinstance(value, bool):
                continue
            if isinstance(value, (int, float)):
                steps, values = found.setdefault(key, ([], []))
                steps.append(step)
                values.append(float(value))
    return found


def panels(keys: list[str]) -> list[tuple[str, list[str]]]:
    """(title, keys) of each panel that has a series among `keys`."""
    claimed: dict[str, list[str]] = {}
    for key in keys:
        title = next((title for title, pattern in PANELS if re.fullmatch(pattern, key)), None)
        if title is not None:
            claimed.setdefault(title, []).append(key)
    return [(title, claimed[title]) for title, _ in PANELS if title in claimed]


def series_style(key: str, points: int) -> tuple[str, str | None]:
    """(line style, marker) of a logged series: eval series dashed; few points marked; a metric measured at
    two points only (before and after training) as two markers with no line, since no trajectory between
    them was measured."""
    if points <= 2:
        return "none", "o"
    return ("--" if key.startswith("eval_") else "-"), ("o" if points < MARKERS_UNDER else None)


def png(figure: Any) -> bytes:
    """The figure rendered by matplotlib's Agg canvas."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=100)
    return out.getvalue()


def stage_plot(title: str, history: list[dict[str, Any]]) -> Plot | None:
    """One figure of a stage's curves over steps, a subplot per panel; None when nothing was logged."""
    from matplotlib.figure import Figure

    found = series(history)
    chosen = panels(list(found))
    if not chosen:
        return None
    rows = -(-len(chosen) // COLUMNS)
    columns = min(COLUMNS, len(chosen))
    figure = Figure(figsize=(4.2 * columns, 2.9 * rows), layout="constrained")
    figure.suptitle(title)
    for index, (name, keys) in enumerate(chosen):
        axes = figure.add_subplot(rows, columns, index + 1)
        for key in keys:
            steps, values = found[key]
            style, marker = series_style(key, len(values))
            size = 6 if style == "none" else 3
            axes.plot(steps, values, linestyle=style, marker=marker, markersize=size, label=key)
        axes.set_title(name)
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
        if len(keys) > 1:
            axes.legend(fontsize="small")
    return Plot(png(figure), [name for name, _ in chosen])


def depths(order: list[str], edges: dict[str, list[str]]) -> dict[str, int]:
    """Each stage's column in the DAG: one past the deepest stage it reads ( `order` is topological)."""
    found: dict[str, int] = {}
    for name in order:
        found[name] = 1 + max((found[dep] for dep in edges.get(name, []) if dep in found), default=-1)
    return found


def dag_plot(order: list[str], edges: dict[str, list[str]], labels: dict[str, str]) -> Plot:
    """The pipeline's stages as boxes in columns by depth, an arrow from each stage to those it feeds;
    `labels` is the second line of each box (its kind and status)."""
    from matplotlib.figure import Figure

    column = depths(order, edges)
    rows: dict[int, list[str]] = {}
    for name in order:
        rows.setdefault(column[name], []).append(name)
    place = {name: (column[name], -row) for names in rows.values() for row, name in enumerate(names)}
    width, height = max(column.values()) + 1, max(len(names) for names in rows.values())
    figure = Figure(figsize=(2.4 * width + 0.4, 1.1 * height + 0.4))
    axes = figure.add_axes((0, 0, 1, 1))
    axes.set_xlim(-0.6, width - 0.4)
    axes.set_ylim(-height + 0.5, 0.5)
    axes.axis("off")
    for name, deps in edges.items():
        for dep in deps:
            axes.annotate(
                "",
                xy=(place[name][0] - 0.36, place[name][1]),
                xytext=(place[dep][0] + 0.36, place[dep][1]),
                arrowprops={"arrowstyle": "->", "color": "0.3"},
            )
    for name, (x, y) in place.items():
        axes.text(
            x,
            y,
            f"{name}\n{labels.get(name, '')}",
            ha="center",
            va="center",
            fontsize=9,
            bbox={"boxstyle": "round", "facecolor": "#e8f0fe", "edgecolor": "#4a6fa5"},
        )
    return Plot(png(figure), ["stages"])


def interval_plot(title: str, rows: list[Any]) -> Plot:
    """An eval stage's figures: per reward, each model's mean with its 95% interval as an error bar, and
    beside it the win rate against the baseline with its interval (0.5, no difference, dashed). `rows` are
    align.report.eval_tables.Figure."""
    from matplotlib.figure import Figure

    rewards = list(dict.fromkeys(row.reward for row in rows))
    figure = Figure(figsize=(8.4, 0.5 + 0.45 * len(rows) + 0.6 * len(rewards)), layout="constrained")
    figure.suptitle(title)
    grid = figure.subplots(len(rewards), 2, squeeze=False)
    for (mean_axes, win_axes), reward in zip(grid, rewards, strict=True):
        found = [row for row in rows if row.reward == reward]
        names = [row.model for row in found]
        places = list(range(len(found)))
        means = [row.mean for row in found]
        spans = [[row.mean - row.low for row in found], [row.high - row.mean for row in found]]
        mean_axes.errorbar(means, places, xerr=spans, fmt="o", capsize=4)
        mean_axes.set_title(f"{reward}: mean [95% CI]", fontsize="medium")
        wins = [(i, row.win) for i, row in enumerate(found) if row.win is not None]
        if wins:
            at = [i for i, _ in wins]
            values = [win[0] for _, win in wins]
            errors = [[win[0] - win[1] for _, win in wins], [win[2] - win[0] for _, win in wins]]
            win_axes.errorbar(values, at, xerr=errors, fmt="s", color="#b5523b", capsize=4)
        win_axes.axvline(0.5, linestyle="--", color="0.5")
        win_axes.set_xlim(-0.05, 1.05)
        win_axes.set_title(f"{reward}: win rate vs baseline (ties half)", fontsize="medium")
        for axes in (mean_axes, win_axes):
            axes.set_yticks(places, names)
            axes.set_ylim(-0.6, len(found) - 0.4)
            axes.invert_yaxis()
            axes.grid(alpha=0.3, axis="x")
    return Plot(png(figure), [f"{reward}: mean and win rate" for reward in rewards])


def log_scaled(values: list[Any]) -> bool:
    """Whether swept values spread over a decade or more of positive numbers (a learning rate): a log axis."""
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return len(numbers) == len(values) and min(numbers) > 0 and max(numbers) >= 10 * min(numbers)


def sweep_plot(title: str, metric: str, swept: dict[str, list[Any]], points: list[Any]) -> Plot:
    """A sweep's metric against each swept parameter, a panel each, with interval bars where the metric has
    them. `points`: (value, (low, high) or None) per variant, best first (starred); `swept`: each
    parameter's value per point."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4.4 * len(swept), 3.4), layout="constrained")
    figure.suptitle(title, fontsize="medium")
    for axes, (name, values) in zip(
        figure.subplots(1, len(swept), squeeze=False)[0], swept.items(), strict=True
    ):
        names = list(dict.fromkeys(map(str, values)))
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        places = values if numeric else [names.index(str(v)) for v in values]
        for index, ((mean, interval), at) in enumerate(zip(points, places, strict=True)):
            bars = None if interval is None else [[mean - interval[0]], [interval[1] - mean]]
            look = {"fmt": "*", "markersize": 12, "color": "#b5523b"} if index == 0 else {"fmt": "o"}
            axes.errorbar([at], [mean], yerr=bars, capsize=4, **{"color": "#4a6fa5", **look})
        if not numeric:
            axes.set_xticks(range(len(names)), names)
        elif log_scaled(values):
            axes.set_xscale("log")
        axes.set_xlabel(name)
        axes.set_ylabel(metric)
        axes.grid(alpha=0.3)
    return Plot(png(figure), [f"{metric} against {name}" for name in swept])
