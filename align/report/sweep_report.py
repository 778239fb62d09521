"""`align sweep-report`: a sweep's verdict with its uncertainty, from what its run left on disk.

Every variant `sweep.json` names (and, for a grid, each one not run yet) with its values, the sweep's
metric and its 95% interval (an eval stage's bootstrap interval over prompts; a stage's own recorded
metric has none), its win rate against the eval's baseline, and how it ended; best first by `mode`, and
whether the best's interval separates from the runner-up's. Its page (`sweep-report.md`, with the plot
`sweep-report.png`) is written beside the run, and the best variant's outputs are linked as
`best/<stage>`.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from align.config.spec import Pipeline
from align.errors import AlignError
from align.pipeline.sweep import Sweep, short_keys, shown
from align.report.eval_tables import interval, text_table
from align.report.pages import md_table
from align.report.plots import sweep_plot
from align.report.run_folder import number
from align.run.records import pipeline_dir, read_stage
from align.run.sweep_state import STATE, VariantEnd, key, read_state

BEST = "best"
PAGE = "sweep-report.md"
PLOT = "sweep-report.png"
NOT_RUN = "not run"


@dataclass(frozen=True)
class Variant:
    """One variant as the table shows it: its values, how its run ended (`status` as `sweep.json` says,
    or `not run`), and its figures, None where it recorded none."""

    values: dict[str, Any]
    label: str
    status: str
    ended: str
    value: float | None = None
    interval: tuple[float, float] | None = None
    win: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class SweepReport:
    """A sweep's variants, best first (those with no value last), with where its run lives."""

    pipeline: str
    folder: Path
    sweep: Sweep
    baseline: str | None  # the eval stage's baseline, for an `eval/<model>/<reward>` metric
    variants: list[Variant]

    @property
    def metric(self) -> str:
        return self.sweep.spec.metric

    @property
    def ranked(self) -> list[Variant]:
        return [variant for variant in self.variants if variant.value is not None]

    @property
    def best(self) -> Variant | None:
        return next(iter(self.ranked), None)

    @property
    def runner_up(self) -> Variant | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    @property
    def separated(self) -> bool | None:
        """Whether the best's interval and the runner-up's do not overlap; None without two intervals."""
        best, second = self.best, self.runner_up
        if best is None or second is None or best.interval is None or second.interval is None:
            return None
        return best.interval[0] > second.interval[1] or best.interval[1] < second.interval[0]


def run_command(file: str, overrides: list[str]) -> str:
    return shlex.join(["align", "run", file, *(part for item in overrides for part in ("--set", item))])


def read_sweep(pipeline: Pipeline, file: str, overrides: list[str]) -> SweepReport:
    """The report of the sweep of `pipeline` (read from `file` with `overrides`) as its run left it."""
    sweep = pipeline.sweep
    if sweep is None:
        raise AlignError(
            f"{file} has no `sweep:`: align sweep-report reads a pipeline with `sweep:`; "
            f"`align report {file}` shows a plain run"
        )
    folder = pipeline_dir(pipeline.defaults.output_root, pipeline.name)
    known = read_state(folder / STATE, sweep)
    if not known:
        state, run = folder / STATE, run_command(file, overrides)
        why = (
            f"{state} holds another sweep (the file's `sweep:` changed since)"
            if state.exists()
            else f"no {state}"
        )
        raise AlignError(f"the sweep of {file} has not run yet: {why}; `{run}` runs it")
    drawn = {entry.key for entry in known}
    unrun = [values for values in sweep.grid or [] if key(values) not in drawn]
    evals = {name: metrics_of(folder / name) for name in sweep.evals}
    variants = [variant(sweep, folder, evals, entry.values, entry) for entry in known]
    variants += [variant(sweep, folder, evals, values, None) for values in unrun]
    return SweepReport(pipeline.name, folder, sweep, baseline(pipeline), ranked(variants, sweep.spec.mode))


def baseline(pipeline: Pipeline) -> str | None:
    """The baseline of the eval stage that compares the metric's model; None for a stage's metric."""
    head, _, rest = pipeline.sweep.spec.metric.partition("/")
    if head != "eval":
        return None
    model = rest.partition("/")[0]
    compares = [
        name for name in pipeline.sweep.evals if model in pipeline.sweep.raw["stages"][name]["models"]
    ]
    return pipeline.stages[compares[0]].baseline_name


def metrics_of(folder: Path) -> dict[str, float]:
    """A stage folder's recorded metrics; none before it has run."""
    record = read_stage(folder)
    return record.metrics if record else {}


def variant_metrics(
    sweep: Sweep, folder: Path, evals: dict[str, dict[str, float]], values: dict[str, Any]
) -> dict[str, float]:
    """A variant's recorded metrics under the names the sweep's metric uses: `dpo/eval_loss` from the
    record of `dpo[beta=0.1]`, `eval/merged/total` (and its `/low`, `/win`...) from an eval stage's
    figures for `merged[beta=0.1]`."""
    found = {}
    for stage in sweep.repeated:
        recorded = metrics_of(folder / sweep.name(stage, values))
        found |= {f"{stage}/{name}": value for name, value in recorded.items()}
    label = f"[{sweep.label(values)}]/"
    for metrics in evals.values():
        found |= {name.replace(label, "/", 1): value for name, value in metrics.items() if label in name}
    return found


def variant(
    sweep: Sweep,
    folder: Path,
    evals: dict[str, dict[str, float]],
    values: dict[str, Any],
    entry: VariantEnd | None,
) -> Variant:
    """One entry of `sweep.json` (or a grid's variant not run yet, with none) as a row; its figures only if
    it finished."""
    status = entry.status if entry is not None else NOT_RUN
    label = sweep.label(values)
    if status != "succeeded":
        return Variant(values, label, status, ending(entry))
    metrics, metric = variant_metrics(sweep, folder, evals, values), sweep.spec.metric
    value = metrics.get(metric)
    if value is None:
        return Variant(values, label, status, f"done, but its records hold no {metric}")
    bounds = (metrics[f"{metric}/low"], metrics[f"{metric}/high"]) if f"{metric}/low" in metrics else None
    win = None
    if f"{metric}/win" in metrics:
        win = (metrics[f"{metric}/win"], metrics[f"{metric}/win_low"], metrics[f"{metric}/win_high"])
    return Variant(values, label, status, "done", value, bounds, win)


def ending(entry: VariantEnd | None) -> str:
    """How a variant that did not finish ended, for a person."""
    status = entry.status if entry is not None else NOT_RUN
    if status == "stopped":
        return entry.reason or f"stopped early by ASHA at step {entry.step}"
    if status == "failed":
        return f"failed: {entry.error or 'see its stages logs/'}"
    if status == "interrupted":
        return "interrupted: the next `align run` resumes it"
    return "not run yet"


def ranked(variants: list[Variant], mode: str) -> list[Variant]:
    """Best first by `mode`, those with no value last (each group in the sweep's order)."""
    scored = sorted(
        (v for v in variants if v.value is not None), key=lambda v: v.value, reverse=mode == "max"
    )
    return scored + [v for v in variants if v.value is None]


def table(report: SweepReport) -> tuple[list[str], list[list[str]]]:
    """The header and one row per variant: values, metric (with its interval), win rate, status."""
    keys = short_keys(list(report.sweep.spec.parameters))
    shows_win = any(variant.win for variant in report.variants)
    header = [
        *keys.values(),
        f"{report.metric} [95% CI]" if report.baseline else f"{report.metric} (no interval)",
    ]
    header += [f"win rate vs {report.baseline} [95% CI], ties half"] if shows_win else []
    rows = []
    for variant in report.variants:
        row = [shown(variant.values[path]) for path in keys]
        row.append(figure(variant))
        if shows_win:
            row.append(interval(*variant.win) if variant.win else "-")
        rows.append([*row, variant.ended])
    return [*header, "status"], rows


def figure(variant: Variant) -> str:
    if variant.value is None:
        return "-"
    return interval(variant.value, *variant.interval) if variant.interval else number(variant.value)


def verdict(report: SweepReport) -> list[str]:
    """The best variant, and whether the data separate it from the runner-up, in plain words."""
    best, second, metric = report.best, report.runner_up, report.metric
    if best is None:
        return [f"no variant has recorded {metric} yet"]
    lines = [f"best: {best.label} ({metric} {figure(best)}, {report.sweep.spec.mode} is better)"]
    tied = [variant for variant in report.ranked if variant.value == best.value]
    if len(tied) > 1:
        lines.append(
            f"{len(tied)} variants tie at {number(best.value)}: the best is the first in the sweep's order"
        )
    if second is None:
        return [*lines, "no runner-up: no other variant has a value to compare with"]
    lines.append(f"runner-up: {second.label} ({figure(second)})")
    if report.separated is None:
        lines.append(f"{metric} has no interval (one value per variant): the data cannot say if they differ")
    elif report.separated:
        lines.append("their 95% intervals do not overlap: the best is better than the runner-up on this data")
    else:
        lines.append("their 95% intervals overlap: the data cannot tell them apart")
    return lines


def format_sweep(report: SweepReport) -> str:
    """The table and the verdict as console text."""
    head = f"sweep of {report.sweep.stage}: {len(report.variants)} variants by {report.metric}"
    return "\n".join([head, *text_table(*table(report)), *(f"  {line}" for line in verdict(report))])


def link_best(report: SweepReport) -> list[Path]:
    """`best/<stage>` -> `../<stage>[<values>]` for each repeated stage the best variant has (relative, so
    the run folder can move); an earlier best's links are replaced."""
    folder = report.folder / BEST
    earlier = [path for path in folder.iterdir() if path.is_symlink()] if folder.is_dir() else []
    links = []
    for stage in report.sweep.repeated if report.best else []:
        name = report.sweep.name(stage, report.best.values)
        link, fresh = folder / stage, folder / f".{stage}.new"
        if not (report.folder / name).is_dir():
            continue
        if link.exists() and not link.is_symlink():
            raise AlignError(f"{link} is not a link align made: move it to link the best variant there")
        folder.mkdir(exist_ok=True)
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(Path("..") / name)
        os.replace(fresh, link)
        links.append(link)
    for path in earlier:
        if path not in links:
            path.unlink()
    return links


def write_page(report: SweepReport, links: list[Path]) -> Path:
    """`sweep-report.md` (and its plot, when a variant has a value) in the run folder; returns its path."""
    spec = report.sweep.spec
    lines = [
        f"# Sweep: {report.pipeline}",
        "",
        f"{len(report.variants)} variants of `{report.sweep.stage}` ({spec.method}), ranked by "
        f"`{report.metric}` ({spec.mode} is better). Run folder `{report.folder}`.",
        "",
        *md_table(*table(report)),
        *(f"- {line}" for line in verdict(report)),
        "",
    ]
    if report.ranked:
        swept = {
            short: [variant.values[path] for variant in report.ranked]
            for path, short in short_keys(list(spec.parameters)).items()
        }
        points = [(variant.value, variant.interval) for variant in report.ranked]
        title = f"by variant: {'95% interval bars' if report.baseline else 'no intervals'}, the best starred"
        (report.folder / PLOT).write_bytes(sweep_plot(title, report.metric, swept, points).png)
        lines += [f"![{report.metric} against each swept value; the best starred]({PLOT})", ""]
    if links:
        lines += ["The best variant's outputs:", ""]
        lines += [f"- `{BEST}/{link.name}` -> `{os.readlink(link)}`" for link in links]
    (report.folder / PAGE).write_text("\n".join(lines) + "\n")
    return report.folder / PAGE
