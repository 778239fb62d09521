"""Data prepared once: a file loads into memory-mapped Arrow files under the `datasets` cache, and every
map over it (TRL's tokenization, the padding-free cut) is cached beside them, so a `--force` rerun and a
second rank read what was prepared instead of preparing it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.pipelines import logged_losses, run, stage_folder, write_pipeline

pytestmark = pytest.mark.integration


def conversations(path: Path, count: int) -> Path:
    with path.open("w") as out:
        for index in range(count):
            turns = [
                {"role": "user", "content": f"What is {index} plus {index}?"},
                {"role": "assistant", "content": f"{index} plus {index} is {2 * index}."},
            ]
            out.write(json.dumps({"messages": turns}) + "\n")
    return path


def arrow_files(cache: Path) -> dict[str, float]:
    """Every Arrow file the `datasets` cache holds, with when it was written."""
    return {str(path.relative_to(cache)): path.stat().st_mtime for path in cache.rglob("*.arrow")}


def sft_pipeline(folder: Path, rows: Path, workers: int) -> Path:
    sft = {
        "kind": "sft",
        "data": {"train": str(rows)},
        "trl": {"max_steps": 3, "per_device_train_batch_size": 4, "logging_steps": 1, "report_to": []},
    }
    return write_pipeline(folder, "cached", {"sft": sft}, workers=workers, seed=0, precision="fp32")


def test_a_forced_rerun_reads_the_prepared_rows_and_trains_the_same(tmp_path, monkeypatch):
    cache = tmp_path / "datasets-cache"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    path = sft_pipeline(tmp_path, conversations(tmp_path / "rows.jsonl", 400), workers=1)
    run(path)
    prepared = arrow_files(cache)
    first = logged_losses(stage_folder(path, "sft"))
    assert len(prepared) >= 3  # the file's Arrow copy, the held-out split, the tokenized rows

    run(path, "--force", "sft")
    assert arrow_files(cache) == prepared  # nothing converted, split or tokenized again
    assert logged_losses(stage_folder(path, "sft")) == first


def test_two_ranks_share_one_preparation(tmp_path, monkeypatch):
    """TRL prepares on the main rank first and the other rank then finds its cache files (the fingerprints
    do not depend on the rank): a 2-rank stage leaves exactly the files a 1-rank stage does."""
    rows = conversations(tmp_path / "rows.jsonl", 400)
    one, two = tmp_path / "one-rank", tmp_path / "two-ranks"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.setenv("HF_DATASETS_CACHE", str(one))
    run(sft_pipeline(tmp_path / "a", rows, workers=1))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(two))
    run(sft_pipeline(tmp_path / "b", rows, workers=2))
    assert sorted(arrow_files(two)) == sorted(arrow_files(one))


def test_a_large_file_is_built_into_arrow_by_a_process_of_its_own(tmp_path, monkeypatch):
    """The rank only opens the Arrow file a child built (parsing leaves memory behind in the process that
    parses); a file the child cannot build still fails in the rank, naming its bad line."""
    from datasets.arrow_writer import ArrowWriter

    from align.data import building
    from align.data.loading import read_dataset
    from align.errors import DataError

    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(building, "APART_BYTES", 0)

    def refuse(*args, **kwargs):
        raise AssertionError("the rank built the Arrow file itself")

    monkeypatch.setattr(ArrowWriter, "write_table", refuse)
    rows = conversations(tmp_path / "rows.jsonl", 300)
    dataset = read_dataset(rows, "rows.jsonl")
    assert len(dataset) == 300 and dataset[299]["messages"][1]["content"] == "299 plus 299 is 598."

    broken = tmp_path / "broken.jsonl"
    broken.write_text(rows.read_text() + "{not json\n")
    with pytest.raises(DataError, match="line 301"):
        read_dataset(broken, "broken.jsonl")


def test_the_builder_ends_with_the_rank_that_started_it():
    """A rank killed outright (SIGKILL: no handler runs) leaves no builder process parsing behind it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    builder = (
        "import sys, threading, time; from align.data.building import exit_with; "
        "threading.Thread(target=exit_with, args=(int(sys.argv[1]),), daemon=True).start(); time.sleep(60)"
    )
    rank = (
        "import os, subprocess, sys; "
        f"child = subprocess.Popen([sys.executable, '-c', {builder!r}, str(os.getpid())]); "
        "print(child.pid, flush=True); child.wait()"
    )
    root = Path(__file__).resolve().parents[1]
    middle = subprocess.Popen(
        [sys.executable, "-c", rank],
        stdout=subprocess.PIPE,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    child = int(middle.stdout.readline())
    os.kill(middle.pid, signal.SIGKILL)
    middle.wait()
    deadline = time.monotonic() + 10
    while running(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running(child), "the builder outlived its rank"


def running(pid: int) -> bool:
    """Whether `pid` still runs (an ended orphan may stay a zombie until something reaps it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
