"""A training stage's `data:` block: one source (a string) or a mixture (a list of sources, each with its
share and its own renames), the held-out split, row limits, and how weighted sources are interleaved.

How the sources are read and mixed is align/data/mixtures.py; here only what the file may say.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from align.config.strict import Strict

NOT_A_SOURCE = "give a file, folder, builtin or hf: ref, or a list of sources ({path: ..., weight: ...})"


def checked_renames(columns: dict[str, str]) -> dict[str, str]:
    """`columns` ({name in the file: name align reads}) when each old and new name is one name."""
    if blank := [old for old, new in columns.items() if not old.strip() or not new.strip()]:
        raise ValueError(f"{blank[0]!r}: give both the file's column name and the name align reads")
    targets = list(columns.values())
    if twice := sorted({new for new in targets if targets.count(new) > 1}):
        raise ValueError(f"several columns are renamed to {', '.join(map(repr, twice))}: rename one to each")
    return columns


class SourceSpec(Strict):
    """One source of a mixture: a file, `datasets` folder, builtin or `hf:` ref; its share as a `weight`
    (sources interleaved at those odds) or a count of `rows` (that many drawn from it); its own renames."""

    path: str
    weight: Annotated[float, Field(gt=0)] | None = None
    rows: Annotated[int, Field(gt=0)] | None = None
    columns: dict[str, str] | None = None
    """Renames of this source's columns, as `data.columns`; None: the block's `data.columns`."""

    @field_validator("columns")
    @classmethod
    def one_name_each(cls, columns: dict[str, str] | None) -> dict[str, str] | None:
        return None if columns is None else checked_renames(columns)

    @field_validator("rows")
    @classmethod
    def one_share(cls, rows: int | None, info: ValidationInfo) -> int | None:
        if rows is not None and info.data.get("weight") is not None:
            raise ValueError("give this source a `weight` or a count of `rows`, not both")
        return rows


class DataSpec(Strict):
    """A stage's data: a builtin (`align:...`), a file (.jsonl, .json, .parquet, .csv, .tsv), a `datasets`
    folder, a hub ref (`hf:org/name[:config]@split[#revision]`), or a list of such sources mixed into one."""

    train: str | Annotated[list[SourceSpec], Field(min_length=1)]
    eval: str | None = None  # None: a held-out slice of train (align/data/mixtures.py); "none": no held-out
    max_train_rows: Annotated[int, Field(gt=0)] | None = None
    max_eval_rows: Annotated[int, Field(gt=0)] | None = None
    """At most this many held-out rows measured: the eval split's first, or those of the slice held out of
    train (the whole slice stays out of training either way)."""
    columns: dict[str, str] = {}
    """Renames applied to every row before anything reads it, {name in the file: name align reads}, e.g.
    {question: prompt, answer: completion} (align/data/shapes.py)."""
    mix: Literal["first_exhausted", "all_exhausted"] | None = None
    """How weighted sources are interleaved (`datasets.interleave_datasets`' stopping strategy): until the
    first source runs out (the default: no row is repeated), or until every one has (smaller ones repeat)."""
    max_emptied_share: Annotated[float, Field(ge=0, le=1)] | None = None
    """The share of training rows `max_length` may leave with no loss-bearing token (they train nothing)
    before the stage stops ahead of training (align/stages/prepared.py); None: 1%."""
    max_cut_answers_share: Annotated[float, Field(ge=0, le=1)] | None = None
    """The share of conversations `max_length` may cut into their last answer (they train its start, never its
    end) before the stage stops ahead of training; above `max_emptied_share` it says so and trains on. None:
    25%."""

    @field_validator("columns")
    @classmethod
    def one_name_each(cls, columns: dict[str, str]) -> dict[str, str]:
        return checked_renames(columns)

    @model_validator(mode="wrap")
    @classmethod
    def one_error_per_source(cls, data: Any, handler: Any) -> DataSpec:
        """pydantic reports a bad `train` once per member of its union (`train.str`, `train.list[...]`):
        keep the errors of the form that was written, each at its place (`train[1].weight`)."""
        try:
            return handler(data)
        except ValidationError as error:
            written = data.get("train") if isinstance(data, dict) else None
            details = [source_error(item, written) for item in error.errors()]
            kept = [detail for detail in details if detail is not None]
            raise ValidationError.from_exception_data(error.title, kept) from None

    @model_serializer(mode="wrap")
    def without_unset_keys(self, handler: Any) -> Any:
        """No `columns` key when nothing is renamed, and no `mix` or `max_emptied_share` when unset, so stages
        recorded before they existed stay up to date."""
        dumped = handler(self)
        if isinstance(dumped, dict):
            if not self.columns:
                dumped.pop("columns", None)
            for key in ("mix", "max_emptied_share", "max_cut_answers_share"):
                if getattr(self, key) is None:
                    dumped.pop(key, None)
        return dumped

    @property
    def sources(self) -> list[SourceSpec]:
        """`train` as sources: a string is one, renamed by `columns`; a source without its own renames
        takes `columns` too."""
        if isinstance(self.train, str):
            return [SourceSpec(path=self.train, columns=self.columns)]
        renames = {"columns": self.columns}
        return [s if s.columns is not None else s.model_copy(update=renames) for s in self.train]

    @property
    def is_mixture(self) -> bool:
        return not isinstance(self.train, str)


def source_error(item: Any, written: Any) -> InitErrorDetails | None:
    """One of pydantic's errors for the data block, the union member dropped from its place; None for the
    member that was not written (a list's errors read as a string, a string's as a list)."""
    loc, member = tuple(item["loc"]), None
    if loc[:1] == ("train",) and len(loc) > 1:
        loc, member = ("train", *loc[2:]), "str" if loc[1] == "str" else "list"
    if member is not None and not isinstance(written, (str, list)):  # neither: one error, not two
        if member == "list":
            return None
        return InitErrorDetails(type=PydanticCustomError("data_ref", NOT_A_SOURCE), loc=loc, input=written)
    if member is not None and (member == "str") != isinstance(written, str):
        return None
    return InitErrorDetails(type=item["type"], loc=loc, input=item["input"], ctx=item.get("ctx", {}))
