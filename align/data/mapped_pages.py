"""Keep a rank's resident memory to the rows it is reading, not the size of its memory-mapped Arrow files.

`datasets` memory-maps every Arrow file it opens, and what a process touches through a mapping counts in
its RSS until the mapping goes. Two touches grow with the rows of a file:
- opening one reads every record batch's header (one per 1,000 rows), and the kernel maps its neighbours
  too (fault-around, 64 KB or a whole large folio): at 2M rows, 120 MB of a tokenized file that is never
  read again;
- training reads random rows, each mapping its neighbourhood, so over an epoch the whole file becomes
  resident.

Those pages are the kernel's page cache, which it can take back, but RSS counts them, and so do Ray's memory
monitor and anyone reading `top`. `MADV_DONTNEED` on a read-only file mapping only unmaps them: the next
read maps them again from the page cache, unchanged. So the rank drops a file's pages as soon as it is
opened, and every Arrow page it holds after each training step. Linux only; elsewhere nothing happens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from typing import Any

from align.compat.datasets import arrow_file_opener, replace_arrow_file_opener

MADV_DONTNEED = 4
ARROW_SUFFIX = ".arrow"


@functools.cache
def _madvise() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc.madvise


def arrow_mappings(path: str | None = None) -> list[tuple[int, int]]:
    """(start, end) of this process's read-only mappings of Arrow files (of `path` alone, if given)."""
    found = []
    with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or "w" in fields[1]:
                continue
            mapped = fields[5].rstrip("\n")
            if mapped == path or (path is None and mapped.endswith(ARROW_SUFFIX)):
                start, end = (int(bound, 16) for bound in fields[0].split("-"))
                found.append((start, end))
    return found


def release_mapped_pages(path: str | None = None) -> None:
    """Unmap the resident pages of the Arrow files this process has mapped (or of `path`); their
    contents stay mapped, and come back from the page cache when read."""
    if not sys.platform.startswith("linux"):
        return
    for start, end in arrow_mappings(path):
        _madvise()(start, end - start, MADV_DONTNEED)


def release_pages_on_open() -> None:
    """Make `datasets` drop an Arrow file's header pages as soon as it has opened it; where this
    `datasets` opens files otherwise, opening costs what it did, and nothing breaks."""
    opener = arrow_file_opener()
    if opener is None or not sys.platform.startswith("linux") or getattr(opener, "releases_pages", False):
        return

    @functools.wraps(opener)
    def open_then_release(filename: str) -> Any:
        opened = opener(filename)
        release_mapped_pages(os.path.realpath(filename))
        return opened

    open_then_release.releases_pages = True  # type: ignore[attr-defined]
    replace_arrow_file_opener(open_then_release)
