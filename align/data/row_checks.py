"""What a row of a stage's data must be, as TRL's trainers read it: each defect worded once (for one row and
for several, with its fix), and `Scan`, which checks the rows of one file in order and tallies what it finds.
Reading the file, and caching the verdict, is `align.data.scan`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from align.data.loading import DATA_COLUMNS, column_problem, missing_columns
from align.data.shapes import Normalizer, RowProblem

EXAMPLES = 3  # places shown for each defect
CONVERSATIONAL = ("prompt", "completion", "chosen", "rejected")  # each text, or a list of messages
ROLES = ("system", "user", "assistant", "tool")
"""The roles chat templates render; any other is rendered as a name no model was trained on, or dropped."""


@dataclass(frozen=True)
class Issue:
    """One kind of defect, worded for one row and for several, with its fix."""

    one: str
    many: str
    fix: str


NOT_JSON = Issue("is not valid JSON", "are not valid JSON", "each line must hold one JSON object")
NOT_OBJECT = Issue(
    "is not a JSON object", "are not JSON objects", "each row must be one JSON object of named columns"
)
LABEL = Issue(
    "has a 'label' that is not true or false",
    "have a 'label' that is not true or false",
    "a label says whether the completion is desirable: true or false",
)
MIXED = Issue(
    "mixes text and lists of messages",
    "mix text and lists of messages",
    "TRL reads a row as all text (standard) or all lists of {role, content} messages (conversational)",
)


def lacking(columns: list[str], kind: str) -> Issue:
    names = ", ".join(map(repr, columns))
    formats = ", ".join("+".join(needed) for needed in DATA_COLUMNS[kind])
    return Issue(f"lacks {names}", f"lack {names}", f"each row of {kind} data needs one of: {formats}")


def extra(columns: list[str], place: str) -> Issue:
    names = ", ".join(map(repr, columns))
    fix = "TRL takes one format from the first row: give every row the same columns"
    return Issue(f"has {names}, which {place} lacks", f"have {names}, which {place} lacks", fix)


def empty(column: str) -> Issue:
    return Issue(f"has an empty {column!r}", f"have an empty {column!r}", "fill in or drop the empty rows")


def not_of(column: str, wanted: str) -> Issue:
    fix = "text is a string, a conversation a list of {role, content} messages"
    return Issue(f"has a {column!r} that is not {wanted}", f"have a {column!r} that is not {wanted}", fix)


def other_shape(shape: str, first: str, place: str) -> Issue:
    fix = "one file holds one format: all text or all lists of messages"
    return Issue(
        f"holds {shape} where {place} holds {first}", f"hold {shape} where {place} holds {first}", fix
    )


def unknown_role(role: str) -> Issue:
    fix = f"a message's role is one of {', '.join(ROLES)}: rename the others"
    return Issue(f"has a message with role {role!r}", f"have messages with role {role!r}", fix)


SAME_PAIR = Issue(
    "has a 'chosen' equal to its 'rejected'",
    "have a 'chosen' equal to their 'rejected'",
    "a pair teaches the difference between two answers: fix or drop the pairs that have none",
)
"""Refused when it is most of the rows; a few are a note in `align plan` (`Scan.notes`)."""


TOOL_CALL = Issue(
    "has a tool call with no function name",
    "have a tool call with no function name",
    "a tool call is {type: function, function: {name, arguments}} or {name, arguments}",
)
TOOLS = Issue(
    "has a 'tools' that is not a list of function schemas",
    "have a 'tools' that is not a list of function schemas",
    "'tools' holds a list of schemas ({type: function, function: {name, parameters}}), or that as JSON text",
)


def is_message(value: Any) -> bool:
    """A chat message: a role and its text (or content parts); an assistant turn that calls tools may have
    no text beside its `tool_calls` (OpenAI rows carry `content: null` there)."""
    if type(value) is not dict or type(value.get("role")) is not str or value["role"] == "":
        return False
    content = value.get("content")
    return isinstance(content, (str, list)) or (content is None and isinstance(value.get("tool_calls"), list))


def is_tool_call(call: Any) -> bool:
    function = call.get("function", call) if isinstance(call, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return isinstance(name, str) and name.strip() != ""


def conversation_issue(column: str, value: Any) -> Issue | None:
    if not isinstance(value, list) or not all(is_message(message) for message in value):
        return not_of(column, "a list of {role, content} messages")
    if (role := next((m["role"] for m in value if m["role"] not in ROLES), None)) is not None:
        return unknown_role(role)
    calls = [call for message in value for call in message.get("tool_calls") or ()]
    if not all(map(is_tool_call, calls)):
        return TOOL_CALL
    return None if value else empty(column)


def tools_issue(value: Any) -> Issue | None:
    """A row's `tools` as TRL's trainers read them: a list, or a JSON string of one (parsed as it trains)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return TOOLS
    if value is None or isinstance(value, list) and all(isinstance(tool, dict) for tool in value):
        return None
    return TOOLS


def has_tools(row: dict[str, Any]) -> bool:
    """Whether a row holds a tool turn or a tools schema: what must never carry loss."""
    turns = [value for value in row.values() if isinstance(value, list)]
    return bool(row.get("tools")) or any(
        isinstance(message, dict) and message.get("role") == "tool" for turn in turns for message in turn
    )


def value_issue(column: str, value: Any) -> tuple[Issue | None, str | None]:
    """What is wrong with one value (None if nothing), and whether it is `text` or a `conversation`."""
    if column == "label":
        return (None if isinstance(value, bool) else LABEL), None
    if column == "messages":
        return conversation_issue(column, value), None
    if isinstance(value, str):
        return (None if value.strip() else empty(column)), ("text" if column in CONVERSATIONAL else None)
    if column in CONVERSATIONAL and isinstance(value, list):
        return conversation_issue(column, value), "conversation"
    wanted = "text or a list of {role, content} messages" if column in CONVERSATIONAL else "a string"
    return not_of(column, wanted), None


@dataclass
class Tally:
    """How many rows have one defect, and the first few places (with a detail, as JSON's reason)."""

    count: int = 0
    places: list[tuple[str, str | None]] = field(default_factory=list)


@dataclass
class Scan:
    """What one pass over a file found. TRL takes a file's format from its first row, so the first row
    that fits one of the data kind's formats sets the columns and shape every later row must have."""

    kind: str
    unit: str = "line"
    rows: int = 0
    tool_rows: int = 0  # rows with a tool turn or a tools schema (align/data/loss_scope.py)
    tallies: dict[Issue, Tally] = field(default_factory=dict)
    first_columns: list[str] | None = None
    columns: tuple[str, ...] | None = None
    columns_place: str = ""
    wider: list[tuple[str, ...]] = field(default_factory=list)  # formats with more columns than `columns`
    shape: str | None = None
    shape_place: str = ""
    normalize: Normalizer = field(
        default_factory=Normalizer
    )  # data.columns and known shapes (data/shapes.py)

    def add(self, issue: Issue, place: str, detail: str | None = None) -> None:
        tally = self.tallies.setdefault(issue, Tally())
        tally.count += 1
        if len(tally.places) < EXAMPLES:
            tally.places.append((place, detail))

    def check(self, place: str, row: Any, error: str | None) -> None:
        self.rows += 1
        if error is not None:
            return self.add(NOT_JSON, place, error)
        if not isinstance(row, dict):
            return self.add(NOT_OBJECT, place, f"a JSON {type(row).__name__}")
        try:
            row = self.normalize(row)
        except RowProblem as problem:
            return self.add(Issue(problem.one, problem.many, problem.fix), place, problem.detail)
        if self.columns is None and not self.take_format(place, row):
            return None
        if missing := [column for column in self.columns if row.get(column) is None]:
            return self.add(lacking(missing, self.kind), place)
        fitting = [needed for needed in self.wider if all(row.get(column) is not None for column in needed)]
        if fitting:
            columns = sorted({column for needed in fitting for column in needed} - set(self.columns))
            return self.add(extra(columns, self.columns_place), place)
        return self.check_values(place, row)

    def take_format(self, place: str, row: dict[str, Any]) -> bool:
        """Take the format of the first row that fits one; a row before it is counted as lacking."""
        if self.first_columns is None:
            self.first_columns = list(row)
        present = {column for column, value in row.items() if value is not None}
        alternatives = DATA_COLUMNS[self.kind]
        fitting = [needed for needed in alternatives if set(needed) <= present]
        if not fitting:
            self.add(lacking(missing_columns(sorted(present), self.kind), self.kind), place)
            return False
        self.columns, self.columns_place = max(fitting, key=len), f"{self.unit} {place}"
        self.wider = [needed for needed in alternatives if set(self.columns) < set(needed)]
        return True

    def check_values(self, place: str, row: dict[str, Any]) -> None:
        found = [value_issue(column, row[column]) for column in self.columns or ()]
        found.append((tools_issue(row.get("tools")), None))
        issues = [issue for issue, _ in found if issue is not None]
        if not issues and "rejected" in (self.columns or ()) and row["chosen"] == row["rejected"]:
            issues.append(SAME_PAIR)
        for issue in issues:
            self.add(issue, place)
        self.tool_rows += has_tools(row)
        shapes = {shape for _, shape in found if shape is not None}
        if issues or not shapes:
            return
        if len(shapes) > 1:
            return self.add(MIXED, place)
        shape = shapes.pop()
        if self.shape is None:
            self.shape, self.shape_place = shape, f"{self.unit} {place}"
        elif shape != self.shape:
            self.add(other_shape(shape + "s", self.shape + "s", self.shape_place), place)

    def minor(self) -> dict[Issue, Tally]:
        """The defects that do not stop a run: identical pairs, while they are at most half the rows."""
        same = self.tallies.get(SAME_PAIR)
        return {SAME_PAIR: same} if same is not None and 2 * same.count <= self.rows else {}

    def notes(self, ref: str) -> list[str]:
        """The minor defects in words, for `align plan`."""
        return [f"{ref}: {self.tally_text(issue, tally)}" for issue, tally in self.minor().items()]

    def message(self, ref: str) -> str | None:
        """One message for the file: the defects, each with its count and first places, and the fixes."""
        minor = self.minor()
        tallies = {issue: tally for issue, tally in self.tallies.items() if issue not in minor}
        head = None
        if self.columns is None and self.first_columns is not None:  # no row fits: the columns are wrong
            head = column_problem(ref, self.first_columns, self.kind)
            tallies = {issue: tally for issue, tally in tallies.items() if issue in (NOT_JSON, NOT_OBJECT)}
        if not tallies:
            return head if self.rows else f"{ref} has no rows"
        if head is None and len(tallies) == 1 and (only := next(iter(tallies.items())))[1].count == 1:
            issue, tally = only
            place, detail = tally.places[0]
            return f"{ref} {self.unit} {place} {issue.one}{f' ({detail})' if detail else ''}; {issue.fix}"
        parts = [self.tally_text(issue, tally) for issue, tally in tallies.items()]
        fixes = list(dict.fromkeys(issue.fix for issue in tallies))
        found = f"{ref}: {'; '.join(parts)}; {'; '.join(fixes)}"
        return f"{head}. {found}" if head else found

    def tally_text(self, issue: Issue, tally: Tally) -> str:
        places = ", ".join(place + (f" ({detail})" if detail else "") for place, detail in tally.places)
        more = f" and {tally.count - len(tally.places)} more" if tally.count > len(tally.places) else ""
        wording, unit = (issue.one, self.unit) if tally.count == 1 else (issue.many, f"{self.unit}s")
        return f"{tally.count} of {self.rows} rows {wording}: {unit} {places}{more}"
