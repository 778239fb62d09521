"""What `max_length` does to a stage's prepared rows, counted over the whole file: token lengths, the rows it
cuts, the rows it leaves with no loss-bearing token (they train nothing), the conversations whose last answer
it cuts (they teach an answer that never ends, or ends elsewhere), and preference pairs it leaves identical
(no margin to learn).

The counts read the rows TRL prepared (tokenized, with labels or prompt/completion ids), prepared with no
length limit, and apply the cut exactly as TRL does: SFT's `truncation_mode` slice of `input_ids` and
`labels`; the preference and unpaired trainers' `keep_start` cut of prompt + completion. They stream the
Arrow table in record batches with numpy, so a 2M-row file is counted in seconds in bounded memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from align.cache import cache_root, write_atomically
from align.fingerprint import digest

BATCH_ROWS = 10_000
IGNORED = -100  # a label that carries no loss (TRL's, torch's ignore_index)
PAIRED_KINDS = ("dpo", "reward")


@dataclass(frozen=True)
class LengthReport:
    """Counts over every prepared row of a stage, at its `max_length` (None: no limit)."""

    rows: int
    p50: int
    p95: int
    longest: int
    max_length: int | None
    over: int  # rows longer than max_length: cut (or, for a reward model, dropped by TRL)
    emptied: int  # rows with no loss-bearing token left after the cut: they train nothing
    identical: int  # preference pairs whose chosen and rejected are the same after the cut
    keeps_all: int  # the smallest max_length that leaves every row a loss-bearing token
    answers_cut: int = 0  # conversations that keep a loss-bearing token but lose part of their last answer
    keeps_answers: int = 0  # the smallest max_length that keeps every last answer whole

    def metrics(self) -> dict[str, float]:
        """The figures a stage's record carries, under `data_`."""
        return {f"data_{key}": float(value) for key, value in asdict(self).items() if value is not None}

    def lines(self) -> list[str]:
        """What a person reads under the preview and in `align plan`."""
        lines = [
            f"{self.rows:,} rows, lengths in tokens: p50 {self.p50:,}, p95 {self.p95:,}, max {self.longest:,}"
        ]
        if self.max_length is None:
            return [*lines, "no max_length: nothing is cut"]
        lines.append(
            f"max_length {self.max_length:,} cuts {self.over:,} ({share(self.over, self.rows)}) and leaves "
            f"{self.emptied:,} ({share(self.emptied, self.rows)}) with no loss-bearing token"
            + (f": a max_length of {self.keeps_all:,} keeps one in each" if self.emptied else "")
        )
        if self.answers_cut:
            lines.append(
                f"{self.answers_cut:,} ({share(self.answers_cut, self.rows)}) lose their last answer to the "
                f"cut, wholly or in part: a max_length of {self.keeps_answers:,} keeps every answer whole"
            )
        if self.identical:
            lines.append(
                f"{self.identical:,} pairs ({share(self.identical, self.rows)}) are identical after the cut: "
                "chosen and rejected differ only past max_length, so they teach nothing"
            )
        return lines


def share(count: int, total: int) -> str:
    return f"{100 * count / total:.1f}%" if total else "0%"


def offsets_and_values(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """A pyarrow list column's row offsets and flat values, as numpy arrays."""
    import pyarrow as pa

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = column.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    values = column.flatten().to_numpy(zero_copy_only=False)
    return offsets - offsets[0], values


def lengths_of(column: Any) -> np.ndarray:
    return np.diff(offsets_and_values(column)[0])


def batches(table: Any, columns: list[str]) -> Iterator[Any]:
    yield from table.select(columns).to_batches(max_chunksize=BATCH_ROWS)


def sft_batch(batch: Any, max_length: int | None, mode: str) -> dict[str, np.ndarray]:
    """Per row: its length, the loss-bearing tokens left in the window the cut keeps, the shortest
    max_length that keeps one (reaching the first loss token with keep_start, the last with keep_end), and
    whether the cut takes part of the last run of loss-bearing tokens (the last answer), with the shortest
    max_length that keeps that run whole."""
    offsets, labels = offsets_and_values(batch.column("labels"))
    sizes = np.diff(offsets)
    bearing = labels != IGNORED
    running = np.concatenate([[0], np.cumsum(bearing)])
    limit = sizes if max_length is None else np.minimum(sizes, max_length)
    start = offsets[:-1] if mode == "keep_start" else offsets[1:] - limit
    kept = running[start + limit] - running[start]
    position = np.arange(len(labels)) - np.repeat(offsets[:-1], sizes)
    reach = position + 1 if mode == "keep_start" else np.repeat(sizes, sizes) - position
    far = np.iinfo(np.int64).max
    needed = reduce_rows(np.minimum, np.where(bearing, reach, far), offsets, far)
    # the last answer: from the start of the last run of loss-bearing tokens to its last token
    opens = bearing & ((position == 0) | ~np.concatenate([[False], bearing[:-1]]))
    last = reduce_rows(np.maximum, np.where(bearing, position, -1), offsets, -1)
    opened = reduce_rows(np.maximum, np.where(opens, position, -1), offsets, -1)
    whole = last + 1 if mode == "keep_start" else np.where(opened >= 0, sizes - opened, 0)
    return {
        "length": sizes,
        "kept": kept,
        "needed": np.where(needed == far, 0, needed),
        "answer_cut": (last >= 0) & (whole > limit),
        "whole": np.where(last >= 0, whole, 0),
    }


def reduce_rows(ufunc: Any, values: np.ndarray, offsets: np.ndarray, empty: int) -> np.ndarray:
    """`ufunc` over each row's slice of `values`; `empty` for a row with none."""
    sizes = np.diff(offsets)
    out = np.full(len(sizes), empty, dtype=np.int64)
    filled = sizes > 0
    if filled.any():
        out[filled] = ufunc.reduceat(values, offsets[:-1][filled]) if len(values) else empty
    return out


def completion_batch(batch: Any, kind: str, max_length: int | None) -> dict[str, np.ndarray]:
    """Per row of prompt + completion(s), cut from the start (TRL's preference and unpaired trainers):
    a row keeps a loss-bearing token while its prompt is shorter than max_length. A reward model's row
    (chosen and rejected, each whole) is dropped by TRL when longer."""
    limit = max_length or np.iinfo(np.int64).max
    if kind == "reward":
        longer = np.maximum(lengths_of(batch.column("chosen_ids")), lengths_of(batch.column("rejected_ids")))
        return {"length": longer, "kept": (longer <= limit).astype(np.int64), "needed": longer}
    prompt = lengths_of(batch.column("prompt_ids"))
    if kind == "dpo":
        completion = np.maximum(
            lengths_of(batch.column("chosen_ids")), lengths_of(batch.column("rejected_ids"))
        )
    else:
        completion = lengths_of(batch.column("completion_ids"))
    kept = np.clip(np.minimum(prompt + completion, limit) - prompt, 0, None)
    return {"length": prompt + completion, "kept": kept, "needed": prompt + 1}


def identical_pairs(batch: Any, max_length: int | None) -> int:
    """DPO pairs whose chosen and rejected completions are the same in the part the cut keeps."""
    columns = batch.to_pydict()
    same = 0
    for prompt, chosen, rejected in zip(
        columns["prompt_ids"], columns["chosen_ids"], columns["rejected_ids"], strict=True
    ):
        room = None if max_length is None else max(0, max_length - len(prompt))
        same += room != 0 and chosen[:room] == rejected[:room]
    return same


def has_answers(table: Any) -> bool:
    """Whether SFT rows are conversations or prompt + completion (their last loss-bearing run is an answer
    that must end), not plain text (whose cut is only a shorter text)."""
    return bool({"messages", "completion"} & set(table.column_names))


COLUMNS = {
    "sft": ["labels"],
    "dpo": ["prompt_ids", "chosen_ids", "rejected_ids"],
    "kto": ["prompt_ids", "completion_ids"],
    "reward": ["chosen_ids", "rejected_ids"],
}
"""The prepared columns each kind's counts read."""


def length_report(table: Any, kind: str, max_length: int | None, mode: str = "keep_start") -> LengthReport:
    """The counts over a prepared Arrow `table` of a `kind` stage (a key of COLUMNS)."""
    lengths, kept, needed, identical, answers_cut, keeps_answers = [], [], [], 0, 0, 0
    answers = kind == "sft" and has_answers(table)
    for batch in batches(table, COLUMNS[kind]):
        found = (
            sft_batch(batch, max_length, mode) if kind == "sft" else completion_batch(batch, kind, max_length)
        )
        lengths.append(found["length"])
        kept.append(found["kept"])
        needed.append(found["needed"])
        if answers:  # an emptied row is counted as emptied, not here
            answers_cut += int((found["answer_cut"] & (found["kept"] > 0)).sum())
            keeps_answers = max(keeps_answers, int(found["whole"].max(initial=0)))
        if kind == "dpo":
            identical += identical_pairs(batch, max_length)
    length = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
    left = np.concatenate(kept) if kept else length
    keeps = np.concatenate(needed) if needed else length
    limit = np.iinfo(np.int64).max if max_length is None else max_length
    return LengthReport(
        rows=len(length),
        p50=int(np.percentile(length, 50, method="lower")) if len(length) else 0,
        p95=int(np.percentile(length, 95, method="higher")) if len(length) else 0,
        longest=int(length.max()) if len(length) else 0,
        max_length=max_length,
        over=int((length > limit).sum()),
        emptied=int((left == 0).sum()),
        identical=identical,
        keeps_all=int(keeps.max()) if len(keeps) else 0,
        answers_cut=answers_cut,
        keeps_answers=keeps_answers,
    )


def lengths_path(plan: Any) -> Path:
    """Where the counts of a stage's preparation are kept, keyed by what decides them (its settings, its
    chat template, its model and data as named), so `align plan` shows them until one of those changes.
    `plan` is the stage's plan (align/planning/plan.py StagePlan)."""
    template = plan.chat_template.text if plan.chat_template is not None else None
    decided_by = {
        "stage": plan.stage.model_dump(mode="json"),
        "template": template,
        "model": plan.model_source,
    }
    return cache_root() / "data-lengths" / f"{digest(decided_by)[:32]}.json"


def remember(path: Path, report: LengthReport) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps(asdict(report)))


def recalled(path: Path) -> LengthReport | None:
    """The counts a preview or an earlier run kept for the same preparation, None if none were."""
    try:
        return LengthReport(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
