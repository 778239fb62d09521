"""A stage's training rows, from one source or a mixture of several, and the rows it holds out.

Each source is loaded on its own (its renames and shape conversion, align/data/loading.py) and, without an
eval split, gives up its own held-out slice first, so a small source is measured too. What is left is then
mixed by its share:
- `weight` on every source: `datasets.interleave_datasets` draws each row's source at those odds, seeded
  by the pipeline's seed, until the first source runs out (`data.mix: first_exhausted`, the default: no
  row repeats) or until every one has (`all_exhausted`: the smaller ones repeat);
- `rows` on every source: that many rows drawn from each (seeded), then shuffled together
  (`concatenate_datasets`);
- neither: every row of every source, shuffled together.
Each source's rows are taken in a seeded order, so a source that is not used up gives a random part of
itself. `data.max_train_rows` then keeps the first rows of the mix, which hold the same shares.

The mix is decided on a small table of (source, row) pairs and the rows selected from the sources by it,
so `StageRows.sources` says where each training row came from and no column of it reaches the trainer.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from align.data.loading import NO_EVAL, load_data
from align.data.sources import DEFAULT_MIX, held_out_size, source_names, unused_words
from align.errors import DataError


@dataclass
class StageRows:
    """A stage's training rows, its held-out rows (None: nothing is measured), and the name of the source
    each training row came from (`sources[i]` for `train[i]`)."""

    train: Any
    held_out: Any
    sources: list[str]
    offered: dict[str, int] = field(default_factory=dict)
    """A mixture's sources and the rows each could train on; `mixed` is how many of them the mix took."""
    mixed: dict[str, int] = field(default_factory=dict)

    def mixture_counts(self) -> dict[str, float]:
        """What the stage's record keeps of a mixture: the rows each source offered and the mix used."""
        counts = {f"data_mix_offered[{name}]": float(rows) for name, rows in self.offered.items()}
        counts |= {f"data_mix_used[{name}]": float(self.mixed.get(name, 0)) for name in self.offered}
        return counts

    def unused_note(self) -> str | None:
        """A mixture that leaves more than half its rows unused, in words with the settings that use them."""
        offered, used = sum(self.offered.values()), sum(self.mixed.values())
        if not offered or 2 * (offered - used) <= offered:
            return None
        return unused_words(
            offered, used, [(n, self.mixed.get(n, 0), rows) for n, rows in self.offered.items()]
        )


def stage_rows(data: Any, kind: str, seed: int, where: str) -> StageRows:
    """The rows a stage with the `data:` block `data` trains on and measures, for its data `kind`; `where`
    is the stage's YAML path (`stages.sft`), named in every error."""
    sources = data.sources
    names = source_names([source.path for source in sources])
    own_held_out = data.eval is None
    parts, held = [], []
    for index, source in enumerate(sources):
        field = f"{where}.data.train" + (f"[{index}].path" if data.is_mixture else "")
        rows = load_data(source.path, kind, field, source.columns)
        if not data.is_mixture and data.max_train_rows:  # one source: limited before its slice, as always
            rows = rows.select(range(min(data.max_train_rows, len(rows))))
        if own_held_out:
            rows, held_out = held_out_slice(rows, seed)
            held.append(held_out)
        if source.rows is not None:
            rows = drawn(rows, source.rows, seed, index, f"{where}.data.train[{index}].rows")
        parts.append(rows)
    train, order = mixed(parts, sources, names, seed, data.mix or DEFAULT_MIX, where)
    offered = {name: len(rows) for name, rows in zip(names, parts, strict=True)} if data.is_mixture else {}
    taken = Counter(order)
    used = {name: taken[index] for index, name in enumerate(names)} if data.is_mixture else {}
    if data.is_mixture and data.max_train_rows and data.max_train_rows < len(train):
        train, order = train.select(range(data.max_train_rows)), order[: data.max_train_rows]
    if own_held_out:
        kept = [(rows, name) for rows, name in zip(held, names, strict=True) if rows is not None]
        held_out = together([rows for rows, _ in kept], [name for _, name in kept], where)
    elif data.eval == NO_EVAL:
        held_out = None
    else:
        held_out = load_data(data.eval, kind, f"{where}.data.eval", data.columns)
    if held_out is not None and data.max_eval_rows:  # an eval split's, or the slice's (still not trained)
        held_out = held_out.select(range(min(data.max_eval_rows, len(held_out))))
    return StageRows(train, held_out, [names[index] for index in order], offered, used)


def held_out_slice(train: Any, seed: int) -> tuple[Any, Any]:
    """(the rows to train on, a seeded slice of the others to measure on); no slice from a tiny set."""
    import torch

    size = held_out_size(len(train))
    if size == 0:
        return train, None
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
    return train.select(sorted(order[size:])), train.select(sorted(order[:size]))


def seeded_order(length: int, seed: int, index: int) -> list[int]:
    """A permutation of a source's rows, its own for each source (`index`) under one seed."""
    import numpy as np

    return np.random.default_rng([seed, index]).permutation(length).tolist()


def drawn(rows: Any, count: int, seed: int, index: int, field: str) -> Any:
    """`count` rows of a source, drawn in its seeded order."""
    if count > len(rows):
        raise DataError(
            f"{field}: asks for {count} rows, and the source has {len(rows)} to train on (its held-out rows "
            "set aside); lower `rows`, or give the source more"
        )
    return rows.select(sorted(seeded_order(len(rows), seed, index)[:count]))


def mixed(
    parts: list[Any], sources: list[Any], names: list[str], seed: int, strategy: str, where: str
) -> tuple[Any, list[int]]:
    """The sources' rows mixed, and the source of each (its index)."""
    if len(parts) == 1:
        return parts[0], [0] * len(parts[0])
    from datasets import Dataset, concatenate_datasets, interleave_datasets

    tables = [
        Dataset.from_dict({"source": [index] * len(rows), "row": seeded_order(len(rows), seed, index)})
        for index, rows in enumerate(parts)
    ]
    if all(source.weight is not None for source in sources):
        total = sum(source.weight for source in sources)
        odds = [source.weight / total for source in sources]
        order = interleave_datasets(tables, probabilities=odds, seed=seed, stopping_strategy=strategy)
    else:
        order = concatenate_datasets(tables).shuffle(seed=seed)
    starts = [sum(len(rows) for rows in parts[:index]) for index in range(len(parts))]
    picked, rows = order["source"], order["row"]
    everything = together(parts, names, where)
    return everything.select([starts[source] + row for source, row in zip(picked, rows, strict=True)]), picked


def together(parts: list[Any], names: list[str], where: str) -> Any:
    """The parts one after another (None when there are none), with every column any of them has: a row of
    a source without a column (a `tools` schema, a message's `tool_calls`, a column a reward reads) holds
    None there, as a file whose rows lack a key does. A column one source holds as text and another as a
    list cannot be mixed, and is refused naming both."""
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    from datasets import Features, concatenate_datasets

    features = parts[0].features
    for index, part in enumerate(parts[1:], 1):
        try:
            features = Features(merged_feature(features, part.features))
        except TypeError as error:
            raise DataError(
                f"{where}.data.train: {names[index]}'s rows cannot be mixed with {names[0]}'s: {error}; give "
                "the sources one format (the same columns, of one type)"
            ) from None
    filled = []
    for part in parts:
        for column in features:
            if column not in part.column_names:
                part = part.add_column(column, [None] * len(part))
        filled.append(part.select_columns(list(features)).cast(features))
    return concatenate_datasets(filled)


def merged_feature(first: Any, second: Any, path: str = "") -> Any:
    """The `datasets` type that holds values of both: structs (and a dataset's columns) get every field of
    either, lists the merged type of their items, a column of only None the other's type. TypeError naming
    the field where the two differ otherwise. `datasets` reads items whose keys vary (tool calls beside
    plain turns) as `Json`, which holds either."""
    from datasets import List, Value
    from datasets.features import Json

    if isinstance(first, Json) or isinstance(second, Json):  # any JSON value: it holds the other's too
        return first if isinstance(first, Json) else second
    if isinstance(first, dict) and isinstance(second, dict):
        keys = dict.fromkeys([*first, *second])
        return {
            key: merged_feature(first[key], second[key], f"{path}.{key}".lstrip("."))
            if key in first and key in second
            else first.get(key, second.get(key))
            for key in keys
        }
    if isinstance(first, List) and isinstance(second, List):
        return List(merged_feature(first.feature, second.feature, f"{path}[]"))
    if first == second or second == Value("null"):
        return first
    if first == Value("null"):
        return second
    raise TypeError(
        f"{path or 'a column'} is {describe_feature(first)} in one and {describe_feature(second)} in the "
        "other"
    )


def describe_feature(feature: Any) -> str:
    from datasets import List, Value

    if isinstance(feature, Value):
        return feature.dtype
    return (
        "a list" if isinstance(feature, List) else "a struct" if isinstance(feature, dict) else str(feature)
    )
