"""`align validate` and `align plan`: the file checked, and the plan it makes, without loading a model."""

from __future__ import annotations

import argparse

from align.cli.options import device_memory, pipeline_command
from align.cli.plan_file import build_plan


def cmd_validate(args: argparse.Namespace) -> int:
    pipeline = build_plan(args).pipeline  # the plan refuses what a chosen backend cannot run
    print(
        f"{args.file}: valid pipeline '{pipeline.name}' with {len(pipeline.stages)} stages "
        f"({', '.join(pipeline.stages)})"
    )
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from align.report.console import format_plan

    print(format_plan(build_plan(args)))
    return 0


def add_validate(commands) -> None:
    pipeline_command(commands, "validate", cmd_validate, "check a pipeline file without loading anything")


def add_plan(commands) -> None:
    sub = pipeline_command(commands, "plan", cmd_plan, "show stages, backends, placement and memory per rank")
    device_memory(sub)
    sub.add_argument(
        "--address",
        help="the Ray cluster the run will join: plan for it, checking nothing against this "
        "machine's cores, GPUs and memory (default: $RAY_ADDRESS, else this machine)",
    )
