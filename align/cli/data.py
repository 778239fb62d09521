"""`align data`: a stage's rows as its trainer sees them."""

from __future__ import annotations

import argparse
import sys

from align.cli.options import pipeline_command, positive_count
from align.cli.plan_file import build_plan


def cmd_data(args: argparse.Namespace) -> int:
    import warnings

    from align.report.rows_view import format_preview, preview

    # TRL's configs set `gradient_checkpointing`, which transformers now warns is renamed: not the user's
    warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")
    plan = build_plan(args)
    found = preview(plan, args.stage, None if args.all else args.rows, colour=sys.stdout.isatty())
    print(format_preview(found))
    return 0


def add_data(commands) -> None:
    data = pipeline_command(
        commands,
        "data",
        cmd_data,
        "a stage's rows as its trainer sees them, loss-bearing tokens marked, and lengths",
    )
    data.add_argument("--stage", help="the stage whose rows to show (default: the first that reads rows)")
    data.add_argument("--rows", type=positive_count, default=3, help="how many rows to show (default 3)")
    data.add_argument("--all", action="store_true", help="show every row")
