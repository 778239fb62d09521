"""The dataset shapes people bring, turned into TRL's formats one row at a time: `data.columns` renames,
then ShareGPT, Alpaca and ultrafeedback-style preference rows are converted.

One `Normalizer` serves both the validate-time scan (align/data/scan.py, row by row, with each row's
place) and the training-time load (align/data/loading.py, through `Dataset.map`), so what is checked is
what trains. A file's shape is taken from its first row, as TRL takes its format; a later row that does
not fit that shape is refused with its place. Columns a conversion does not read are kept as they are
(TRL's trainers drop the columns they do not use; reward functions may read them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
    "tool": "tool",
    "observation": "tool",
}
"""ShareGPT's `from` values (Vicuna's human/gpt, LLaMA-Factory's observation) and the chat roles they are."""


class RowProblem(ValueError):
    """What one row gets wrong, worded for one row and for several, with its fix (an `Issue` in the scan);
    `detail` is the row's own part of it, shown beside its place."""

    def __init__(self, one: str, many: str, fix: str, detail: str | None = None) -> None:
        super().__init__(f"{one}{f' ({detail})' if detail else ''}; {fix}")
        self.one, self.many, self.fix, self.detail = one, many, fix, detail


@dataclass(frozen=True)
class Shape:
    """One known shape: its name, what it becomes, what it was read from, and the row conversion."""

    name: str
    into: str
    source: str
    convert: Callable[[dict[str, Any]], dict[str, Any]]

    def describe(self) -> str:
        return f"{self.name} -> {self.into} ({self.source})"


def is_turn_list(value: Any, key: str) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, dict) and key in t for t in value)


def sharegpt(row: dict[str, Any]) -> dict[str, Any]:
    """ShareGPT rows (`conversations`, or `messages`, of {from, value} turns, an optional `system`) as
    TRL's conversational `messages`: TRL's `maybe_convert_to_chatml` renames the keys, and the roles are
    mapped to chat roles (human -> user, gpt -> assistant), which chat templates expect."""
    from trl.data_utils import maybe_convert_to_chatml

    key = "conversations" if "conversations" in row else "messages"
    turns = row.get(key)
    if not is_turn_list(turns, "from"):
        raise RowProblem(
            f"has no {key!r} list of {{from, value}} turns",
            f"have no {key!r} list of {{from, value}} turns",
            "a ShareGPT file holds, in every row, a list of turns as {from: human|gpt|system, value: text}",
        )
    chatml = maybe_convert_to_chatml({key: [dict(turn) for turn in turns]})
    system = row.get("system")
    messages = [{"role": "system", "content": system}] if isinstance(system, str) and system.strip() else []
    for turn in chatml["messages"]:
        role, content = ROLES.get(str(turn.get("role")).lower()), turn.get("content")
        if role is None:
            raise RowProblem(
                f"has a {key!r} turn from an unknown speaker",
                f"have a {key!r} turn from an unknown speaker",
                f"a turn's `from` is one of: {', '.join(ROLES)}",
                detail=f"from: {turn.get('role')!r}",
            )
        if not isinstance(content, str) or not content.strip():
            raise RowProblem(
                f"has a {key!r} turn with no text in `value`",
                f"have a {key!r} turn with no text in `value`",
                "fill in or drop the empty turns",
            )
        messages.append({"role": role, "content": content})
    rest = {column: value for column, value in row.items() if column not in (key, "system")}
    return {**rest, "messages": messages}


def alpaca(row: dict[str, Any]) -> dict[str, Any]:
    """Alpaca rows (`instruction`, optional `input`, `output`; LLaMA-Factory's optional `system` and
    `history` of [instruction, output] pairs) as TRL's conversational prompt/completion: the user turn is
    the instruction, then a blank line and the input. Prompt/completion rather than `messages`, because TRL's
    SFT then computes the loss on the completion only by default (`completion_only_loss`), as Alpaca was
    trained, and needs no `{% generation %}` markers in the chat template (as `assistant_only_loss`
    would). A `text` column (tatsu-lab/alpaca's pre-formatted copy of the row) is dropped: a row holds one
    of TRL's formats."""
    instruction, extra, output = row.get("instruction"), row.get("input"), row.get("output")
    for column, value in (("instruction", instruction), ("output", output)):
        if not isinstance(value, str) or not value.strip():
            raise RowProblem(
                f"has no text in {column!r}",
                f"have no text in {column!r}",
                "an Alpaca row holds text in `instruction` and `output` (and optionally `input`)",
            )
    if extra is not None and not isinstance(extra, str):
        raise RowProblem("has an 'input' that is not text", "have an 'input' that is not text", "give text")
    prompt = [{"role": "system", "content": row["system"]}] if str(row.get("system") or "").strip() else []
    for pair in row.get("history") or []:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(text, str) for text in pair)):
            raise RowProblem(
                "has a 'history' entry that is not an [instruction, output] pair",
                "have a 'history' entry that is not an [instruction, output] pair",
                "history lists earlier turns as [instruction, output] pairs of text",
            )
        prompt += [{"role": "user", "content": pair[0]}, {"role": "assistant", "content": pair[1]}]
    user = f"{instruction}\n\n{extra}" if extra and extra.strip() else instruction
    prompt.append({"role": "user", "content": user})
    dropped = ("instruction", "input", "output", "system", "history", "text")
    rest = {column: value for column, value in row.items() if column not in dropped}
    return {**rest, "prompt": prompt, "completion": [{"role": "assistant", "content": output}]}


SHARED = (
    "'chosen' and 'rejected' each repeat the prompt's turns (the last one the user's `prompt`), then "
    "differ in the assistant's reply"
)


def preference_conversations(row: dict[str, Any]) -> dict[str, Any]:
    """A `prompt` string with `chosen`/`rejected` as full conversations that repeat it (the
    ultrafeedback_binarized shape) as explicit conversational prompt/chosen/rejected: the prompt is the
    turns both share (split by TRL's `extract_prompt`), checked to end with the user's `prompt`; chosen and
    rejected are the assistant turns after them. Without this TRL would read the row as text or as
    conversations depending on which column it looks at first."""
    from trl.data_utils import extract_prompt

    prompt, chosen, rejected = row.get("prompt"), row.get("chosen"), row.get("rejected")
    if not (isinstance(prompt, str) and is_turn_list(chosen, "role") and is_turn_list(rejected, "role")):
        raise RowProblem(
            "is not a 'prompt' text with 'chosen' and 'rejected' conversations",
            "are not a 'prompt' text with 'chosen' and 'rejected' conversations",
            "every row of this file has the first row's shape",
        )
    if not all(turns[-1].get("role") == "assistant" for turns in (chosen, rejected)):
        raise RowProblem(
            "has a 'chosen' or 'rejected' that does not end with an assistant reply",
            "have a 'chosen' or 'rejected' that does not end with an assistant reply",
            SHARED,
        )
    split = extract_prompt({"chosen": chosen, "rejected": rejected})
    shared, chosen_reply, rejected_reply = split["prompt"], split["chosen"], split["rejected"]
    if not shared or shared[-1].get("role") != "user":
        raise RowProblem(
            "has 'chosen' and 'rejected' that do not start with the same user turn",
            "have 'chosen' and 'rejected' that do not start with the same user turn",
            SHARED,
        )
    if str(shared[-1].get("content")).strip() != prompt.strip():
        raise RowProblem(
            "has a 'prompt' that is not the user turn 'chosen' and 'rejected' share",
            "have a 'prompt' that is not the user turn 'chosen' and 'rejected' share",
            SHARED,
        )
    if not all(reply and reply[0].get("role") == "assistant" for reply in (chosen_reply, rejected_reply)):
        raise RowProblem(
            "has a 'chosen' or 'rejected' with no assistant reply after the shared turns",
            "have a 'chosen' or 'rejected' with no assistant reply after the shared turns",
            SHARED,
        )
    return {**row, "prompt": shared, "chosen": chosen_reply, "rejected": rejected_reply}


SHAREGPT = Shape("sharegpt", "conversational messages", "conversations: from/value", sharegpt)
SHAREGPT_MESSAGES = Shape("sharegpt", "conversational messages", "messages: from/value", sharegpt)
ALPACA = Shape("alpaca", "conversational prompt/completion", "instruction/input/output", alpaca)
PREFERENCE_CONVERSATIONS = Shape(
    "preference conversations",
    "conversational prompt/chosen/rejected",
    "prompt text, chosen/rejected repeating it",
    preference_conversations,
)


def detect(row: dict[str, Any]) -> Shape | None:
    """The known shape of a (renamed) row, or None when it is already one of TRL's formats or unknown."""
    if is_turn_list(row.get("conversations"), "from"):
        return SHAREGPT
    messages = row.get("messages")
    if is_turn_list(messages, "from") and not any("role" in turn for turn in messages):
        return SHAREGPT_MESSAGES
    if "instruction" in row and "output" in row and not {"prompt", "completion", "messages"} & set(row):
        return ALPACA
    if isinstance(row.get("prompt"), str) and is_turn_list(row.get("chosen"), "role"):
        if is_turn_list(row.get("rejected"), "role"):
            return PREFERENCE_CONVERSATIONS
    return None


def renamed(row: dict[str, Any], columns: dict[str, str]) -> dict[str, Any]:
    """The row with `data.columns` applied ({name in the file: name align reads}, all at once)."""
    if missing := [column for column in columns if column not in row]:
        names = ", ".join(map(repr, missing))
        raise RowProblem(
            f"lacks {names}, which data.columns renames",
            f"lack {names}, which data.columns renames",
            "data.columns maps a column the file has to the name align reads",
        )
    if clash := [column for column in set(columns.values()) & set(row) if column not in columns]:
        names = ", ".join(map(repr, sorted(clash)))
        raise RowProblem(
            f"already has {names}, which data.columns renames another column to",
            f"already have {names}, which data.columns renames another column to",
            "rename each column to a name the row does not have, or rename the existing one away too",
        )
    return {columns.get(column, column): value for column, value in row.items()}


class Normalizer:
    """Renames and converts rows; the first row it sees fixes the file's shape."""

    def __init__(self, columns: dict[str, str] | None = None) -> None:
        self.columns = dict(columns or {})
        self.shape: Shape | None = None
        self.decided = False

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        if self.columns:
            row = renamed(row, self.columns)
        if not self.decided:
            self.shape, self.decided = detect(row), True
        return row if self.shape is None else self.shape.convert(row)


def describe(first_row: dict[str, Any] | None, columns: dict[str, str] | None) -> str | None:
    """What is done to a file's rows before training, in words (None: nothing), from its first row."""
    parts = [f"columns {', '.join(f'{old} -> {new}' for old, new in columns.items())}"] if columns else []
    if isinstance(first_row, dict):
        try:
            row = renamed(first_row, columns) if columns else first_row
        except RowProblem:
            row = first_row
        if (shape := detect(row)) is not None:
            parts.append(shape.describe())
    return "; ".join(parts) or None


SYNONYMS = {
    "prompt": ("question", "query", "instruction", "input", "user", "human", "prompt_text", "request"),
    "completion": ("response", "answer", "output", "reply", "target", "assistant", "gpt", "completion_text"),
    "chosen": ("chosen_response", "response_chosen", "preferred", "better", "accepted", "good"),
    "rejected": ("rejected_response", "response_rejected", "dispreferred", "worse", "bad"),
    "messages": ("conversation", "dialog", "dialogue", "chat", "turns"),
    "text": ("content", "document", "body", "sentence"),
    "label": ("desirable", "is_desirable", "good_label", "kto_label"),
}
"""Column names people use for each of TRL's, as datasets on the hub name them."""


def suggest_columns(present: list[str], formats: list[tuple[str, ...]]) -> str | None:
    """A `data.columns` mapping that would give rows with `present` columns one of `formats`, in the YAML
    to add, or None when no format is that near."""
    for needed in formats:
        mapping: dict[str, str] = {}
        for column in needed:
            if column in present:
                continue
            match = next((name for name in SYNONYMS.get(column, ()) if name in present), None)
            if match is None or match in mapping:
                break
            mapping[match] = column
        else:
            if mapping:
                pairs = ", ".join(f"{old}: {new}" for old, new in mapping.items())
                return f"data: {{columns: {{{pairs}}}}}"
    return None
