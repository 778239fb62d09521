"""`align status` (a local run's stages, or a submitted job's state) and `align logs` (a job's output)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from align.errors import AlignError


def cmd_status(args: argparse.Namespace) -> int:
    """A pipeline file or run folder: the local run's stages; anything else is a submitted job's id."""
    target = Path(args.target)
    if target.exists():
        from align.report.status import status_lines

        print("\n".join(status_lines(target)))
        return 0
    if target.suffix in (".yaml", ".yml") or "/" in args.target:
        raise AlignError(f"{target}: no such pipeline file or run folder (a submitted job's id has no '/')")
    from align.run.submit import status

    print(status(args.address, args.target))
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from align.run.submit import logs

    print(logs(args.address, args.job_id), end="")
    return 0


def dashboard() -> str:
    """The cluster's dashboard a job id is asked of, unless --address names one."""
    return os.environ.get("RAY_ADDRESS", "http://127.0.0.1:8265")


def add_status(commands) -> None:
    status = commands.add_parser(
        "status",
        help="where a run stands: each stage done, running (step, ETA), interrupted, failed or pending",
    )
    status.add_argument("target", help="a pipeline YAML file or its run folder; or a submitted job's id")
    status.add_argument("--address", default=dashboard(), help="the cluster's dashboard, for a job id")
    status.set_defaults(handler=cmd_status)


def add_logs(commands) -> None:
    logs = commands.add_parser("logs", help="a submitted job's logs")
    logs.add_argument("job_id", help="the id `align submit` printed")
    logs.add_argument(
        "--address", default=dashboard(), help="the cluster's dashboard (default: $RAY_ADDRESS)"
    )
    logs.set_defaults(handler=cmd_logs)
