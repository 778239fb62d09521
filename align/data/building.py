"""A .jsonl, .json, .parquet, .csv or .tsv file turned into `datasets`' Arrow cache by a process of its own.

Parsing a file leaves memory behind in the process that parsed it (neither pyarrow's allocator nor
Python's hands all of it back): a rank that built the cache of 2M rows itself held 120 MB more for the rest
of its stage than one that found it built. A short-lived child builds it instead, and the rank opens the
finished file. Run as `python -m align.data.building FILE CACHE_DIR PARENT_PID`.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

APART_BYTES = 16 * 2**20
"""Files smaller than this are built in the rank: they leave a few MB behind, and a process start (about
1 s) would cost more than it saves."""


DELIMITERS = {".csv": ",", ".tsv": "\t"}


def arrow_builder(path: Path) -> tuple[str, dict[str, Any]]:
    """The `datasets` builder that reads `path`, and its options. A CSV or TSV file (its first line the
    column names) is read as text, every cell of it: pandas, under the csv builder, would otherwise turn an
    answer `42` into the number 42.0 and `None` or `NA` into a missing value. An empty cell is missing."""
    if path.suffix == ".parquet":
        return "parquet", {}
    if path.suffix not in DELIMITERS:
        return "json", {}
    from datasets import Features, Value

    with path.open(encoding="utf-8-sig", newline="") as file:
        header = next(csv.reader(file, delimiter=DELIMITERS[path.suffix]), [])
    text = Features({name: Value("string") for name in header})
    return "csv", {
        "sep": DELIMITERS[path.suffix],
        "keep_default_na": False,
        "na_values": [""],
        "features": text,
    }


def build_apart(path: Path, cache_dir: Path) -> None:
    """Build `path`'s Arrow cache in a child process unless it is built. A file the child cannot build is
    left to the caller's own load, which says what is wrong with it."""
    from datasets import load_dataset_builder

    if path.stat().st_size < APART_BYTES:
        return
    builder, options = arrow_builder(path)
    if Path(
        load_dataset_builder(builder, data_files=str(path), cache_dir=str(cache_dir), **options).cache_dir
    ).is_dir():
        return
    package_root = str(Path(__file__).resolve().parents[2])  # the folder holding align/
    paths = [package_root, *filter(None, [os.environ.get("PYTHONPATH")])]
    subprocess.run(
        [sys.executable, "-m", "align.data.building", str(path), str(cache_dir), str(os.getpid())],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
        check=False,
    )


def exit_with(parent: int) -> None:
    """End this process when `parent` does, or has before this started (a rank stopped by SIGKILL leaves
    no builder behind)."""
    while os.getppid() == parent:
        time.sleep(1)
    os._exit(1)


def main(path: str, cache_dir: str, parent: str) -> int:
    from datasets import load_dataset

    threading.Thread(target=exit_with, args=(int(parent),), daemon=True).start()
    try:
        builder, options = arrow_builder(Path(path))
        load_dataset(builder, data_files=path, split="train", cache_dir=cache_dir, **options)
    except Exception:  # noqa: BLE001 - the parent loads the file again and names what is wrong
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
