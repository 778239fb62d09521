"""A data file's rows, one at a time, never the whole file in memory: jsonl line by line, a JSON array
item by item, parquet files and `datasets` folders as Arrow record batches (pyarrow imported only here).

Each row comes with its place: jsonl lines count from 1, as editors do; JSON array items and parquet or
`datasets` rows count from 0, as Python, pandas and `datasets` do. Each reader advances a progress `bar`
(a tqdm, or anything with `update`, `total` and `unit`).
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from align.cache import is_dir
from align.errors import DataError

CHUNK = 1 << 20
ITEM_LIMIT = 64 << 20  # a JSON array item larger than this is taken as broken rather than read on
BATCH_ROWS = 4096
SPACE = re.compile(r"\s*")
Row = tuple[str, Any, str | None]
"""A row's place, its value, and why it is not JSON (then the value is None)."""


def row_source(path: Path, bar: Any) -> tuple[str, list[str] | None, Iterator[Row]]:
    """How the file counts places, its columns when a schema says them, and its rows."""
    if is_dir(path) or path.suffix == ".parquet":
        return ("row", *arrow_source(path, bar))
    bar.total, bar.unit, bar.unit_scale = path.stat().st_size, "B", True
    file = path.open("rb")
    is_array = file.read(4096).lstrip().startswith(b"[")
    file.seek(0)
    if is_array:
        return "item", None, json_array(io.TextIOWrapper(file, encoding="utf-8"), bar)
    return "line", None, json_lines(file, bar)


def json_lines(file: IO[bytes], bar: Any) -> Iterator[Row]:
    with file:
        for number, line in enumerate(file, 1):
            bar.update(len(line))
            text = line.decode("utf-8")
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as error:
                yield str(number), None, error.msg
                continue
            yield str(number), row, None


def json_array(file: IO[str], bar: Any) -> Iterator[Row]:
    """Items of one JSON array, decoded a chunk at a time so that a large file is never held whole. A
    syntax error ends the array (nothing after it can be trusted), so it raises with its line."""
    decoder, text, pos, line, index, state = json.JSONDecoder(), "", 0, 1, 0, "open"
    ahead, done = CHUNK, False  # characters to hold past `pos` before decoding; whether the file is read
    with file:
        while True:
            if not done and len(text) - pos < ahead:
                more = file.read(max(CHUNK, ahead - (len(text) - pos)))
                text, pos, done = text[pos:] + more, 0, not more
                bar.update(len(more))
            skipped = SPACE.match(text, pos).end()
            line, pos = line + text.count("\n", pos, skipped), skipped
            if pos == len(text):
                if done:
                    raise not_json(line, "the array has no closing ]")
                continue
            if text[pos] == "]" and (state == "after" or state == "item" and index == 0):
                return
            if state != "item":
                expected = "[" if state == "open" else ","
                if text[pos] != expected:
                    raise not_json(line, f"expected {expected!r} in the array")
                pos, state = pos + 1, "item"
                continue
            try:
                item, end = decoder.raw_decode(text, pos)
            except json.JSONDecodeError as error:
                if not done and len(text) - pos < ITEM_LIMIT:
                    ahead = 2 * (len(text) - pos)  # the item may go on: read as much again, and retry
                    continue
                raise not_json(line + text.count("\n", pos, error.pos), error.msg) from None
            yield str(index), item, None
            line, pos, index, state, ahead = line + text.count("\n", pos, end), end, index + 1, "after", CHUNK


def not_json(line: int, reason: str) -> DataError:
    """A syntax error in a JSON array, which ends the scan: nothing after it can be trusted."""
    return DataError(
        f"line {line} is not valid JSON ({reason}); a .json file holds one array of objects, or one object "
        "per line"
    )


def arrow_source(path: Path, bar: Any) -> tuple[list[str], Iterator[Row]]:
    """A parquet file's, or a `datasets` folder's, columns and rows, read a record batch at a time."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    bar.unit = "rows"
    try:
        if not is_dir(path):
            parquet = pq.ParquetFile(path)
            bar.total = parquet.metadata.num_rows
            return parquet.schema_arrow.names, batch_rows(parquet.iter_batches(batch_size=BATCH_ROWS), bar)
        readers = [pa.ipc.open_stream(pa.memory_map(str(file))) for file in arrow_files(path)]
    except pa.ArrowException as error:
        raise DataError(f"cannot be read: {error}") from None
    columns = readers[0].schema.names if readers else []
    return columns, batch_rows((batch for reader in readers for batch in reader), bar)


def arrow_files(folder: Path) -> list[Path]:
    """The Arrow files `save_to_disk` wrote, in order (state.json lists them)."""
    try:
        listed = json.loads((folder / "state.json").read_text(encoding="utf-8"))["_data_files"]
        return [folder / entry["filename"] for entry in listed]
    except (OSError, ValueError, KeyError, TypeError):
        return sorted(folder.glob("*.arrow"))


def batch_rows(batches: Iterable[Any], bar: Any) -> Iterator[Row]:
    import pyarrow as pa

    index = 0
    try:
        for batch in batches:
            for row in batch.to_pylist():
                yield str(index), row, None
                index += 1
            bar.update(batch.num_rows)
    except pa.ArrowException as error:
        raise DataError(f"cannot be read: {error}") from None
