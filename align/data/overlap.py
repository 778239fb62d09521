"""Held-out rows that are also trained on: an eval split that is the train file itself, or shares rows with
it. The docs promise that held-out rows are never trained on, so `align validate` refuses both, counted.

Rows are compared as they train: after `data.columns`' renames and a known shape's conversion, each one
hashed from its JSON with sorted keys, so a row written with its keys in another order is the same row.
Only the eval rows' hashes are held; the train sources stream past them. The count is cached by the files'
identities, as the scan's verdict is (align/data/scan.py).
"""

from __future__ import annotations

import filecmp
import hashlib
import json
from pathlib import Path
from typing import Any

from align.cache import cached_json
from align.data.corpora import BUILTIN_PREFIX, builtin_path
from align.data.hub import HUB_PREFIX
from align.data.loading import NO_EVAL, locate
from align.data.row_checks import EXAMPLES
from align.data.rows import row_source
from align.data.scan import identity, progress_bar
from align.data.shapes import Normalizer, RowProblem
from align.errors import DataError, Problem
from align.fingerprint import digest

FIX = (
    "held-out rows must never be trained on: remove them from one of the files, or drop `eval:` to hold "
    "out a seeded slice of the training rows"
)


def local_path(ref: str) -> Path | None:
    """The file or folder a local or builtin ref reads; None for a hub dataset (it has no rows here)."""
    if ref.startswith(HUB_PREFIX):
        return None
    try:
        return builtin_path(ref) if ref.startswith(BUILTIN_PREFIX) else locate(ref)
    except DataError:
        return None


def row_hashes(path: Path, columns: dict[str, str]) -> dict[str, str]:
    """Each row's hash, mapped to its first place (`line 3`), as it trains after `columns`' renames."""
    normalize, found = Normalizer(columns), {}
    with progress_bar(path) as bar:
        unit, _columns, rows = row_source(path, bar)
        for place, row, _error in rows:
            if not isinstance(row, dict):
                continue  # the scan reports it
            try:
                text = json.dumps(normalize(row), sort_keys=True, default=str)
            except RowProblem:
                continue
            found.setdefault(hashlib.sha256(text.encode()).hexdigest(), f"{unit} {place}")
    return found


def shared_rows(
    train: list[tuple[Path, dict[str, str]]], held: Path, columns: dict[str, str]
) -> dict[str, Any]:
    """{rows, places}: the eval file's distinct rows, and the places of those a train source holds too."""
    eval_rows = row_hashes(held, columns)
    shared: set[str] = set()
    for path, renames in train:
        shared |= eval_rows.keys() & row_hashes(path, renames).keys()
    places = sorted((eval_rows[key] for key in shared), key=lambda place: int(place.split()[-1]))
    return {"rows": len(eval_rows), "places": places}


def counted(train: list[tuple[Path, dict[str, str]]], held: Path, columns: dict[str, str]) -> dict[str, Any]:
    """{rows, places}: the eval rows, and the places of those trained on too; cached per version of every
    file."""
    files = [identity(path) for path, _ in train], identity(held)
    key = digest({"train": files[0], "renames": [r for _, r in train], "eval": files[1], "columns": columns})
    return cached_json("data-overlaps", key, lambda: shared_rows(train, held, columns))


def same_file(first: Path, second: Path) -> bool:
    if first.is_dir() or second.is_dir():
        return first.resolve() == second.resolve()
    return filecmp.cmp(first, second, shallow=False)


def held_out_problems(data: Any, where: str) -> list[Problem]:
    """An eval split that is a train source's file, or that shares rows with the train sources, counted with
    its first places. A source with no rows here (a hub dataset) is not compared."""
    if data.eval in (None, NO_EVAL) or (held := local_path(data.eval)) is None:
        return []
    sources = [(local_path(source.path), source) for source in data.sources]
    train = [(path, source.columns) for path, source in sources if path is not None]
    try:
        for path, source in sources:
            if path is not None and same_file(path, held):
                same = (
                    "is the file" if path.resolve() == held.resolve() else "holds the same bytes as the file"
                )
                message = f"{data.eval} {same} data.train reads ({source.path}); {FIX}"
                return [Problem(f"{where}.data.eval", message)]
        found = counted(train, held, data.columns)
    except (OSError, UnicodeDecodeError, DataError):
        return []  # an unreadable file is the scan's to report
    places = found["places"]
    if not places:
        return []
    unit = places[0].split()[0] + ("s" if len(places) > 1 else "")
    shown = ", ".join(place.split()[-1] for place in places[:EXAMPLES])
    more = f" and {len(places) - EXAMPLES} more" if len(places) > EXAMPLES else ""
    return [
        Problem(
            f"{where}.data.eval",
            f"{len(places)} of {found['rows']} eval rows also "
            f"{'appears' if len(places) == 1 else 'appear'} in data.train "
            f"({data.eval} {unit} {shown}{more}); {FIX}",
        )
    ]
