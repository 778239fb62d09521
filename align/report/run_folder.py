"""`align report`: what a run did, from what it left on disk, as one self-contained HTML page (its plots
embedded as PNG data URIs: no network, no script) and a Markdown summary.

Everything comes from the stage folders: each record (`align-stage.json`: config, status, times, resolved
backend, metrics, held-out samples, the memory plan), `logs/metrics.jsonl` (the curves) and
`logs/placement-rank*.json` (what each rank measured). Which stage feeds which is read from the stages'
`${stages.NAME.output}` references; a pipeline file adds the stages that have not run yet.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from align.errors import AlignError
from align.models.memory import format_bytes
from align.pipeline.graph import order, reference_target, strings
from align.records import StageRecord
from align.report.plots import Plot, dag_plot, read_log, stage_plot
from align.run.records import RECORD, attempts, read_stage


@dataclass
class StageReport:
    """One stage as the report shows it: its kind and config (from its record, or the pipeline file when it
    has not run), its record, the stages it reads, its curves and what each rank measured."""

    name: str
    kind: str
    config: dict[str, Any]
    record: StageRecord | None
    reads: list[str]
    plot: Plot | None = None
    placement: list[dict[str, Any]] = field(default_factory=list)

    @property
    def status(self) -> str:
        return self.record.status if self.record else "not run"

    @property
    def seconds(self) -> float | None:
        if self.record is None or not self.record.ended:
            return None
        return self.record.ended - self.record.started

    @property
    def metrics(self) -> dict[str, float]:
        return self.record.metrics if self.record else {}


@dataclass
class RunReport:
    """A pipeline's run folder and its stages in dependency order."""

    pipeline: str
    folder: Path
    stages: list[StageReport]
    dag: Plot


def reads_from(config: dict[str, Any]) -> list[str]:
    """The stages whose outputs a stage's config refers to, in the order it names them."""
    found = (reference_target(value) for _, value in strings(config, "stage"))
    return list(dict.fromkeys(name for name in found if name))


ATTEMPT = re.compile(r"\.(.+)\.(tmp|failed)-.*")
"""An unfinished attempt's folder name (`records.scratch_name`, `records.keep_failed`): `.NAME.tmp-ID`."""


def stage_names(folder: Path) -> list[str]:
    """The stages with a folder here: published ones, and those with only an unfinished attempt."""
    names = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        attempt = ATTEMPT.fullmatch(path.name)
        if path.is_dir() and (attempt or not path.name.startswith(".")):
            names.append(attempt.group(1) if attempt else path.name)
    return list(dict.fromkeys(names))


def latest_record(folder: Path) -> StageRecord | None:
    """A published stage's record, else that of its latest attempt: a failed or interrupted one, or one
    still running (or killed while it ran)."""
    record = read_stage(folder)
    if record is not None:
        return record
    found = [r for r in map(read_stage, attempts(folder)) if r]
    return max(found, key=lambda r: (r.status != "running", r.started), default=None)


def run_target(target: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The run folder and the stages' configs by name, in file order, when `target` is a pipeline file;
    else `target` itself, with no configs beyond what its records hold."""
    if target.is_dir():
        return target.resolve(), {}
    from align.pipeline.file import load

    pipeline = load(target)
    folder = Path(pipeline.defaults.output_root).resolve() / pipeline.name
    if pipeline.sweep is not None and pipeline.sweep.grid is None:  # drawn as it ran: as sweep.json says
        from align.pipeline.file import with_variants
        from align.run.sweep_state import STATE, read_state

        drawn = [variant.values for variant in read_state(folder / STATE, pipeline.sweep)]
        pipeline = with_variants(pipeline.sweep, drawn, pipeline.source_dir) if drawn else pipeline
    return folder, {name: stage.model_dump(mode="json") for name, stage in pipeline.stages.items()}


def load_run(target: Path) -> RunReport:
    """Read the run that `target` (a pipeline file or its run folder) names."""
    folder, configs = run_target(target)
    found = {name: latest_record(folder / name) for name in stage_names(folder)}
    found = {name: record for name, record in found.items() if record}
    if not found:
        raise AlignError(f"{folder}: no stage has run here (no {RECORD}); `align run` the pipeline first")
    by_start = sorted(found, key=lambda name: found[name].started)
    names = list(configs) or by_start
    names += [name for name in by_start if name not in names]  # stages since removed from the file
    edges = {name: reads_from(configs.get(name) or found[name].config) for name in names}
    edges = {name: [dep for dep in deps if dep in edges] for name, deps in edges.items()}
    stages = [
        stage_report(name, found.get(name), configs.get(name), folder / name, edges[name])
        for name in order(edges)[0]
    ]
    labels = {stage.name: f"{stage.kind} · {stage.status}" for stage in stages}
    pipeline = next(iter(found.values())).pipeline
    return RunReport(pipeline, folder, stages, dag_plot([s.name for s in stages], edges, labels))


def stage_report(
    name: str, record: StageRecord | None, config: dict[str, Any] | None, folder: Path, reads: list[str]
) -> StageReport:
    """A stage's report: what its record says, else (not run yet) its config in the pipeline file."""
    logs = folder / "logs"
    placement = [json.loads(path.read_text()) for path in sorted(logs.glob("placement-rank*.json"))]
    plot = stage_plot(name, read_log(logs / "metrics.jsonl"))
    kind, config = (record.kind, record.config) if record else (config["kind"], config)
    return StageReport(name, kind, config, record, reads, plot, placement)


def held_out_rows(metrics: dict[str, float]) -> list[tuple[str, float, float]]:
    """(name, before, after) of each metric measured on both sides of training."""
    names = [key[: -len("_before")] for key in metrics if key.endswith("_before")]
    return [
        (name, metrics[f"{name}_before"], metrics[f"{name}_after"])
        for name in names
        if f"{name}_after" in metrics
    ]


def other_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The metrics that are not a before/after pair."""
    paired = {f"{name}_{side}" for name, *_ in held_out_rows(metrics) for side in ("before", "after")}
    return {key: value for key, value in metrics.items() if key not in paired}


def number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def duration(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds:.1f}s"


def overview_rows(run: RunReport) -> list[list[str]]:
    """One row per stage: the facts a reader scans first."""
    rows = []
    for stage in run.stages:
        resolved = stage.record.resolved if stage.record else None
        ran = (resolved.backend, str(resolved.workers), resolved.precision) if resolved else ("", "", "")
        row = [stage.name, stage.kind, ", ".join(stage.reads) or "(base model)", stage.status]
        rows.append([*row, duration(stage.seconds), *ran])
    return rows


OVERVIEW = ["stage", "kind", "reads", "status", "time", "backend", "workers", "precision"]


def sample_rows(stage: StageReport) -> list[list[str]]:
    """(prompt, before, after) per held-out sample; a completion's line breaks shown as ⏎, so that one
    which only repeats them reads as what it is."""
    return [
        [sample["prompt"], sample["before"].replace("\n", "⏎"), sample["after"].replace("\n", "⏎")]
        for sample in (stage.record.samples if stage.record else [])
    ]


def memory_rows(stage: StageReport) -> tuple[list[list[str]], list[list[str]]]:
    """The plan's per-rank rows (what, device, host) and each rank's measured peaks and held elements."""
    plan = [
        [row.what, format_bytes(row.device), format_bytes(row.host) if row.host else ""]
        for row in (stage.record.memory_plan if stage.record else None) or []
    ]
    measured = [
        [
            str(rank.get("rank", "")),
            format_bytes(rank["peak_rss_bytes"]) if rank.get("peak_rss_bytes") else "",
            format_bytes(rank["peak_device_bytes"]) if rank.get("peak_device_bytes") else "",
            f"{rank.get('param_elements_local', 0):,}",
            f"{rank.get('optimizer_state_elements_local', 0):,}",
        ]
        for rank in stage.placement
    ]
    return plan, measured


PLAN_HEADER = ["per rank (plan)", "device", "host (offloaded)"]
MEASURED_HEADER = [
    "rank",
    "peak RSS (host)",
    "peak device",
    "parameter elements held",
    "optimizer state elements",
]


def settings(stage: StageReport) -> str:
    """The stage's config as written, and what the run resolved it to, as indented JSON."""
    resolved = stage.record.resolved.model_dump(mode="json") if stage.record else {}
    shown = {"config": stage.config, "resolved": resolved}
    return json.dumps(shown, indent=2)
