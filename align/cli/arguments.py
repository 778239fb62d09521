"""The `align` parser: each command adds its own options (beside its handler, in its module), in the
order `align --help` and the CLI reference list them."""

from __future__ import annotations

import argparse

from align.cli.chat import add_chat
from align.cli.check import add_plan, add_validate
from align.cli.data import add_data
from align.cli.report import add_report, add_sweep_report
from align.cli.run import add_run, add_submit
from align.cli.status import add_logs, add_status
from align.cli.tiny import add_tiny

COMMANDS = (
    add_validate,
    add_data,
    add_plan,
    add_run,
    add_submit,
    add_status,
    add_logs,
    add_report,
    add_sweep_report,
    add_chat,
    add_tiny,
)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="align", description="Alignment pipelines declared in YAML, run on Ray."
    )
    commands = top.add_subparsers(dest="command", required=True)
    for add in COMMANDS:
        add(commands)
    return top
