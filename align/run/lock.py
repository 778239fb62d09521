"""One run per pipeline output folder, and no processes left behind by a run that died.

The lock is an `flock` on `<output_root>/<pipeline>/.align-run.lock`: the kernel releases it when its
holder dies, even by SIGKILL, so a stale lock is simply one nobody holds. The file says who holds it
(PID, host, start) for the error a second run gets, and which processes the holder started (its
embedded Ray), so the next run can stop the ones a killed driver left running.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from align.errors import AlignError

LOCK = ".align-run.lock"


def describe(holder: dict[str, Any]) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"PID {holder.get('pid', '?')} on host {holder.get('host', '?')} (started {started})"


def read_holder(file: IO[str]) -> dict[str, Any]:
    file.seek(0)
    try:
        return json.loads(file.read() or "{}")
    except ValueError:
        return {}


def write_holder(file: IO[str], holder: dict[str, Any]) -> None:
    file.seek(0)
    file.truncate()
    file.write(json.dumps(holder))
    file.flush()


def same_process(pid: int, started: float) -> bool:
    """Whether `pid` is still the process that had it at `started` (PIDs are reused)."""
    import psutil

    try:
        return abs(psutil.Process(pid).create_time() - started) < 1.0
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def process_started() -> float:
    """When this process started, as `same_process` compares it."""
    import psutil

    return psutil.Process().create_time()


def stop_leftovers(holder: dict[str, Any]) -> list[int]:
    """Kill the processes a dead run had started (its embedded Ray) that outlived it."""
    if holder.get("host") != socket.gethostname():
        return []
    stopped = []
    for pid, started in holder.get("processes", []):
        if same_process(pid, started):
            os.kill(pid, signal.SIGKILL)
            stopped.append(pid)
    return stopped


@contextmanager
def run_lock(folder: Path, command: str) -> Iterator[RunLock]:
    """Hold the pipeline's output folder for this run; a second run gets an error naming the holder."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / LOCK, "a+") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = read_holder(file)
            raise AlignError(
                f"{folder} is in use by another run: `{holder.get('command', 'align run')}`, "
                f"{describe(holder)}. Wait for it to finish, or stop it (kill {holder.get('pid', 'PID')})"
            ) from None
        stopped = stop_leftovers(read_holder(file))
        holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": process_started(),  # with the PID, names this process even once PIDs are reused
            "command": command,
        }
        lock = RunLock(file, {**holder, "processes": []}, stopped)
        write_holder(file, lock.holder)
        try:
            yield lock
        finally:
            write_holder(file, {})
            fcntl.flock(file, fcntl.LOCK_UN)


class RunLock:
    """The held lock; `note_processes` records what this run started, for cleanup should it be killed."""

    def __init__(self, file: IO[str], holder: dict[str, Any], stopped: list[int]) -> None:
        self.file = file
        self.holder = holder
        self.stopped = stopped  # PIDs left running by a killed earlier run, stopped when this one began
        self.noting = threading.Lock()  # stages starting side by side note at once

    def note_processes(self) -> None:
        """Record every process below this driver now (an embedded Ray's daemons and workers)."""
        import psutil

        with self.noting:
            children = psutil.Process().children(recursive=True)
            known = {pid for pid, _ in self.holder["processes"]}
            self.holder["processes"] += [[p.pid, p.create_time()] for p in children if p.pid not in known]
            write_holder(self.file, self.holder)


def check_free(folder: Path) -> None:
    """Refuse up front (`align submit`) when a run holds the folder; the lock is not kept."""
    if (folder / LOCK).is_file():
        with run_lock(folder, "check"):
            pass
