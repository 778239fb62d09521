"""Rewards for the RL stages: the shipped verifiable functions, and the guard that makes a failing function
fail its stage with its name (the YAML shape of one reward is align/config/reward.py's `RewardSpec`).

TRL calls a reward function with `prompts`, `completions` (strings, or lists of messages for
conversational prompts), `completion_ids`, every extra dataset column, and some trainer state, all as
keyword arguments; it returns one float (or None) per completion. Shipped functions take their own
settings as keyword-only arguments, which a reward's `args:` sets. Nothing here imports torch, so
`align validate` stays quick.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import re
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from align.errors import AlignError


class RewardError(AlignError):
    """A reward function that cannot be loaded, or that failed or misbehaved on a batch."""


def completion_text(completion: Any) -> str:
    """The text of a completion: TRL passes a string, or for conversational prompts a list of messages."""
    return completion[-1]["content"] if isinstance(completion, list) else str(completion)


def normalize(text: str) -> str:
    """Case, spacing, quotes and end punctuation aside: `The cat.` and `the  cat` are the same answer."""
    return " ".join(text.lower().split()).strip(" .!?\"'")


def exact_answer(completions: list[Any], answer: list[Any] | None = None, **_: Any) -> list[float]:
    """1 when the completion is the row's `answer` (see `normalize`), else 0."""
    if answer is None:
        raise ValueError(
            "exact_answer compares completions with an `answer` column; the prompts data has none"
        )
    return [
        float(normalize(completion_text(c)) == normalize(str(a)))
        for c, a in zip(completions, answer, strict=True)
    ]


def format_match(completions: list[Any], *, pattern: str = r"[^\n]+\.", **_: Any) -> list[float]:
    """1 when the whole stripped completion matches `pattern` (default: one line ending with a period)."""
    compiled = re.compile(pattern)
    return [float(compiled.fullmatch(completion_text(c).strip()) is not None) for c in completions]


def length_target(completions: list[Any], *, target: int = 20, unit: str = "words", **_: Any) -> list[float]:
    """1 at exactly `target` words (or chars), falling linearly to 0 at none or at twice the target."""
    if unit not in ("words", "chars") or target <= 0:
        raise ValueError(
            f"length needs unit 'words' or 'chars' and a target above 0 (got {unit!r}, {target})"
        )
    texts = [completion_text(c).strip() for c in completions]
    sizes = [len(text.split()) if unit == "words" else len(text) for text in texts]
    return [max(0.0, 1.0 - abs(size - target) / target) for size in sizes]


NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
MARKED = (re.compile(r"####\s*([^\n]*)"), re.compile(r"\\boxed\{([^{}]*)\}"))
"""Where a solution marks its answer: GSM8K's `#### 72`, or LaTeX's `\boxed{72}`; the last one counts."""


def final_number_of(text: str) -> Decimal | None:
    """The number a worked solution ends on: the first number after its last answer marker, else its last
    number (`1,234` and `$1234.00` are 1234); None when there is none."""
    for marker in MARKED:
        if found := marker.findall(text):
            numbers = NUMBER.findall(found[-1])[:1]
            break
    else:
        numbers = NUMBER.findall(text)[-1:]
    return Decimal(numbers[0].replace(",", "")) if numbers else None


def final_number(completions: list[Any], answer: list[Any] | None = None, **_: Any) -> list[float]:
    """1 when the completion's final number (`final_number_of`) equals the row's `answer`'s, a GSM8K
    solution (`... #### 72`) or a bare number; else 0, and 0 for a completion or answer with no number."""
    if answer is None:
        raise ValueError("final_number compares with an `answer` column; the prompts data has none")
    scores = []
    for completion, expected in zip(completions, answer, strict=True):
        found, wanted = final_number_of(completion_text(completion)), final_number_of(str(expected))
        scores.append(float(found is not None and found == wanted))
    return scores


def json_object_of(text: str) -> dict | None:
    """The first JSON object in `text`, fenced (```json ... ```) or with prose around it; None when none
    parses."""
    decoder = json.JSONDecoder()
    for start in (index for index, char in enumerate(text) if char == "{"):
        try:
            found, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(found, dict):
            return found
    return None


def json_fields(completions: list[Any], answer: list[Any] | None = None, **_: Any) -> list[float]:
    """1 when the completion's first JSON object (`json_object_of`) has exactly the fields and values of the
    row's `answer` (a JSON object), whatever surrounds it; else 0, as for an answer that holds no object.
    What a structured reply says, its format aside: `exact_answer` or `format` score the format."""
    if answer is None:
        raise ValueError("json_fields compares with an `answer` column; the prompts data has none")
    scores = []
    for completion, expected in zip(completions, answer, strict=True):
        wanted = json_object_of(str(expected))
        scores.append(float(wanted is not None and json_object_of(completion_text(completion)) == wanted))
    return scores


SHIPPED: dict[str, Callable[..., list[float]]] = {
    "exact_answer": exact_answer,
    "final_number": final_number,
    "format": format_match,
    "json_fields": json_fields,
    "length": length_target,
}


def load_function(path: str) -> Callable[..., Any]:
    """A user's reward function by dotted path (`mypkg.rewards.score`), importable from the directory
    `align` runs in (as in the workers); importing it runs their code."""
    module_name, _, attribute = path.rpartition(".")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as err:
        raise RewardError(f"cannot load the reward function '{path}': {err}") from None
    if not callable(function):
        raise RewardError(f"'{path}' is a {type(function).__name__}, not a function")
    return function


def function_problem(name: str, allow_custom_code: bool) -> str | None:
    """Why a reward's `function` cannot be used, or None; a dotted path is imported only when opted in."""
    if name in SHIPPED:
        return None
    if "." not in name:
        return (
            f"'{name}' is not a shipped reward function ({', '.join(SHIPPED)}); name a function of your own "
            "by its dotted path, as mypkg.rewards.score"
        )
    if not allow_custom_code:
        return (
            f"'{name}' is a function of your own, and running it runs your code: set "
            "`allow_custom_code: true` at the top of the pipeline file to allow it"
        )
    try:
        load_function(name)
    except RewardError as err:
        return str(err)
    return None


def args_problem(name: str, args: dict[str, Any]) -> str | None:
    """Why `args` do not fit a shipped function, found by running it on one probe completion."""
    function = SHIPPED.get(name)
    if function is None:
        return None  # a user's function takes what it takes
    parameters = inspect.signature(function).parameters.values()
    allowed = [p.name for p in parameters if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(set(args) - set(allowed))
    if unknown:
        return f"{name} takes no argument '{unknown[0]}'; it takes: {', '.join(allowed) or 'none'}"
    try:
        function(completions=["probe."], answer=["probe"], **args)
    except Exception as err:  # noqa: BLE001 - a bad regex, a wrong type: all are the user's to fix
        return f"{name} cannot run with these args: {err}"
    return None


def shorten(value: Any, limit: int = 120) -> str:
    text = repr(completion_text(value) if isinstance(value, list) else value)
    return text if len(text) <= limit else f"{text[:limit]}..."


class GuardedReward:
    """A reward function that, when it raises or returns the wrong thing, fails the stage with a message
    naming it, its YAML path, the batch size and the first prompt, instead of a bare traceback."""

    def __init__(self, name: str, function: Callable[..., Any], args: dict[str, Any], where: str) -> None:
        self.__name__ = name.rsplit(".", 1)[-1]  # TRL logs each reward under its function's name
        self.name, self.function, self.args, self.where = name, function, args, where

    def __call__(self, prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float | None]:
        try:
            values = list(self.function(prompts=prompts, completions=completions, **kwargs, **self.args))
            rewards = [None if value is None else float(value) for value in values]
        except Exception as err:  # noqa: BLE001 - whatever it raised, the user needs to know which function
            raise RewardError(self.failure(prompts, f"raised {type(err).__name__}: {err}")) from err
        if len(rewards) != len(completions):
            raise RewardError(self.failure(prompts, f"returned {len(rewards)} rewards"))
        return rewards

    def failure(self, prompts: list[Any], what: str) -> str:
        first = shorten(prompts[0]) if prompts else "none"
        return (
            f"{self.where}: reward function '{self.name}' {what} on a batch of {len(prompts)} completions "
            f"(it must return one number or None per completion); first prompt: {first}"
        )


def guarded_function(name: str, args: dict[str, Any], where: str) -> GuardedReward:
    """The callable TRL gets for a reward's `function`: shipped by short name, else imported by path."""
    function = SHIPPED[name] if name in SHIPPED else load_function(name)
    return GuardedReward(name, function, args, where)
