"""`align report` (a run's pages) and `align sweep-report` (a sweep's variants ranked)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from align.cli.options import pipeline_command
from align.errors import AlignError


def cmd_report(args: argparse.Namespace) -> int:
    from align.report.pages import write_report
    from align.report.run_folder import load_run

    target = Path(args.target)
    if not target.exists():
        raise AlignError(f"{target}: no such pipeline file or run folder")
    run = load_run(target)
    page, summary = write_report(run, Path(args.out) if args.out else run.folder)
    print(page)
    print(summary)
    return 0


def cmd_sweep_report(args: argparse.Namespace) -> int:
    from align.pipeline.file import load
    from align.report.sweep_report import format_sweep, link_best, read_sweep, write_page

    report = read_sweep(load(args.file, args.set), args.file, args.set)
    links = link_best(report)
    print(format_sweep(report))
    print(write_page(report, links))
    for link in links:
        print(f"{link} -> {os.readlink(link)}")
    return 0


def add_report(commands) -> None:
    report = commands.add_parser(
        "report", help="write a run's report: report.html (plots inline) and report.md, beside the run"
    )
    report.add_argument("target", help="the pipeline YAML file, or its run folder (runs/<pipeline>)")
    report.add_argument("--out", help="the folder to write into (default: the run folder)")
    report.set_defaults(handler=cmd_report)


def add_sweep_report(commands) -> None:
    pipeline_command(
        commands,
        "sweep-report",
        cmd_sweep_report,
        "a sweep's variants ranked with 95%% intervals, the best and whether the data separate it from the "
        "runner-up; writes sweep-report.md and its plot, and links the best's outputs as best/STAGE",
    )
