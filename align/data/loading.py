"""Datasets for stages, in TRL's standard or conversational formats.

A ref is a builtin (`align:chatterbot/sft/train`), a .jsonl/.json/.parquet/.csv/.tsv file, a folder
written by `datasets`' `save_to_disk` (`folder@split` for a DatasetDict), or a hub dataset
(`hf:org/name[:config]@split[#revision]`, align/data/hub.py). `align.data.scan` checks every row before
anything loads; a stage's list of sources is mixed by align/data/mixtures.py.

Files load through `datasets`' own json, parquet and csv builders into Arrow files under
`datasets_cache()`, and are memory-mapped from there: a rank holds the rows it reads, not the file, and
every later `map` over them (align's conversions, TRL's tokenization, the padding-free cut) is written
beside them as a cache file keyed by its fingerprint. A rerun, a `--force`, a retry, another stage reading
the file the same way, or another rank (TRL prepares on the main rank first) then reads what was prepared
instead of preparing it again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from align.cache import cache_root, exists, is_dir, user_path
from align.compat.datasets import dataset_fingerprint
from align.data.building import DELIMITERS, arrow_builder, build_apart
from align.data.corpora import BUILTIN_DATA, BUILTIN_PREFIX, TOY_DATA, builtin_path
from align.data.hub import HUB_FORM, HUB_PREFIX, hub_rows, local_copy, parse_hub_ref, resolved
from align.data.mapped_pages import release_pages_on_open
from align.data.rows import row_source
from align.data.shapes import Normalizer, RowProblem, detect, suggest_columns
from align.errors import DataError
from align.fingerprint import digest, file_digest

NO_EVAL = "none"  # `eval: none`: no held-out measurement at all
HELD_OUT_SHARE = 0.05  # without an eval split, this share of train is held out of training and measured
HELD_OUT_ROWS = 64  # at most: held-out scoring runs before and after training
HELD_OUT_MIN_TRAIN = 40  # rows below which nothing is held out: the slice would starve training
PAIRED = [("prompt", "chosen", "rejected"), ("chosen", "rejected")]
DATA_COLUMNS: dict[str, list[tuple[str, ...]]] = {
    "sft": [("messages",), ("text",), ("prompt", "completion")],
    "preferences": PAIRED,
    "unpaired": [("prompt", "completion", "label"), ("completion", "label"), *PAIRED],
    "prompts": [("prompt",)],
}
"""Each data kind (the kinds table's `data`) and the column sets of TRL's formats that it accepts."""
FILE_TYPES = (".jsonl", ".json", ".parquet", *DELIMITERS)
FORMATS = (
    "give a .jsonl, .json, .parquet, .csv or .tsv file, a `datasets` save_to_disk folder (folder@split for "
    f"a DatasetDict), a hub dataset as {HUB_FORM}, or a builtin: {', '.join([*BUILTIN_DATA, *TOY_DATA])}"
)


def resolve_data(ref: str, field: str) -> Path:
    """The absolute file or folder behind `ref` (ranks may run elsewhere); builtins are built on first use."""
    try:
        return locate(ref)
    except DataError as error:
        raise DataError(f"{field}: {error}") from None


def split_ref(ref: str, base: Path | None = None) -> tuple[Path, str | None]:
    """The absolute path a file ref names, relative ones taken from `base` (the working directory when
    None), and its `@split` if it has one; a name with `@` that exists is a plain path."""
    path = user_path(ref, base)
    if exists(path) or "@" not in ref:
        return path, None
    head, _, split = ref.rpartition("@")
    return user_path(head, base), split


def data_location(ref: str, base: Path) -> str:
    """A data ref with its path made absolute against `base`; builtins and hub refs unchanged."""
    if ref.startswith((BUILTIN_PREFIX, HUB_PREFIX)) or ref == NO_EVAL:
        return ref
    path, split = split_ref(ref, base)
    return str(path) if split is None else f"{path}@{split}"


def locate(ref: str) -> Path:
    if ref.startswith(BUILTIN_PREFIX):
        return builtin_path(ref)
    path, split = split_ref(ref)
    if not exists(path):
        raise DataError(f"{ref} does not exist; {FORMATS}")
    if is_dir(path):
        return dataset_folder(path, split, ref)
    if split is not None:
        raise DataError(f"{ref}: a @split suffix only applies to a `datasets` DatasetDict folder")
    if path.suffix not in FILE_TYPES:
        raise DataError(f"{ref} is not a format align reads; {FORMATS}")
    return path


def dataset_folder(path: Path, split: str | None, ref: str) -> Path:
    """A `datasets` Dataset folder; for a DatasetDict, the folder of the split the ref names."""
    splits_file = path / "dataset_dict.json"
    if splits_file.is_file():
        try:
            splits = list(json.loads(splits_file.read_text(encoding="utf-8"))["splits"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DataError(f"{ref}: dataset_dict.json cannot be read: {error}") from None
        if split is None:
            raise DataError(
                f"{ref} holds several splits ({', '.join(splits)}): name one, as {ref}@{splits[0]}"
            )
        if split not in splits:
            raise DataError(f"{ref} has no split {split!r}; it has: {', '.join(splits)}")
        path = path / split
    elif split is not None:
        raise DataError(f"{ref}: a @split suffix only applies to a DatasetDict folder, and {path} is not one")
    if not (path / "state.json").is_file():
        raise DataError(
            f"{ref} is a folder that `datasets` save_to_disk did not write (no state.json); {FORMATS}"
        )
    return path


def load_data(ref: str, kind: str, field: str, columns: dict[str, str] | None = None) -> Any:
    """The dataset behind `ref`, its columns renamed by `columns` (`data.columns`) and a known shape
    converted (align/data/shapes.py), checked to have the columns a `kind` stage needs."""
    path = None if ref.startswith(HUB_PREFIX) else resolve_data(ref, field)
    try:
        dataset = hub_rows(ref) if path is None else read_dataset(path, ref)
        dataset = normalized(dataset, ref, columns or {})
    except DataError as error:
        raise DataError(f"{field}: {error}") from None
    problem = column_problem(ref, dataset.column_names, kind)
    if problem is None and len(dataset) == 0:
        problem = f"{ref} has no rows"
    if problem is not None:
        raise DataError(f"{field}: {problem}")
    return dataset


def normalized(dataset: Any, ref: str, columns: dict[str, str]) -> Any:
    """The rows renamed and converted by the scan's own `Normalizer`; the dataset as it is when nothing
    applies."""
    if len(dataset) == 0 or (not columns and detect(dataset[0]) is None):
        return dataset
    normalize = Normalizer(columns)

    def convert(row: dict[str, Any], index: int) -> dict[str, Any]:
        try:
            return normalize(row)
        except RowProblem as problem:
            raise DataError(f"{ref} row {index} {problem}") from None

    fingerprint = digest({"from": dataset_fingerprint(dataset), "columns": columns, "shapes": 1})
    return dataset.map(
        convert, with_indices=True, remove_columns=dataset.column_names, new_fingerprint=fingerprint[:32]
    )


def data_identity(ref: str, field: str) -> str:
    """What says a dataset changed: its bytes' hash, or for a hub dataset the ref pinned to the commit the
    hub serves now (or, with no hub, the one cached here)."""
    if not ref.startswith(HUB_PREFIX):
        return file_digest(resolve_data(ref, field))
    try:
        return str(resolved(ref))
    except DataError as error:
        raise DataError(f"{field}: {error}") from None


def hub_problem(ref: str, kind: str, columns: dict[str, str]) -> str | None:
    """What can be said of a hub ref without asking the hub: its form, and, where a copy is cached here, its
    split and columns (after `columns`' renames). An uncached one may be there where the pipeline runs:
    `absent_hub_data` names it."""
    try:
        copy = local_copy(hub := parse_hub_ref(ref))
    except DataError as error:
        return str(error)
    if copy is None:
        return None
    if hub.split not in copy.splits:
        return f"{ref} has no split {hub.split!r} in its cached copy; it has: {', '.join(copy.splits)}"
    return column_problem(ref, [columns.get(name, name) for name in copy.features], kind)


def datasets_cache() -> Path:
    """`$HF_DATASETS_CACHE`, else align's cache folder; one subfolder per datasets, transformers and TRL
    version, so that an upgrade never reads rows another version prepared."""
    import importlib.metadata

    root = Path(os.environ.get("HF_DATASETS_CACHE") or cache_root() / "datasets")
    versions = "-".join(importlib.metadata.version(name) for name in ("datasets", "transformers", "trl"))
    return root / versions


def read_dataset(path: Path, ref: str) -> Any:
    """The rows of a file or `datasets` folder as a memory-mapped Arrow dataset."""
    import pyarrow
    from datasets import load_dataset, load_from_disk
    from datasets.exceptions import DatasetGenerationError

    release_pages_on_open()
    try:
        if is_dir(path):
            return load_from_disk(str(path))
        (builder, options), cache = arrow_builder(path), datasets_cache()
        build_apart(path, cache)
        return load_dataset(builder, data_files=str(path), split="train", cache_dir=str(cache), **options)
    except (OSError, ValueError, pyarrow.ArrowException, DatasetGenerationError) as error:
        raise DataError(
            first_bad_row(path, ref) or f"{ref} cannot be read: {error.__cause__ or error}"
        ) from None


def first_bad_row(path: Path, ref: str) -> str | None:
    """Where a file `datasets` could not load breaks, by its line (the scan does this for `align validate`;
    this is for a file loaded without one)."""
    place, _, rows = row_source(path, SimpleNamespace(update=lambda _: None))
    try:
        for where, row, error in rows:
            if error is not None or not isinstance(row, dict):
                return bad_row(ref, place, where, row, error)
    except DataError as error:  # a CSV line that does not fit its header, a broken JSON array
        return f"{ref} {error}"
    return None


def bad_row(ref: str, place: str, where: str, row: Any, error: str | None) -> str:
    """A row that is not a JSON object, in words."""
    if error is not None:
        return f"{ref} {place} {where} is not valid JSON ({error}); each {place} must hold one JSON object"
    return f"{ref} {place} {where} is a JSON {type(row).__name__}; each {place} must be an object"


def missing_columns(columns: list[str], kind: str) -> list[str]:
    """Nothing when `columns` satisfy one of the column sets a `kind` stage accepts, else what the set the
    user most likely meant lacks: fewest columns missing, then most present."""
    alternatives = DATA_COLUMNS[kind]
    if any(set(needed) <= set(columns) for needed in alternatives):
        return []
    closest = min(
        alternatives, key=lambda needed: (len(set(needed) - set(columns)), -len(set(needed) & set(columns)))
    )
    return [column for column in closest if column not in columns]


def column_problem(ref: str, columns: list[str], kind: str) -> str | None:
    """None if `columns` satisfy one of the column sets a `kind` stage accepts, else what is missing."""
    missing = missing_columns(columns, kind)
    if not missing:
        return None
    suggestion = suggest_columns(columns, DATA_COLUMNS[kind])
    return (
        f"{ref} lacks column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} that {kind} "
        f"data needs (it has: {', '.join(columns)}); "
        f"expected one of: {', '.join('+'.join(needed) for needed in DATA_COLUMNS[kind])}"
        + (f"; if they are named otherwise, rename them: {suggestion}" if suggestion else "")
    )
