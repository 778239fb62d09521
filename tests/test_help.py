"""`align --help`, `align -h` and every command's help print and exit 0: the first thing a new user types
must never be a traceback (a bare `%` in a help string once broke argparse's formatting)."""

from __future__ import annotations

import argparse

import pytest

from align.cli import main, parser


def commands() -> list[str]:
    """Every subcommand the parser knows, walked from the parser itself so that a new one is covered."""
    actions = [action for action in parser()._actions if isinstance(action, argparse._SubParsersAction)]
    return [name for action in actions for name in action.choices]


def test_every_command_is_walked() -> None:
    assert {"validate", "plan", "run", "data", "submit", "sweep-report", "chat", "tiny"} <= set(commands())


@pytest.mark.parametrize(
    "argv", [[flag] for flag in ("--help", "-h")] + [[name, "-h"] for name in commands()]
)
def test_help_prints_and_exits_0(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    out, err = capsys.readouterr()
    assert exited.value.code == 0, err
    assert out.startswith("usage: align"), out
    assert err == ""
