"""The two pages of `align report`: a self-contained HTML page (plots as PNG data URIs, inline style, no
script, nothing fetched) and a Markdown summary that names the same facts without the plots."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from align.records import StageRecord
from align.report.eval_tables import (
    LM_EVAL_HEADER,
    figures,
    harness_rows,
    header,
    is_eval,
    side_by_side,
    table_rows,
)
from align.report.plots import Plot, interval_plot
from align.report.run_folder import (
    MEASURED_HEADER,
    OVERVIEW,
    PLAN_HEADER,
    RunReport,
    StageReport,
    held_out_rows,
    memory_rows,
    number,
    other_metrics,
    overview_rows,
    sample_rows,
    settings,
)
from align.report.status import where_ranks_ran

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f5f8; }
td.text { white-space: pre-wrap; font-family: monospace; max-width: 28em; }
section { border-top: 2px solid #4a6fa5; margin-top: 2em; }
img { max-width: 100%; }
pre { background: #f6f8fa; padding: 0.6em; overflow-x: auto; }
"""


def escape(value: Any) -> str:
    return html.escape(str(value))


def data_uri(plot: Plot) -> str:
    return "data:image/png;base64," + base64.b64encode(plot.png).decode("ascii")


def image(plot: Plot, alt: str) -> str:
    """The plot inline; `data-panels` names its panels, in order."""
    panels = escape("; ".join(plot.panels))
    return f'<img src="{data_uri(plot)}" alt="{escape(alt)}" data-panels="{panels}">'


def html_table(header: list[str] | None, rows: list[list[Any]], text_columns: tuple[int, ...] = ()) -> str:
    head = "<tr>" + "".join(f"<th>{escape(cell)}</th>" for cell in header) + "</tr>" if header else ""
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="text">{escape(cell)}</td>' if index in text_columns else f"<td>{escape(cell)}</td>"
            for index, cell in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table>{head}{body}</table>"


def held_out_table(metrics: dict[str, float]) -> list[list[str]]:
    return [
        [name, number(before), number(after), number(after - before)]
        for name, before, after in held_out_rows(metrics)
    ]


HELD_OUT = ["held-out metric", "before", "after", "change"]
SAMPLES = ["prompt", "before (greedy)", "after (greedy)"]


def html_stage(stage: StageReport) -> str:
    """A stage's section: facts, plots, held-out metrics, samples, memory and settings."""
    record = stage.record
    parts = [f'<section id="stage-{escape(stage.name)}"><h2>{escape(stage.name)}</h2>']
    reads = ", ".join(stage.reads) or "(base model)"
    facts = [("kind", stage.kind), ("status", stage.status), ("reads", reads)]
    if record is not None:
        facts += [
            ("backend", f"{record.resolved.backend}: {record.resolved.backend_reason}"),
            ("steps trained", record.steps_trained),
            ("resumed from step", record.resumed_from or ""),
            ("retries", record.retries if record.succeeded else ""),  # counted once the stage ends
            ("ranks", where_ranks_ran(record).removeprefix(", ranks ")),
            ("error", record.error),
        ]
    parts.append(html_table(None, [[key, value] for key, value in facts if value not in ("", None)]))
    if stage.plot is not None:
        parts.append(image(stage.plot, f"{stage.name}: " + ", ".join(stage.plot.panels)))
    metrics = stage.metrics
    if is_eval(metrics):
        parts.append(html_eval(stage.name, record))
    if held_out_rows(metrics):
        parts.append("<h3>Held out, before and after</h3>" + html_table(HELD_OUT, held_out_table(metrics)))
    if other_metrics(metrics) and not is_eval(metrics):
        rows = [[key, number(value)] for key, value in other_metrics(metrics).items()]
        parts.append("<h3>Other metrics</h3>" + html_table(["metric", "value"], rows))
    if sample_rows(stage):
        parts.append(
            "<h3>Held-out samples</h3>" + html_table(SAMPLES, sample_rows(stage), text_columns=(0, 1, 2))
        )
    plan, measured = memory_rows(stage)
    if plan or measured:
        parts.append("<h3>Memory per rank</h3>")
        parts.append(
            html_table(PLAN_HEADER, plan) if plan else "<p>no memory plan (architecture unknown)</p>"
        )
        if measured:
            parts.append(html_table(MEASURED_HEADER, measured))
    parts.append(f"<details><summary>settings</summary><pre>{escape(settings(stage))}</pre></details>")
    return "\n".join(parts) + "</section>"


def html_eval(name: str, record: StageRecord) -> str:
    """An eval stage's comparison: the table, its plot with interval bars, lm-eval scores, answers side by
    side."""
    metrics = record.metrics
    parts = ["<h3>Models compared (95% bootstrap intervals over prompts)</h3>"]
    if rows := table_rows(metrics):
        parts.append(html_table(header(metrics), rows))
        parts.append(image(interval_plot(f"{name}: models compared", figures(metrics)), f"{name}: intervals"))
    if rows := harness_rows(metrics):
        parts.append("<h3>lm-evaluation-harness</h3>" + html_table(LM_EVAL_HEADER, rows))
    top, rows = side_by_side(record)
    if rows:
        parts.append("<h3>Answers side by side</h3>" + html_table(top, rows, tuple(range(len(top)))))
    return "\n".join(parts)


def markdown_eval(record: StageRecord) -> list[str]:
    metrics, lines = record.metrics, []
    if rows := table_rows(metrics):
        lines += md_table(header(metrics), rows)
    if rows := harness_rows(metrics):
        lines += md_table(LM_EVAL_HEADER, rows)
    top, rows = side_by_side(record)
    return lines + (md_table(top, rows) if rows else [])


def html_page(run: RunReport) -> str:
    title = f"align report: {run.pipeline}"
    body = [
        f"<h1>{escape(title)}</h1>",
        f"<p>run folder: <code>{escape(run.folder)}</code></p>",
        image(run.dag, "stages and which feeds which"),
        html_table(OVERVIEW, overview_rows(run)),
        *(html_stage(stage) for stage in run.stages),
    ]
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n"
    )


def md_cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", "<br>")


def md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(md_cell(cell) for cell in row) + " |" for row in rows] + [""]


def markdown_stage(stage: StageReport) -> list[str]:
    lines = [f"## {stage.name}", ""]
    if stage.plot is not None:
        lines += [f"Plots: {', '.join(stage.plot.panels)}.", ""]
    metrics = stage.metrics
    if is_eval(metrics):
        lines += markdown_eval(stage.record)
    if held_out_rows(metrics):
        lines += md_table(HELD_OUT, held_out_table(metrics))
    if sample_rows(stage):
        lines += md_table(SAMPLES, sample_rows(stage))
    plan, measured = memory_rows(stage)
    if plan:
        lines += md_table(PLAN_HEADER, plan)
    if measured:
        lines += md_table(MEASURED_HEADER, measured)
    return lines + [
        "<details><summary>settings</summary>",
        "",
        "```json",
        settings(stage),
        "```",
        "</details>",
        "",
    ]


def markdown_page(run: RunReport, page: Path) -> str:
    dag = [f"- {stage.name} <- {', '.join(stage.reads)}" for stage in run.stages if stage.reads]
    lines = [
        f"# align report: {run.pipeline}",
        "",
        f"Run folder `{run.folder}`; the plots are in `{page.name}`.",
        "",
        *md_table(OVERVIEW, overview_rows(run)),
        "Which stage feeds which:",
        "",
        *(dag or ["- (no stage reads another)"]),
        "",
    ]
    for stage in run.stages:
        lines += markdown_stage(stage)
    return "\n".join(lines)


def write_report(run: RunReport, out: Path) -> tuple[Path, Path]:
    """Write `report.html` and `report.md` into `out`; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    page, summary = out / "report.html", out / "report.md"
    page.write_text(html_page(run))
    summary.write_text(markdown_page(run, page))
    return page, summary
