"""Whether a chat template renders every part of a data file's conversations: each message's text (the
system turn's too), each tool call's function name and arguments, and each `tools` schema's name.

A template renders what it reads and drops the rest without a word: a SmolLM2-style ChatML reads `content`
only, so an assistant turn that calls a tool comes out as `<|im_start|>assistant\\n<|im_end|>` and the
`tools` schemas nowhere, and TRL trains on those holes. So before anything loads, rows are rendered the way
TRL's trainers render them (transformers' own Jinja renderer, the row's `tools` passed along; no tokenizer
loads) and each part is looked for in the text, stripped (templates such as Llama 3's trim content). Each
part found uses up that stretch of the text, so a name in the `tools` list does not also count as the call.

Rendered are a seeded sample of the rows (the same every time) and the first row of each structure the file
holds (its columns, and the roles and keys of its turns), so that a file whose few tool rows a sample could
miss is still judged on one. Rows are read as the scan reads them (align.data.rows) and converted by the
same `Normalizer`; the verdict is cached by the file's identity, the renames and the template.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from align.cache import cached_json
from align.data.corpora import BUILTIN_PREFIX
from align.data.loading import HUB_PREFIX, locate
from align.data.rows import row_source
from align.data.scan import identity, progress_bar
from align.data.shapes import Normalizer, RowProblem
from align.errors import DataError
from align.fingerprint import digest

SAMPLE_ROWS = 32
SEED = 0
COVERAGE_FORMAT = 1  # bump when the rules change: cached verdicts are then checked again
SHOWN_ROWS = 3
SHOWN_FIELDS = 4
Turns = list[tuple[str, dict[str, Any]]]
"""A conversation as TRL renders it, each message with the field it came from (`messages[2]`)."""


@dataclass(frozen=True)
class Dropped:
    """What a template left out of a file's rows, in words, and whether tool calls or schemas are part of
    it (then a template that renders them is the way out)."""

    message: str
    tools: bool


def template_coverage(
    ref: str,
    columns: dict[str, str] | None,
    template: str,
    source: str,
    variables: dict[str, str] | None = None,
) -> Dropped | None:
    """What the chat `template` leaves out of the rows of `ref`, renamed by `columns`; None when it renders
    every part. `source` names the template in the message ("the chat template chatml (builtin)");
    `variables` are what a tokenizer passes its template (`bos_token`...). Builtin and hub data are not read
    here, and what the scan refuses in a file is the scan's to report."""
    if ref.startswith((BUILTIN_PREFIX, HUB_PREFIX)):
        return None
    try:
        path = locate(ref)
        files = identity(path)
    except (DataError, OSError):
        return None
    renames, extra = columns or {}, variables or {}
    key = digest([ref, files, renames, template, source, extra, COVERAGE_FORMAT])

    def judged() -> dict[str, Any] | None:
        found = judge(path, ref, renames, template, source, extra)
        return found.__dict__ if found else None

    cached = cached_json("template-checks", key, judged)
    return Dropped(**cached) if cached else None


def judge(
    path: Path, ref: str, columns: dict[str, str], template: str, source: str, variables: dict[str, str]
) -> Dropped | None:
    unit, rows = sampled(path)
    normalize, holes, broken, tools, checked = Normalizer(columns), [], [], False, 0
    for place, raw in rows:
        try:
            row = normalize(raw)
        except RowProblem:
            continue  # the scan reports it
        checked += bool(conversations(row))
        missing, failure = row_verdict(row, template, variables)
        if failure is not None:
            broken.append(f"{unit} {place} {failure}")
            tools = tools or any(
                uses_tools(turns, schemas(row.get("tools"))) for turns, _ in conversations(row)
            )
        elif missing:
            holes.append((place, missing))
            tools = tools or any(
                ".tool_calls[" in field or field.startswith("tools[") for field, _ in missing
            )
    if not holes and not broken:
        return None
    return Dropped(wording(ref, unit, source, holes, broken, checked), tools)


def row_verdict(
    row: dict[str, Any], template: str, variables: dict[str, str]
) -> tuple[list[tuple[str, str]], str | None]:
    """The parts of a row its conversations lose in the template (each field once: prompt + chosen and
    prompt + rejected share the prompt), and why the template cannot render one of them (None if it can)."""
    tools, missing = schemas(row.get("tools")), {}
    for turns, prompt_only in conversations(row):
        try:
            text = render(turns, tools, template, prompt_only, variables)
        except Exception as error:  # noqa: BLE001 - a template is the user's code: any failure is its verdict
            return [], failing_turn(turns, tools, template, variables, error)
        missing.update(left_out(text, expected(turns, tools)))
    return list(missing.items()), None


def sampled(path: Path) -> tuple[str, list[tuple[str, dict[str, Any]]]]:
    """How the file counts places, and its rows to render, in file order: a seeded sample of SAMPLE_ROWS
    (reservoir sampling, one pass) and the first row of each structure (up to SAMPLE_ROWS of them)."""
    rng, reservoir, firsts, seen, count = random.Random(SEED), [], {}, set(), 0
    with progress_bar(path) as bar:
        unit, _columns, rows = row_source(path, bar)
        for place, row, error in rows:
            if error is not None or not isinstance(row, dict):
                continue
            if len(firsts) < SAMPLE_ROWS and (shape := structure(row)) not in seen:
                seen.add(shape)
                firsts[count] = (place, row)
            if count < SAMPLE_ROWS:
                reservoir.append((count, place, row))
            elif (slot := rng.randrange(count + 1)) < SAMPLE_ROWS:
                reservoir[slot] = (count, place, row)
            count += 1
    chosen = {**firsts, **{index: (place, row) for index, place, row in reservoir}}
    return unit, [chosen[index] for index in sorted(chosen)]


def structure(row: dict[str, Any]) -> frozenset[Any]:
    """A row's columns and, in its lists of turns, each role with the keys its turns carry: a row with a new
    one reaches parts of a template that the others do not."""
    parts: set[Any] = set(row)
    for value in row.values():
        for turn in value if isinstance(value, list) else ():
            if isinstance(turn, dict):
                role = str(turn.get("role", turn.get("from")))
                parts.update((role, key) for key, item in turn.items() if item is not None)
    return frozenset(parts)


def conversations(row: dict[str, Any]) -> list[tuple[Turns, bool]]:
    """The conversations TRL renders from a row (messages; prompt + completion, chosen or rejected; or a
    prompt alone, with the generation prompt), and whether each is a prompt alone."""

    def turns(column: str) -> Turns:
        value = row.get(column)
        if not (isinstance(value, list) and value and all(isinstance(m, dict) for m in value)):
            return []
        return [(f"{column}[{index}]", message) for index, message in enumerate(value)]

    if messages := turns("messages"):
        return [(messages, False)]
    prompt = turns("prompt")
    replies = [found for column in ("completion", "chosen", "rejected") if (found := turns(column))]
    if replies:
        return [(prompt + reply, False) for reply in replies]
    return [(prompt, True)] if prompt else []


def schemas(tools: Any) -> list[dict[str, Any]] | None:
    """A row's `tools` as TRL passes them on (a JSON string is parsed, as TRL's trainers do); None when
    there are none, or they are not a list of schemas (the scan reports that)."""
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except ValueError:
            return None
    if isinstance(tools, list) and tools and all(isinstance(tool, dict) for tool in tools):
        return tools
    return None


def render(
    turns: Turns,
    tools: list[dict[str, Any]] | None,
    template: str,
    prompt_only: bool,
    variables: dict[str, str],
) -> str:
    """The text transformers' `apply_chat_template` renders: keys holding None dropped from each message
    first, as it does (an OpenAI row's `content: null` beside its `tool_calls`)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{key: value for key, value in message.items() if value is not None} for _, message in turns]
    rendered, _ = render_jinja_template(
        [messages], tools=tools, chat_template=template, add_generation_prompt=prompt_only, **variables
    )
    return rendered[0]


def failing_turn(
    turns: Turns,
    tools: list[dict[str, Any]] | None,
    template: str,
    variables: dict[str, str],
    error: Exception,
) -> str:
    """Why a row does not render, naming the first turn the template fails on (rendering ever longer
    beginnings of the conversation)."""
    reason = shorten(f"{type(error).__name__}: {error}", 160)
    for end in range(1, len(turns) + 1):
        try:
            render(turns[:end], tools, template, False, variables)
        except Exception:  # noqa: BLE001 - the same failure, now with its turn
            return f"cannot be rendered from {turns[end - 1][0]} on ({reason})"
    return f"cannot be rendered ({reason})"


def uses_tools(turns: Turns, tools: list[dict[str, Any]] | None) -> bool:
    return bool(tools) or any(m.get("tool_calls") or m.get("role") == "tool" for _, m in turns)


def expected(turns: Turns, tools: list[dict[str, Any]] | None) -> list[tuple[str, list[str]]]:
    """Each part of a conversation that must be in its rendering, as (field, the texts that show it): the
    schema names first (a template writes them ahead of the turns), then every turn's text and calls."""
    parts = []
    for index, tool in enumerate(tools or []):
        function, field = (
            (tool["function"], "function.name") if isinstance(tool.get("function"), dict) else (tool, "name")
        )
        parts.append((f"tools[{index}].{field}", [str(function.get("name", ""))]))
    for field, message in turns:
        content = message.get("content")
        if isinstance(content, str):
            parts.append((f"{field}.content", [content]))
        for index, part in enumerate(content if isinstance(content, list) else []):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append((f"{field}.content[{index}].text", [part["text"]]))
        for index, call in enumerate(message.get("tool_calls") or []):
            nested = isinstance(call, dict) and isinstance(call.get("function"), dict)
            function, where = (
                (call["function"], f"{field}.tool_calls[{index}].function")
                if nested
                else (call, f"{field}.tool_calls[{index}]")
            )
            if not isinstance(function, dict):
                continue
            parts.append((f"{where}.name", [str(function.get("name", ""))]))
            arguments = function.get("arguments")
            parts.append(
                (f"{where}.arguments", [arguments] if isinstance(arguments, str) else leaves(arguments))
            )
    return [(field, [text.strip() for text in texts if text.strip()]) for field, texts in parts]


def leaves(value: Any) -> list[str]:
    """The keys and scalar values of a dict of arguments: a template writes it as JSON with its own
    spacing, so the parts are looked for, not one spelling of the whole."""
    if isinstance(value, dict):
        return [text for key, item in value.items() for text in (str(key), *leaves(item))]
    if isinstance(value, list):
        return [text for item in value for text in leaves(item)]
    return [] if value is None else [value if isinstance(value, str) else json.dumps(value)]


def left_out(text: str, parts: list[tuple[str, list[str]]]) -> list[tuple[str, str]]:
    """The parts not in `text`, as (field, what was looked for); each part found uses its stretch up."""
    missing = []
    for field, texts in parts:
        for wanted in texts:
            at = text.find(wanted)
            if at < 0:
                missing.append((field, wanted))
                break
            text = text[:at] + "\0" + text[at + len(wanted) :]
    return missing


def wording(
    ref: str,
    unit: str,
    source: str,
    holes: list[tuple[str, list[tuple[str, str]]]],
    broken: list[str],
    checked: int,
) -> str:
    """One message: the rows (their first few) and the fields the template leaves out, then the rows it
    cannot render."""
    parts = []
    for place, missing in holes[:SHOWN_ROWS]:
        fields = [f"{field} ({shorten(wanted)!r})" for field, wanted in missing[:SHOWN_FIELDS]]
        more = f" and {len(missing) - SHOWN_FIELDS} more" if len(missing) > SHOWN_FIELDS else ""
        parts.append(f"{unit} {place} loses {', '.join(fields)}{more}")
    parts += broken[:SHOWN_ROWS]
    hidden = max(len(holes) - SHOWN_ROWS, 0) + max(len(broken) - SHOWN_ROWS, 0)
    counts = [f"{len(holes)} leave parts out"] * bool(holes) + [f"{len(broken)} do not render"] * bool(broken)
    return (
        f"{ref}: of {checked} rows rendered by {source} as training renders them, "
        f"{' and '.join(counts)}: {'; '.join(parts)}" + (f"; and {hidden} more" if hidden else "")
    )


def shorten(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
