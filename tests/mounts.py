"""A small tmpfs for the disk-fault tests (a read-only or a full output root): mounted for the test's length,
and the test skipped, with the reason, where it cannot be mounted."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def tmpfs(root: Path, options: str) -> Iterator[Path]:
    """`root` as a tmpfs mounted with `options` (e.g. "ro,size=1m"); skips unless this runs as root and
    the machine allows the mount."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    root.mkdir(parents=True, exist_ok=True)
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(root)]).returncode:
        pytest.skip("this machine does not let the test mount a tmpfs")
    try:
        yield root
    finally:
        subprocess.run(["umount", str(root)])
