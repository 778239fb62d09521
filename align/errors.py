"""Typed errors that carry the YAML path of what is wrong.

Only the CLI turns these into messages and exit codes; everything else raises them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """One thing wrong with user input: where (a dotted YAML path or a file) and what to do."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class AlignError(Exception):
    """An error caused by user input; the CLI prints it without a traceback and exits 2."""


class ConfigError(AlignError):
    """Every problem found in a pipeline file, reported together."""

    def __init__(self, problems: list[Problem], source: str = "", waiting: tuple[str, ...] = ()) -> None:
        """`waiting`: the checks not run because they need a part with a problem, each in a few words
        ("stages.dpo's models, data and rewards"): counted in one last line, so nothing is silently left
        unchecked."""
        self.problems = problems
        self.source = source
        self.waiting = waiting
        header = f"{source}: " if source else ""
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        lines = "\n".join(f"  - {p}" for p in problems)
        if waiting:
            checks = "check waits" if len(waiting) == 1 else "checks wait"
            lines += f"\n  {len(waiting)} more {checks} on these: {'; '.join(waiting)}"
        super().__init__(f"{header}{count} in the pipeline file:\n{lines}")


class DataError(AlignError):
    """A dataset that is missing, unreadable, or lacks the columns its stage needs."""


class ModelError(AlignError):
    """A model that cannot be found or does not fit the stage that uses it."""


class StageFailed(Exception):
    """A stage crashed while running; its partial outputs were kept aside, not published.

    `rank`: the worker whose log (`logs/worker-RANK.log`) holds the traceback, when one is known."""

    def __init__(self, message: str, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (Ctrl-C, SIGTERM); the CLI exits 128 + its number."""

    received = 2  # the last signal that stopped the run: Ray turns the exception it interrupts into its own

    def __init__(self, signum: int, message: str = "") -> None:
        super().__init__(message)
        self.signum = signum
