"""A run's stop: asked once by the driver's main thread, where signals land, and heeded by each stage's
thread at its next poll (waiting on its ranks, its reservation or its turn), which then stops its own
workers and sets its stage aside."""

from __future__ import annotations

import threading

from align.errors import Interrupted

_asked = threading.Event()


def request(signum: int) -> None:
    Interrupted.received = signum
    _asked.set()


def clear() -> None:
    """A new run starts unstopped (tests run many in one process)."""
    _asked.clear()


def check() -> None:
    """Raise Interrupted in a stage's thread once the run was asked to stop."""
    if _asked.is_set():
        raise Interrupted(Interrupted.received)
