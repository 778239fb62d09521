"""Stage runners, one module per kind, each with `run(StageContext) -> StageResult`; the kinds table
(align/spec.py) names each kind's runner."""

from __future__ import annotations

import importlib
from types import ModuleType

from align.spec import KINDS


def runner_for(kind: str) -> ModuleType:
    """The runner module of a stage kind, imported only in the worker that needs it."""
    return importlib.import_module(KINDS[kind].runner)
