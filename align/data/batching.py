"""How an SFT stage batches its rows: padding-free unless its `trl:` block says otherwise.

A padded batch computes every row at the length of its longest, and the padding's share of the work is
pure waste (on the shipped chat rows, about a third). Padding-free batching lays a batch's rows end to end
as one row, with position ids restarting at each, so attention never crosses rows: the same rows per step,
the same loss per token, so the same loss curve and eval loss as padded batches (`tests/test_batching.py`),
in less time. Packing (`trl.packing: true`) goes further, filling every row to `max_length` with pieces of
several rows, but changes how many rows a step sees; it stays TRL's opt-in.

TRL refuses `padding_free` with a `max_length` unless packing: it would not truncate. align lets TRL
prepare the rows without a limit and cuts them to `max_length` itself, exactly as TRL's own preparation
does (from the start or the end, dropping rows left with no token to learn).
"""

from __future__ import annotations

from typing import Any

PADDED, PADDING_FREE, PACKED = "padded", "padding-free", "packed"


def sft_batching(trl: dict[str, Any]) -> tuple[str, str]:
    """(how the stage batches, why), from its `trl:` block."""
    if trl.get("packing"):
        return PACKED, "trl.packing: rows packed into max_length sequences, several per row (TRL)"
    if trl.get("padding_free") is False:
        return PADDED, "trl.padding_free: false"
    return PADDING_FREE, "each batch as one row without padding: padded batches' loss, in less time"


def without_length_limit(config: Any) -> tuple[int | None, str]:
    """Switch a built SFTConfig to padding-free with no limit for TRL to refuse; the limit and the
    truncation side, which `truncated` then applies to the prepared rows."""
    limit = (config.max_length, config.truncation_mode)
    config.padding_free = True
    config.max_length = None
    return limit


def truncated(dataset: Any, max_length: int | None, mode: str) -> Any:
    """TRL's prepared rows (`input_ids`, `labels`) cut to `max_length` as its own preparation cuts them,
    without the rows that no token to learn is left in."""
    if dataset is None or max_length is None:
        return dataset
    cut = slice(None, max_length) if mode == "keep_start" else slice(-max_length, None)
    dataset = dataset.map(lambda row: {"input_ids": row["input_ids"][cut], "labels": row["labels"][cut]})
    return dataset.filter(lambda row: any(label != -100 for label in row["labels"]))
