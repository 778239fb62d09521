"""Which tokens of an SFT stage's rows carry loss, decided once, from its `trl:` block, its rows' format and
whether its chat template can mark assistant turns. `align plan` prints the decision, the stage's runner
sets TRL's `assistant_only_loss` from it, and `align data` marks the tokens it leaves bearing loss.

Conversations train on the assistant's turns only by default, as LLaMA-Factory and axolotl do, wherever the
template marks them (`{% generation %}`, which TRL's `assistant_only_loss` reads); `assistant_only_loss:
false` opts back to every token. Tool results and the tools schema never carry loss: the model would learn
to predict what its tools return. Rows that hold them are refused where nothing would mask them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from align.data.corpora import BUILTIN_PREFIX, builtin_path
from align.data.scan import first_row, scanned
from align.data.shapes import Normalizer, RowProblem

ASSISTANT_TURNS = "assistant turns only (system, user and tool turns and the tools schema masked)"
COMPLETION_TURNS = (
    "the completion's assistant turns only (the prompt, tool results and the tools schema masked)"
)


@dataclass(frozen=True)
class LossScope:
    """What carries loss: `assistant_only` is TRL's `assistant_only_loss`, `words` what the plan says, and
    `problem` why the stage cannot train as it stands (tool rows that would carry loss)."""

    assistant_only: bool
    words: str
    problem: str | None = None


def row_format(row: dict[str, Any] | None) -> str | None:
    """`messages`, `conversational prompt` (prompt and completion as messages), `prompt` (as text) or `text`;
    None where the first row is not known."""
    if row is None:
        return None
    if isinstance(row.get("messages"), list):
        return "messages"
    if row.get("completion") is not None:
        return "conversational prompt" if isinstance(row["completion"], list) else "prompt"
    return "text"


def sft_loss_scope(
    trl: dict[str, Any], form: str | None, markable: bool | None, tool_rows: int, template: str
) -> LossScope:
    """The decision for rows of `form` (`row_format`) under a `template` (named, for the message) that can
    mark assistant turns (`markable`; None: not known before the model is present)."""
    asked = trl.get("assistant_only_loss")
    completion_only = trl.get("completion_only_loss") is not False
    if form not in ("messages", "conversational prompt"):
        if form == "prompt" and completion_only:
            return LossScope(bool(asked), "the completion only (the prompt masked)")
        return LossScope(bool(asked), "every token" + (" (text rows)" if form == "text" else ""))
    if asked is None and markable is None:
        return LossScope(True, f"{ASSISTANT_TURNS}, once the model's chat template shows it marks them")
    if asked or (asked is None and markable):
        return LossScope(True, ASSISTANT_TURNS if form == "messages" else COMPLETION_TURNS)
    why = (
        "assistant_only_loss: false"
        if asked is False
        else f"the chat template {template} has no {{% generation %}} markers to mark assistant turns"
    )
    masked_prompt = form == "conversational prompt" and completion_only
    words = f"the completion (the prompt masked; {why})" if masked_prompt else f"every token ({why})"
    if not tool_rows or masked_prompt:
        return LossScope(False, words)
    fix = (
        "drop assistant_only_loss: false"
        if asked is False
        else "set `chat_template: chatml-tools` (or give the template {% generation %} markers)"
    )
    problem = (
        f"{tool_rows:,} rows hold tool results or a tools schema, which would carry loss ({why}): the model "
        f"would learn to predict what its tools return; {fix}, or drop those rows"
    )
    return LossScope(False, words, problem)


def first_training_row(data: Any) -> dict[str, Any] | None:
    """The first row of the stage's first source as it trains (renamed, its shape converted)."""
    source = data.sources[0]  # the sources of a mixture share one format
    path = source.path
    row = first_row(str(builtin_path(path)) if path.startswith(BUILTIN_PREFIX) else path)
    try:
        return Normalizer(source.columns)(row) if row is not None else None
    except RowProblem:
        return None


def tool_rows(data: Any, kind: str) -> int:
    """The rows of the stage's sources that hold a tool turn or a tools schema, as their scans counted them
    (a hub dataset's are not counted before it loads)."""
    counts = [scanned(source.path, kind, source.columns, "tool_rows") for source in data.sources]
    return sum(count or 0 for count in counts)
