"""A data file's rows, one at a time, never the whole file in memory: jsonl line by line, a JSON array
item by item, CSV and TSV records by the `csv` module, parquet files and `datasets` folders as Arrow record
batches (pyarrow imported only here).

Each row comes with its place: jsonl and CSV lines count from 1, as editors do (a CSV's header is line 1,
and a record that spans lines is at its first); JSON array items and parquet or `datasets` rows count from
0, as Python, pandas and `datasets` do. A CSV cell holds text, and an empty one is missing, as the loader
reads it (align/data/building.py). Each reader advances a progress `bar`
(a tqdm, or anything with `update`, `total` and `unit`).
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from align.cache import is_dir
from align.data.building import DELIMITERS
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
    if path.suffix in DELIMITERS:
        return ("line", *csv_rows(file, DELIMITERS[path.suffix], bar))
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


def csv_rows(file: IO[bytes], delimiter: str, bar: Any) -> tuple[list[str], Iterator[Row]]:
    """A CSV or TSV file's header (its first line) and its records as rows of text; a record with more
    values than the header names raises, with its line: its values cannot be told apart."""
    reader = csv.reader(decoded_lines(file, bar), delimiter=delimiter)
    try:
        header = next(reader, [])
    except csv.Error as error:
        raise DataError(f"line 1 is not valid CSV ({error})") from None
    if twice := sorted({name for name in header if header.count(name) > 1}):
        raise DataError(f"line 1 names the column {twice[0]!r} twice; give each column its own name")
    return header, csv_records(file, reader, header)


def decoded_lines(file: IO[bytes], bar: Any) -> Iterator[str]:
    """The file's lines as text (a byte-order mark before the first dropped, as pandas drops it)."""
    for number, line in enumerate(file):
        bar.update(len(line))
        yield line.decode("utf-8-sig" if number == 0 else "utf-8")


def csv_records(file: IO[bytes], reader: Any, header: list[str]) -> Iterator[Row]:
    with file:
        end = reader.line_num
        while True:
            try:
                values = next(reader, None)
            except csv.Error as error:
                raise DataError(f"line {end + 1} is not valid CSV ({error})") from None
            if values is None:
                return
            start, end = end + 1, reader.line_num
            if len(values) > len(header):
                raise DataError(
                    f"line {start} has {len(values)} values where line 1 names {len(header)} columns; quote "
                    "a value that holds the delimiter or a line break"
                )
            if values:  # a blank line is skipped, as pandas skips it
                padded = values + [""] * (len(header) - len(values))
                yield (
                    str(start),
                    {name: value or None for name, value in zip(header, padded, strict=True)},
                    None,
                )


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
