"""A rank's resident memory holds the Arrow rows it reads, not the pages that opening a file or past steps
touched (align/data/mapped_pages.py): those pages are unmapped, and the rows read back unchanged."""

from __future__ import annotations

import os
import random
import shutil
import sys
from pathlib import Path

import pytest

from align.data.loading import read_dataset
from align.data.mapped_pages import release_mapped_pages
from align.stages.resident import ReleaseMappedPages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
ROWS = 60_000
PAGE_KB = 4


def resident_kb(path: Path) -> int:
    """The resident KB of this process's mappings of `path`."""
    target, total, current = os.path.realpath(path), 0, None
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as smaps:
        for line in smaps:
            fields = line.split()
            if fields and "-" in fields[0] and len(fields) >= 5:
                current = fields[5] if len(fields) > 5 else None
            elif fields and fields[0] == "Rss:" and current == target:
                total += int(fields[1])
    return total


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two copies of one `save_to_disk` folder of token rows, written in `datasets`' 1,000-row batches."""
    from datasets import Dataset

    rng = random.Random(0)
    rows = [[rng.randrange(32_000) for _ in range(rng.randint(20, 80))] for _ in range(ROWS)]
    first = tmp_path_factory.mktemp("mapped") / "a"
    Dataset.from_dict({"input_ids": rows}).save_to_disk(str(first))
    second = first.with_name("b")
    shutil.copytree(first, second)
    return first, second


def arrow_file(folder: Path) -> Path:
    return next(folder.glob("*.arrow"))


def test_opening_keeps_none_of_the_headers_resident(saved: tuple[Path, Path]) -> None:
    import pyarrow as pa

    plain_folder, folder = saved
    plain = pa.ipc.open_stream(pa.memory_map(str(arrow_file(plain_folder)))).read_all()
    opened_plain = resident_kb(arrow_file(plain_folder))
    assert opened_plain >= ROWS // 1000 * PAGE_KB  # a page or more per record batch header

    dataset = read_dataset(folder, str(folder))
    assert resident_kb(arrow_file(folder)) < opened_plain / 4
    assert dataset[ROWS - 1]["input_ids"] == plain.column("input_ids")[ROWS - 1].as_py()


def test_each_step_unmaps_the_rows_it_read(saved: tuple[Path, Path]) -> None:
    _, folder = saved
    dataset = read_dataset(folder, str(folder))
    picked = random.Random(1).sample(range(ROWS), 64)
    before = [dataset[index]["input_ids"] for index in picked]
    read = resident_kb(arrow_file(folder))
    assert read >= 64 * PAGE_KB  # each row read maps at least its page

    ReleaseMappedPages().on_step_end(None, None, None)
    assert resident_kb(arrow_file(folder)) < read / 4
    assert [dataset[index]["input_ids"] for index in picked] == before


def test_release_leaves_other_mappings_alone(tmp_path: Path) -> None:
    """Only read-only mappings of Arrow files are touched: a private mapping written to keeps what was
    written (unmapping its pages would drop it)."""
    import mmap

    path = tmp_path / "scratch.arrow"
    path.write_bytes(b"\0" * mmap.PAGESIZE * 4)
    with path.open("r+b") as handle, mmap.mmap(handle.fileno(), 0, flags=mmap.MAP_PRIVATE) as writable:
        writable[:5] = b"align"
        release_mapped_pages()
        assert writable[:5] == b"align"
