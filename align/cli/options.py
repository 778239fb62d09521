"""The options several commands share, and the argparse types that turn a bad value into a usage error."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Handler = Callable[[argparse.Namespace], int]


def pipeline_command(commands, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
    """A command that reads a pipeline file, with its `--set` overrides."""
    sub = commands.add_parser(name, help=help_text)
    sub.add_argument("file", help="the pipeline YAML file")
    sub.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="override a value, e.g. stages.dpo.trl.beta=0.2 (repeatable)",
    )
    sub.set_defaults(handler=handler)
    return sub


def stage_names(sub: argparse.ArgumentParser, flag: str, help_text: str) -> None:
    """A repeatable option that names a stage."""
    sub.add_argument(flag, action="append", default=[], metavar="NAME", help=help_text)


def device_memory(sub: argparse.ArgumentParser) -> None:
    sub.add_argument("--device-memory", help="memory per device for the plan, e.g. 80GB (default: detected)")


def positive_count(value: str) -> int:
    """A count of one or more (`--rows`): argparse answers anything else as a usage error, exit 2."""
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a count of 1 or more (--all shows every row)")
    return count


def byte_count(value: str) -> int:
    """An argparse type: `100MB`, `1GiB`... (a bad value is a usage error naming the option, exit 2)."""
    from align.models.memory import parse_memory

    try:
        return parse_memory(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a size: write e.g. 100MB or 1GiB") from None
