"""What is known of a stage's data sources before any of them loads: their names, rows and shares (what
`align plan` prints), and what is wrong with a mixture (what `align validate` refuses): shares given on some
sources and not others, more rows asked of a source than it has, and sources whose rows take formats that
cannot be mixed into one dataset (TRL reads one format per dataset).

Nothing here imports `datasets`: rows are counted by the scan (align/data/scan.py, cached since validate)
or read from a hub dataset's cached `dataset_info.json` (align/data/hub.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from align.data.corpora import BUILTIN_PREFIX, builtin_path
from align.data.hub import HUB_PREFIX, HubRef, local_copy, offline, parse_hub_ref, unreached
from align.data.loading import DATA_COLUMNS, HELD_OUT_MIN_TRAIN, HELD_OUT_ROWS, HELD_OUT_SHARE, NO_EVAL
from align.data.scan import first_row, scanned_rows
from align.data.shapes import Normalizer, RowProblem, describe
from align.errors import DataError, Problem

DEFAULT_MIX = "first_exhausted"  # `data.mix` when unset: no row repeats
SHARES = (
    "give every source a `weight` (each row's source drawn at those odds), or every source `rows` (that "
    "many from each), or none (every row of each)"
)


def source_name(path: str) -> str:
    """A short name for a source: a file's or folder's name, a builtin or hub ref as written."""
    return path if path.startswith((BUILTIN_PREFIX, HUB_PREFIX)) else Path(path).name


def source_names(paths: list[str]) -> list[str]:
    """Each source's short name, or its whole path where two short names are the same."""
    short = [source_name(path) for path in paths]
    return [name if short.count(name) == 1 else path for name, path in zip(short, paths, strict=True)]


def share_key(source: Any) -> str | None:
    return "weight" if source.weight is not None else "rows" if source.rows is not None else None


def held_out_size(rows: int) -> int:
    """How many of a source's `rows` are held out when no eval split is given (none from a tiny source: the
    slice would starve training)."""
    return 0 if rows < HELD_OUT_MIN_TRAIN else min(HELD_OUT_ROWS, max(1, round(rows * HELD_OUT_SHARE)))


def source_rows(path: str, kind: str, columns: dict[str, str]) -> int | None:
    """A source's rows, where they are known without loading it: a local file's or builtin's as its scan
    counted them, a hub dataset's split as its cached copy says (None: not cached here)."""
    if not path.startswith(HUB_PREFIX):
        return scanned_rows(path, kind, columns)
    try:
        copy = local_copy(hub := parse_hub_ref(path))
    except DataError:
        return None
    return None if copy is None else copy.splits.get(hub.split)


def absent_hub_data(data_by_stage: dict[str, Any]) -> list[Problem]:
    """Each hub dataset the stages read (each training stage's `data:`, None for other kinds) that this
    machine cannot load: not in the local cache while the hub is off. `align data` and a run here refuse
    it; `validate` and `plan` name it (it may be there where the pipeline runs), as they name an absent hub
    model."""
    found = []
    for name, data in data_by_stage.items():
        for path, ref, _columns, _at in data_refs(data, f"stages.{name}") if data is not None else ():
            if ref.startswith(HUB_PREFIX) and offline() and (hub := cached_ref(ref)) is not None:
                found.append(Problem(path, unreached(hub)))
    return found


def cached_ref(ref: str) -> HubRef | None:
    """The parsed ref when no copy of it is cached here (None when one is, or it does not parse)."""
    try:
        hub = parse_hub_ref(ref)
    except DataError:
        return None  # the scan names a ref of the wrong form
    return hub if local_copy(hub) is None else None


def data_refs(data: Any, where: str) -> list[tuple[str, str, dict[str, str], str]]:
    """(YAML path, ref, renames, YAML path of the renames) of each source of `train` and of `eval`."""
    refs = []
    for index, source in enumerate(data.sources):
        own = data.is_mixture and data.train[index].columns is not None
        at = f"{where}.data.train" + (f"[{index}]" if data.is_mixture else "")
        path = f"{at}.path" if data.is_mixture else at
        refs.append((path, source.path, source.columns, f"{at}.columns" if own else f"{where}.data.columns"))
    if data.eval not in (None, NO_EVAL):
        refs.append((f"{where}.data.eval", data.eval, data.columns, f"{where}.data.columns"))
    return refs


def mixture_problems(data: Any, kind: str, where: str) -> list[Problem]:
    """What is wrong with `data.train` as a mixture: its shares, a count of rows a source lacks, sources of
    formats that cannot be mixed. Each source's own rows are checked by the scan before this."""
    problems = share_problems(data, where)
    if not data.is_mixture or problems:
        return problems
    sources = data.sources
    names = source_names([source.path for source in sources])
    formats = [source_format(source.path, source.columns, kind) for source in sources]
    known = next((index for index, found in enumerate(formats) if found is not None), None)
    for index, (source, found) in enumerate(zip(sources, formats, strict=True)):
        if known is not None and found is not None and found != formats[known]:
            problems.append(
                Problem(
                    f"{where}.data.train[{index}]",
                    f"{names[index]} holds {found} rows and {names[known]} (train[{known}]) holds "
                    f"{formats[known]}: the sources of one mixture must share one format (TRL reads one per "
                    "dataset); convert one, or rename its columns with its own `columns:`",
                )
            )
        if source.rows is not None and (message := rows_problem(source, names[index], kind, data.eval)):
            problems.append(Problem(f"{where}.data.train[{index}].rows", message))
    return problems


def share_problems(data: Any, where: str) -> list[Problem]:
    """Every source gives the same kind of share (a weight, rows, or none), and `mix` goes with weights."""
    problems = []
    sources = data.train if data.is_mixture else []
    keys = [share_key(source) for source in sources]
    departs = next((index for index, key in enumerate(keys) if key != keys[0]), None)
    if departs is not None:
        key, first = keys[departs], keys[0]
        here = f"a `{key}`" if key else "no weight or rows"
        there = f"a `{first}`" if first else "no weight or rows"
        problems.append(
            Problem(
                f"{where}.data.train[{departs}].{key or first}",
                f"this source has {here} and train[0] {there}: {SHARES}",
            )
        )
    if data.mix is not None and (not keys or keys[0] != "weight"):
        problems.append(
            Problem(
                f"{where}.data.mix",
                "only sources with a `weight` are interleaved (until the first or every one runs out); drop "
                "`mix`, or give each source a weight",
            )
        )
    return problems


def rows_problem(source: Any, name: str, kind: str, eval_ref: str | None) -> str | None:
    """A count of rows more than a source has to train on, in words; None when it has them (or its rows
    are not known before it loads)."""
    rows = source_rows(source.path, kind, source.columns)
    if rows is None:
        return None
    held = held_out_size(rows) if eval_ref is None else 0
    if source.rows <= rows - held:
        return None
    aside = f", {held} of them held out (no eval split given)" if held else ""
    return f"asks for {source.rows} rows and {name} has {rows}{aside}; lower `rows`, or give it more rows"


def source_format(path: str, columns: dict[str, str], kind: str) -> str | None:
    """The format a source's rows take for a `kind` stage, in words (`prompt+completion as text`), from its
    first row or its cached hub copy's columns; None where that is not known before it loads."""
    found = hub_columns(path, columns) if path.startswith(HUB_PREFIX) else row_columns(path, columns)
    if found is None:
        return None
    present, lists = found
    fitting = [needed for needed in DATA_COLUMNS[kind] if set(needed) <= present]
    if not fitting:
        return None  # the scan says what it lacks
    needed = max(fitting, key=len)
    if needed == ("messages",):
        return "messages"
    return "+".join(needed) + (" as conversations" if set(needed) & lists else " as text")


def row_columns(path: str, columns: dict[str, str]) -> tuple[set[str], set[str]] | None:
    """(the columns with a value, those holding a list) of a local source's first row, as it trains."""
    try:
        row = first_row(str(builtin_path(path)) if path.startswith(BUILTIN_PREFIX) else path)
        row = None if row is None else Normalizer(columns)(row)
    except (DataError, RowProblem):
        return None
    if row is None:
        return None
    return {key for key, value in row.items() if value is not None}, {
        key for key, value in row.items() if isinstance(value, list)
    }


def hub_columns(path: str, columns: dict[str, str]) -> tuple[set[str], set[str]] | None:
    """(the columns, those holding lists) of a hub dataset's cached copy, renamed; None when not cached."""
    try:
        copy = local_copy(parse_hub_ref(path))
    except DataError:
        return None
    if copy is None:
        return None
    features = {columns.get(name, name): feature for name, feature in copy.features.items()}
    lists = {
        name
        for name, feature in features.items()
        if isinstance(feature, list) or (isinstance(feature, dict) and feature.get("_type") != "Value")
    }
    return set(features), lists


def plan_lines(data: Any, kind: str) -> list[str]:
    """`align plan`'s lines for a mixture: how its sources are mixed, then each one's rows and share."""
    if not data.is_mixture:
        return []
    sources = data.sources
    names = source_names([source.path for source in sources])
    counts = [source_rows(source.path, kind, source.columns) for source in sources]
    key = share_key(sources[0])
    if key == "weight":
        total = sum(source.weight for source in sources)
        shares = [source.weight / total for source in sources]
    elif key == "rows":
        shares = [source.rows / sum(source.rows for source in sources) for source in sources]
    else:
        known = None if None in counts else sum(counts)
        shares = [count / known if known else None for count in counts]
    lines = [mix_line(data, key, shares, counts)]
    if key == "weight" and (data.mix or DEFAULT_MIX) == DEFAULT_MIX and None not in counts:
        lines += [f"  {note}" for note in [unused_estimate(data, shares, counts, names)] if note]
    for index, (source, name, count, share) in enumerate(zip(sources, names, counts, shares, strict=True)):
        rows = f"{count:,} rows" if count is not None else "rows known once it loads (not cached here)"
        given = f"weight {source.weight:g}, " if key == "weight" else ""
        given = f"{source.rows:,} drawn, " if key == "rows" else given
        share_text = f"{given}{share:.0%} of the mix" if share is not None else given.rstrip(", ")
        shape = None if source.path.startswith(HUB_PREFIX) else conversion(source.path, source.columns)
        lines.append(f"  train[{index}] {name}: {rows}; {share_text}" + (f"; {shape}" if shape else ""))
    return lines


def trainable_rows(data: Any, counts: list[int]) -> list[int]:
    """Each source's rows less its held-out slice (taken when no eval split is given)."""
    return [rows - (held_out_size(rows) if data.eval is None else 0) for rows in counts]


def unused_estimate(data: Any, shares: list[float], counts: list[int], names: list[str]) -> str | None:
    """Where mixing until the first source runs out leaves more than half the rows unused: about how many,
    per source, and the settings that use them (the run counts them exactly, align/data/mixtures.py)."""
    trainable = trainable_rows(data, counts)
    total = min(rows / share for rows, share in zip(trainable, shares, strict=True))
    used = [min(rows, round(total * share)) for rows, share in zip(trainable, shares, strict=True)]
    if 2 * (sum(trainable) - sum(used)) <= sum(trainable):
        return None
    sources = list(zip(names, used, trainable, strict=True))
    return unused_words(sum(trainable), sum(used), sources, "about ")


def unused_words(offered: int, used: int, sources: list[tuple[str, int, int]], about: str = "") -> str:
    """How many of a mixture's rows it leaves unused, per source (name, used, offered), and what uses them."""
    each = ", ".join(f"{name} {taken:,} of {rows:,}" for name, taken, rows in sources)
    return (
        f"the mixture uses {about}{used:,} of its {offered:,} rows and leaves {offered - used:,} unused "
        f"({each}): "
        "`mix: all_exhausted` mixes until every source is used (the smaller ones repeat), or `rows:` on each "
        "source draws the counts you choose"
    )


def mix_line(data: Any, key: str | None, shares: list[float | None], counts: list[int | None]) -> str:
    """How the sources are mixed, and about how many rows the mix holds where every count is known."""
    count = len(data.sources)
    if key != "weight":
        how = "the rows given drawn from each" if key == "rows" else "every row of each"
        return f"data: {count} sources, {how}, shuffled together"
    strategy = data.mix or DEFAULT_MIX
    until = (
        "the first runs out" if strategy == DEFAULT_MIX else "every one has run out, the smaller repeating"
    )
    line = f"data: {count} sources, mixed at their weights until {until} (mix: {strategy})"
    if None not in counts:
        trainable = trainable_rows(data, counts)
        runs = [rows / share for rows, share in zip(trainable, shares, strict=True)]
        line += f": about {round(min(runs) if strategy == DEFAULT_MIX else max(runs)):,} rows"
    return line


def conversion(path: str, columns: dict[str, str]) -> str | None:
    """What is done to a local source's rows before training (renames, a shape's conversion), in words."""
    try:
        row = first_row(str(builtin_path(path)) if path.startswith(BUILTIN_PREFIX) else path)
    except DataError:
        return None
    return describe(row, columns)
