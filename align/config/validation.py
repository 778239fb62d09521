"""Turn pydantic's validation errors into problems a person can act on: path, value, what is allowed."""

from __future__ import annotations

import copy
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


TRL_SETTINGS = {
    "lr": "learning_rate",
    "learning_rate": "learning_rate",
    "epochs": "num_train_epochs",
    "num_epochs": "num_train_epochs",
    "num_train_epochs": "num_train_epochs",
    "batch_size": "per_device_train_batch_size",
    "per_device_train_batch_size": "per_device_train_batch_size",
    "grad_accum": "gradient_accumulation_steps",
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "steps": "max_steps",
    "max_steps": "max_steps",
    "max_seq_length": "max_length",
    "max_length": "max_length",
    "beta": "beta",
    "warmup_ratio": "warmup_ratio",
    "warmup_steps": "warmup_steps",
    "weight_decay": "weight_decay",
    "num_generations": "num_generations",
    "gradient_checkpointing": "gradient_checkpointing",
}
"""Keys written on a stage that belong in its `trl:` block, and the TRL field each means: a near-miss
suggestion would send `lr` to `lora`."""


def misplaced_message(key: str, owner: type[BaseModel] | None) -> str | None:
    """Where a TRL setting written beside `trl:` goes, for a block that has a `trl:` block."""
    if owner is None or "trl" not in owner.model_fields or key not in TRL_SETTINGS:
        return None
    return f"unknown key '{key}'; TRL settings go in the stage's trl: block, as trl.{TRL_SETTINGS[key]}"


def pydantic_problems(err: ValidationError, *, prefix: str, model: type[BaseModel]) -> list[Problem]:
    """One problem per pydantic error, with the YAML path, the bad value, and the rule it broke."""
    problems = []
    for item in err.errors():
        loc = tuple(item["loc"])
        path = dotted(prefix, loc)
        if item["type"] == "extra_forbidden":
            owner = model_at(model, loc[:-1])
            allowed = [k for k in owner.model_fields if k != "kind"] if owner else []
            message = misplaced_message(str(loc[-1]), owner) or unknown_key_message(str(loc[-1]), allowed)
            problems.append(Problem(path, message))
        elif item["type"] == "missing":
            problems.append(Problem(path, "required key is missing"))
        else:
            value = item.get("input")
            shown = f" (got {value!r})" if not isinstance(value, dict | list) else ""
            problems.append(Problem(path, f"{item['msg'][0].lower()}{item['msg'][1:]}{shown}"))
    return problems


def lenient(model: type[BaseModel], raw: Any, err: ValidationError) -> BaseModel | None:
    """`raw` validated again less the keys `err` found unknown, when those are all it found: unknown keys
    mean nothing, so the rest of such a block can still be checked against the rest of the file. None when
    a known key has a problem (a check across keys would then read a value the file does not mean)."""
    if not isinstance(raw, dict) or any(item["type"] != "extra_forbidden" for item in err.errors()):
        return None
    pruned = copy.deepcopy(raw)
    for item in err.errors():
        *parents, leaf = item["loc"]
        node: Any = pruned
        for part in parents:
            node = node[part]
        node.pop(leaf, None)
    try:
        return model.model_validate(pruned)
    except ValidationError:
        return None
