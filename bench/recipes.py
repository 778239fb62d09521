"""The CPU recipes' tables, from their runs' records: per recipe, each stage's wall time and their sum, and
the eval stage's figures (means with 95% intervals, win rates against the base), with the machine they ran
on; written to bench/results/recipes-cpu.md. `make recipes` runs it after the runs. It reads, never runs.

    .venv/bin/python bench/recipes.py [recipes/X.yaml ...]   # default: every recipes/*.yaml
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from align.pipeline.file import load
from align.report.eval_tables import Figure, figures, header, table_rows
from align.run.records import read_record, stage_dir

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "recipes-cpu.md"


def stage_records(path: Path) -> tuple[Any, dict[str, dict[str, Any]]]:
    """The pipeline and each stage's record; a stage that has not succeeded stops the table."""
    pipeline = load(str(path), [])
    found = {}
    for name in pipeline.stages:
        record = read_record(stage_dir(pipeline.defaults.output_root, pipeline.name, name))
        if record is None or record.get("status") != "succeeded":
            sys.exit(f"{path}: stage {name} has not succeeded; run `make recipes` (or `align run {path}`)")
        found[name] = record
    return pipeline, found


def minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"


def machine() -> str:
    """The CPU, its cores and memory, and the load when this page was written: the runs share the machine."""
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line
        ]
        cpu = names[0] if names else cpu
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    cores = os.cpu_count()
    return f"{cpu}, {cores} cores, {memory:.0f} GiB, no GPU; load average (1, 5, 15 min) when written: {load}"


def verdict(figure: Figure, base: Figure) -> str:
    """Whether the gain is real by the recipes' rule: the win rate's interval above 0.5, or the mean's
    interval above the base's."""
    wins = figure.win is not None and figure.win[1] > 0.5
    above = figure.low > base.high
    if wins or above:
        why = [f"win rate's lower bound {figure.win[1]:.3f} > 0.5"] if wins else []
        why += [f"mean's interval above the base's ({figure.low:.3f} > {base.high:.3f})"] if above else []
        return f"**{figure.model}** beats the base on `{figure.reward}`: {'; '.join(why)}"
    return f"**{figure.model}** does not beat the base on `{figure.reward}` (no interval clears)"


def section(path: Path) -> list[str]:
    pipeline, records = stage_records(path)
    relative = path.resolve().relative_to(ROOT)
    times = {name: record["ended"] - record["started"] for name, record in records.items()}
    evals = [record for record in records.values() if record["kind"] == "eval"]
    first = min(records.values(), key=lambda record: record["started"])
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(first["started"]))
    lines = [
        f"## {pipeline.name}",
        "",
        f"`align run {relative}` from `{pipeline.base_model}`, started {started} at git "
        f"{str(first.get('git_sha'))[:7]}.",
        "",
        "| stage | kind | wall time |",
        "|---|---|---:|",
        *(f"| {name} | {records[name]['kind']} | {minutes(seconds)} |" for name, seconds in times.items()),
        f"| **all** | | **{minutes(sum(times.values()))}** |",
        "",
    ]
    for record in evals:
        metrics = record["metrics"]
        lines += [
            f"| {' | '.join(header(metrics))} |",
            "|---|---|---|---:|---|",
            *(f"| {' | '.join(row)} |" for row in table_rows(metrics)),
            "",
        ]
        found = figures(metrics)
        bases = {figure.reward: figure for figure in found if figure.win is None}
        lines += [f"- {verdict(figure, bases[figure.reward])}" for figure in found if figure.win is not None]
        lines.append("")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipes", nargs="*", type=Path, default=sorted((ROOT / "recipes").glob("*.yaml")))
    args = parser.parse_args()
    lines = [
        "# The CPU recipes: SmolLM2-135M-Instruct before and after, on held-out prompts",
        "",
        f"Written by `bench/recipes.py` from the runs' records. Machine: {machine()}.",
        "Wall times are each stage's own (its record's start to end), so a stage skipped as up to date "
        "counts the time it took when it ran. Intervals: 95% bootstrap (BCa) over prompts; win rates count "
        "ties half.",
        "",
    ]
    for path in args.recipes:
        lines += section(path)
    OUT.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
