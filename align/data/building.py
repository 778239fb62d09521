"""A .jsonl, .json or .parquet file turned into `datasets`' Arrow cache by a process of its own.

Parsing a file leaves memory behind in the process that parsed it (neither pyarrow's allocator nor
Python's hands all of it back): a rank that built the cache of 2M rows itself held 120 MB more for the rest
of its stage than one that found it built. A short-lived child builds it instead, and the rank opens the
finished file. Run as `python -m align.data.building BUILDER FILE CACHE_DIR PARENT_PID`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

APART_BYTES = 16 * 2**20
"""Files smaller than this are built in the rank: they leave a few MB behind, and a process start (about
1 s) would cost more than it saves."""


def build_apart(builder: str, path: Path, cache_dir: Path) -> None:
    """Build `path`'s Arrow cache in a child process unless it is built. A file the child cannot build is
    left to the caller's own load, which says what is wrong with it."""
    from datasets import load_dataset_builder

    if path.stat().st_size < APART_BYTES:
        return
    if Path(load_dataset_builder(builder, data_files=str(path), cache_dir=str(cache_dir)).cache_dir).is_dir():
        return
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding align/
    paths = [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]
    subprocess.run(
        [sys.executable, "-m", "align.data.building", builder, str(path), str(cache_dir), str(os.getpid())],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        check=False,
    )


def exit_with(parent: int) -> None:
    """End this process when `parent` does, or has before this started (a rank stopped by SIGKILL leaves
    no builder behind)."""
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def main(builder: str, path: str, cache_dir: str, parent: str) -> int:
    from datasets import load_dataset

    threading.Thread(target=exit_with, args=(int(parent),), daemon=True).start()
    try:
        load_dataset(builder, data_files=path, split="train", cache_dir=cache_dir)
    except Exception:  # noqa: BLE001 - the parent loads the file again and names what is wrong
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
