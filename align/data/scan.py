"""Every row of a local data file checked before any model loads, so that `align validate` (and `align run`,
before Ray starts) finds a bad row deep in a file, not the worker that reaches it an hour later.

A scan streams the file: jsonl line by line, a JSON array item by item, CSV and TSV records, parquet
files and `datasets` folders as Arrow record batches. Each row is checked against the TRL formats that its
stage's data kind accepts (`align.data.loading.DATA_COLUMNS`), and each defect is reported once per file
with a count and its first places. The verdict, and the rows counted (which `align plan` shows), is cached
by the file's identity (path, size, modification time) and data kind under `$ALIGN_CACHE/data-checks`, so
a second validate of a large file does not read it again. Reading the rows is `align.data.rows`; what a
row must be, and the tally of a file's defects, is `align.data.row_checks`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from align.cache import cache_root, is_dir, write_atomically
from align.data.corpora import BUILTIN_PREFIX, builtin
from align.data.loading import HUB_PREFIX, column_problem, hub_problem, locate
from align.data.row_checks import Scan
from align.data.rows import row_source
from align.data.shapes import Normalizer, RowProblem, describe
from align.errors import DataError
from align.fingerprint import digest

SCAN_FORMAT = 4  # bump when the rules change: cached verdicts are then checked again


def check_data(ref: str, kind: str, field: str, columns: dict[str, str] | None = None) -> str | None:
    """What is wrong with `ref` as data for a `kind` stage, its columns renamed by `columns` (`data.columns`),
    or None. A local file is read whole, once per version of it; a builtin needs no reading, and a hub
    dataset is checked by its cached copy where there is one (`hub_problem`), else where it loads.

    `field` is taken for symmetry with `load_data` but unused: the caller puts the YAML path in front.
    """
    if ref.startswith(HUB_PREFIX):
        return hub_problem(ref, kind, columns or {})
    try:
        if ref.startswith(BUILTIN_PREFIX):
            return column_problem(ref, [(columns or {}).get(name, name) for name in builtin(ref)[1]], kind)
        return cached_scan(locate(ref), ref, kind, columns or {})
    except DataError as error:
        return str(error)


def first_row(ref: str) -> dict[str, Any] | None:
    """The first row of a local file or `datasets` folder (None for a builtin, a hub dataset, or a file
    with no readable first row); what `align plan` and the mapping check read."""
    if ref.startswith((HUB_PREFIX, BUILTIN_PREFIX)):
        return None
    try:
        path = locate(ref)
        with progress_bar(path) as bar:
            for _place, row, _error in row_source(path, bar)[2]:
                return row if isinstance(row, dict) else None
    except (DataError, OSError, UnicodeDecodeError):
        return None
    return None


def data_shape(ref: str, columns: dict[str, str] | None) -> str | None:
    """What is done to the rows of `ref` before training (renames, a shape's conversion), in words."""
    return describe(first_row(ref), columns)


def columns_problem(ref: str, kind: str, columns: dict[str, str]) -> str | None:
    """What is wrong with `data.columns` for `ref`, judged on its first row: a column it renames that the
    file lacks, a name it already has, or renamed rows that still fit none of the `kind`'s formats."""
    row = first_row(ref)
    if row is None:
        return None
    try:
        row = Normalizer(columns)(row)
    except RowProblem as problem:
        if problem.one.startswith(("lacks", "already has")):
            return f"{ref}: its first row {problem}; it has: {', '.join(row)}"
        return None  # a defect of the row itself: the scan reports it under the data split
    if (problem := column_problem(ref, list(row), kind)) is not None:
        return f"after renaming, {problem}"
    return None


def identity(path: Path) -> list[list[Any]]:
    """What says a file (or each file of a folder) changed: its path, size and modification time."""
    files = sorted(entry for entry in path.iterdir() if entry.is_file()) if is_dir(path) else [path]
    stats = [(file, file.stat()) for file in files]
    return [[str(file), stat.st_size, stat.st_mtime_ns] for file, stat in stats]


def cached_scan(path: Path, ref: str, kind: str, columns: dict[str, str] | None = None) -> str | None:
    """`scan`'s verdict, read from the cache when this version of the file was scanned before."""
    return verdict(path, ref, kind, columns or {})["problem"]


def scanned(ref: str, kind: str, columns: dict[str, str], key: str) -> Any:
    """One figure of a local file's or folder's scan (cached since validate): its `rows`, `tool_rows`, or
    `notes`; None where it is not a local file or cannot be read."""
    if ref.startswith((HUB_PREFIX, BUILTIN_PREFIX)):
        return None
    try:
        return verdict(locate(ref), ref, kind, columns)[key]
    except DataError:
        return None


def scan_notes(data: Any, kind: str) -> list[str]:
    """What the scans of a stage's sources noted without refusing (a few identical pairs): `align plan`
    shows it."""
    return [note for src in data.sources for note in scanned(src.path, kind, src.columns, "notes") or ()]


def scanned_rows(ref: str, kind: str, columns: dict[str, str]) -> int | None:
    """How many rows a local file or folder has, as its scan counted them; None where it cannot be read."""
    return scanned(ref, kind, columns, "rows")


VERDICT = ("problem", "rows", "tool_rows", "notes")


def verdict(path: Path, ref: str, kind: str, renames: dict[str, str]) -> dict[str, Any]:
    """{problem, rows, tool_rows, notes} of a scan of this version of the file, from the cache or scanned
    now."""
    try:
        files = identity(path)
        key = digest({"ref": ref, "kind": kind, "files": files, "format": SCAN_FORMAT, "columns": renames})
    except OSError as error:
        raise DataError(f"{ref} cannot be read: {error.strerror}") from None
    entry = cache_root() / "data-checks" / f"{key}.json"
    try:
        found = json.loads(entry.read_text(encoding="utf-8"))
        return {key: found[key] for key in VERDICT}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    problem, found = scan(path, ref, kind, renames)
    result = {
        "problem": problem,
        "rows": found.rows if found else None,
        "tool_rows": found.tool_rows if found else None,
        "notes": found.notes(ref) if found else [],
    }
    try:
        write_atomically(entry, json.dumps({"ref": ref, "kind": kind, **result}))
    except OSError:
        pass  # a cache that cannot be written only makes the next validate slower
    return result


def scan(
    path: Path, ref: str, kind: str, renames: dict[str, str] | None = None
) -> tuple[str | None, Scan | None]:
    """Check every row of the file (or `datasets` folder) at `path` for a `kind` stage, after `renames`
    (`data.columns`) and the conversion of a known shape: what is wrong (None: nothing), and the scan (None:
    not all read). A file that cannot be opened raises; what its content gets wrong is the answer."""
    found = Scan(kind, normalize=Normalizer(renames))
    try:
        with progress_bar(path) as bar:
            found.unit, columns, rows = row_source(path, bar)
            if columns is not None and not {"conversations", "instruction"} & set(
                columns
            ):  # no shape to convert
                problem = column_problem(ref, [(renames or {}).get(name, name) for name in columns], kind)
                if problem is not None:
                    return problem, None
            for place, row, error in rows:
                found.check(place, row, error)
    except UnicodeDecodeError:
        return f"{ref} is not UTF-8 text", None
    except DataError as error:  # content that ends the scan: a broken JSON array, an unreadable parquet
        before = found.message(ref) if found.rows else None
        return f"{ref} {error}" + (f". {before}" if before else ""), None
    except OSError as error:
        raise DataError(f"{ref} cannot be read: {error.strerror}") from None
    return found.message(ref), found


@contextmanager
def progress_bar(path: Path) -> Iterator[Any]:
    """A bar on stderr for a long scan: shown only once it has run 2 s, and only to a terminal."""
    from tqdm import tqdm

    bar = tqdm(desc=f"checking {path.name}", delay=2, leave=False, disable=not sys.stderr.isatty())
    try:
        yield bar
    finally:
        bar.close()
