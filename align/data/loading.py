"""Datasets for stages, in TRL's standard or conversational formats.

A ref is a builtin (`align:chatterbot/sft/train`), a .jsonl/.json/.parquet file, or a folder written
by `datasets`' `save_to_disk` (`folder@split` for a DatasetDict). `align.data.scan` checks every row
before anything loads.

Files load through `datasets`' own json and parquet builders into Arrow files under `datasets_cache()`, and
are memory-mapped from there: a rank holds the rows it reads, not the file, and every later `map` over them
(align's conversions, TRL's tokenization, the padding-free cut) is written beside them as a cache file keyed
by its fingerprint. A rerun, a `--force`, a retry, another stage reading the file the same way, or another
rank (TRL prepares on the main rank first) then reads what was prepared instead of preparing it again.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from align.cache import cache_root, exists, is_dir, user_path
from align.data.building import build_apart
from align.data.corpora import BUILTIN_DATA, BUILTIN_PREFIX, TOY_DATA, builtin_path
from align.data.mapped_pages import release_pages_on_open
from align.data.rows import row_source
from align.data.shapes import Normalizer, RowProblem, detect, suggest_columns
from align.errors import DataError
from align.fingerprint import digest, file_digest

NO_EVAL = "none"  # `eval: none`: no held-out measurement at all
HELD_OUT_SHARE = 0.05  # without an eval split, this share of train is held out of training and measured
HELD_OUT_ROWS = 64  # at most: held-out scoring runs before and after training
HELD_OUT_MIN_TRAIN = 40  # rows below which nothing is held out: the slice would starve training
HUB_PREFIX = "hf:"  # hf:org/name@split: a hub dataset, loaded where a hub is reachable
PAIRED = [("prompt", "chosen", "rejected"), ("chosen", "rejected")]
DATA_COLUMNS: dict[str, list[tuple[str, ...]]] = {
    "sft": [("messages",), ("text",), ("prompt", "completion")],
    "preferences": PAIRED,
    "unpaired": [("prompt", "completion", "label"), ("completion", "label"), *PAIRED],
    "prompts": [("prompt",)],
}
"""Each data kind (the kinds table's `data`) and the column sets of TRL's formats that it accepts."""
FORMATS = (
    "give a .jsonl, .json or .parquet file, a `datasets` save_to_disk folder (folder@split for a "
    f"DatasetDict), or a builtin: {', '.join([*BUILTIN_DATA, *TOY_DATA])}"
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
    if path.suffix not in (".jsonl", ".json", ".parquet"):
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
        dataset = hub_dataset(ref) if path is None else read_dataset(path, ref)
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

    fingerprint = digest({"from": dataset._fingerprint, "columns": columns, "shapes": 1})
    return dataset.map(
        convert, with_indices=True, remove_columns=dataset.column_names, new_fingerprint=fingerprint[:32]
    )


def hub_dataset(ref: str) -> Any:
    """A hub dataset (`hf:org/name@split`, split `train` by default); its columns are checked on load."""
    from datasets import load_dataset

    name, _, split = ref[len(HUB_PREFIX) :].partition("@")
    try:
        return load_dataset(name, split=split or "train")
    except Exception as error:  # noqa: BLE001 - offline, unknown name, unknown split: all user-facing
        raise DataError(f"{ref} cannot be loaded from the hub: {error}") from None


def data_identity(ref: str, field: str) -> str:
    """What says a dataset changed: its bytes' hash, or for a hub dataset its name (hubs version it)."""
    return ref if ref.startswith(HUB_PREFIX) else file_digest(resolve_data(ref, field))


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
        builder, cache = ("parquet" if path.suffix == ".parquet" else "json"), datasets_cache()
        build_apart(builder, path, cache)
        return load_dataset(builder, data_files=str(path), split="train", cache_dir=str(cache))
    except (OSError, pyarrow.ArrowException, DatasetGenerationError) as error:
        raise DataError(
            first_bad_row(path, ref) or f"{ref} cannot be read: {error.__cause__ or error}"
        ) from None


def first_bad_row(path: Path, ref: str) -> str | None:
    """Where a file `datasets` could not load breaks, by its line (the scan does this for `align validate`;
    this is for a file loaded without one)."""
    place, _, rows = row_source(path, SimpleNamespace(update=lambda _: None))
    for where, row, error in rows:
        if error is not None:
            return (
                f"{ref} {place} {where} is not valid JSON ({error}); each {place} must hold one JSON object"
            )
        if not isinstance(row, dict):
            return f"{ref} {place} {where} is a JSON {type(row).__name__}; each {place} must be an object"
    return None


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
