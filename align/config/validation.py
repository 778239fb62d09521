"""Turn pydantic's validation errors into problems a person can act on: path, value, what is allowed."""

from __future__ import annotations

import difflib
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from align.errors import Problem


def dotted(prefix: str, loc: tuple[Any, ...]) -> str:
    """`("lora", "r")` under `stages.sft` -> `stages.sft.lora.r`; list indexes become `[0]`."""
    path = prefix
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else (f".{part}" if path else str(part))
    return path


def model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the field at `loc`, for listing the keys it allows."""
    current: Any = model
    for part in loc:
        if (
            not (isinstance(current, type) and issubclass(current, BaseModel))
            or part not in current.model_fields
        ):
            return None
        annotation = current.model_fields[part].annotation
        current = next(
            (
                a
                for a in (annotation, *get_args(annotation))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            annotation,
        )
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def suggestion(key: str, allowed: list[str]) -> str:
    """`did you mean 'beta'? ` for a near miss, else nothing."""
    guess = difflib.get_close_matches(key, allowed, n=1)
    return f"did you mean '{guess[0]}'? " if guess else ""


def unknown_key_message(key: str, allowed: list[str]) -> str:
    """An unknown key, a likely intended one, and the full list."""
    return f"unknown key '{key}'; {suggestion(key, allowed)}allowed: {', '.join(allowed)}"


def pydantic_problems(err: ValidationError, *, prefix: str, model: type[BaseModel]) -> list[Problem]:
    """One problem per pydantic error, with the YAML path, the bad value, and the rule it broke."""
    problems = []
    for item in err.errors():
        loc = tuple(item["loc"])
        path = dotted(prefix, loc)
        if item["type"] == "extra_forbidden":
            owner = model_at(model, loc[:-1])
            allowed = [k for k in owner.model_fields if k != "kind"] if owner else []
            problems.append(Problem(path, unknown_key_message(str(loc[-1]), allowed)))
        elif item["type"] == "missing":
            problems.append(Problem(path, "required key is missing"))
        else:
            value = item.get("input")
            shown = f" (got {value!r})" if not isinstance(value, dict | list) else ""
            problems.append(Problem(path, f"{item['msg'][0].lower()}{item['msg'][1:]}{shown}"))
    return problems
