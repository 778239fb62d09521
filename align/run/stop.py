"""A run's stop: asked once by the driver's main thread, where signals land, and heeded by each stage's
thread at its next poll (waiting on its ranks, its reservation or its turn), which then stops its own
workers and sets its stage aside. One stage alone can be stopped the same way (a sweep's variant that ASHA
stops early): its thread, named by `stage`, heeds it; the others go on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from align.errors import Interrupted

_asked = threading.Event()
_stages: set[str] = set()  # stages asked to stop alone
_thread = threading.local()  # the stage a thread runs


def request(signum: int) -> None:
    Interrupted.received = signum
    _asked.set()


def request_stage(name: str) -> None:
    """Stop one stage: its thread raises Interrupted at its next poll, and the stage is set aside."""
    _stages.add(name)


def clear() -> None:
    """A new run starts unstopped (tests run many in one process)."""
    _asked.clear()
    _stages.clear()


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Name the stage this thread runs, so that a stop of that stage alone reaches it."""
    _thread.stage = name
    try:
        yield
    finally:
        _thread.stage = None


def check() -> None:
    """Raise Interrupted in a stage's thread once the run, or that stage alone, was asked to stop."""
    if _asked.is_set():
        raise Interrupted(Interrupted.received)
    if getattr(_thread, "stage", None) in _stages:
        raise Interrupted(Interrupted.received, f"stage '{_thread.stage}' asked to stop")
