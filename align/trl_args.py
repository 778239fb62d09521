"""The `trl:` pass-through block: checked against TRL's own config class, then built into it.

align owns a few arguments (where outputs go, precision, seed, the distributed backend); the rest
go to TRL untouched so that TRL's own checks run too, and their errors come back with a YAML path.
"""

from __future__ import annotations

import dataclasses
import tempfile
import typing
import warnings
from functools import cache
from typing import Any

from pydantic import TypeAdapter, ValidationError

from align.errors import Problem
from align.validation import suggestion

CONFIG_CLASSES = {
    "sft": "SFTConfig",
    "dpo": "DPOConfig",
    "reward": "RewardConfig",
    "grpo": "GRPOConfig",
    "rloo": "RLOOConfig",
    "ppo": "PPOConfig",  # align's own (align.trainers.ppo_config): TRL has no PPO any more
}
OWNED_BY_ALIGN = {
    "output_dir": "outputs go to <output_root>/<pipeline>/<stage>; set defaults.output_root",
    "seed": "set defaults.seed",
    "bf16": "set the stage's or the defaults' `precision` (auto, fp32, bf16, fp16)",
    "fp16": "set the stage's or the defaults' `precision` (auto, fp32, bf16, fp16)",
    "use_cpu": "align picks the device from the hardware",
    "deepspeed": "set `backend: zero2` and the stage's `zero2:` block (its `config:` names your own JSON)",
    "fsdp": "set `backend: fsdp` and the stage's `fsdp:` block",
    "fsdp_config": "set `backend: fsdp` and the stage's `fsdp:` block",
    "local_rank": "Ray sets the ranks",
}


def config_class(kind: str) -> type:
    """TRL's config dataclass for a stage kind (imported lazily: TRL takes seconds to import)."""
    if kind == "ppo":
        from align.trainers.ppo_config import PPOConfig

        return PPOConfig
    import trl

    return getattr(trl, CONFIG_CLASSES[kind])


@cache
def field_types(cls: type) -> dict[str, Any]:
    """Each init field's resolved type annotation."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


@cache
def type_adapter(annotation: Any) -> TypeAdapter | None:
    """A pydantic adapter for a field's type, or None for types pydantic cannot express (TRL checks those)."""
    try:
        return TypeAdapter(annotation)
    except Exception:  # noqa: BLE001 - pydantic raises several error types for exotic annotations
        return None


def check_value(annotation: Any, value: Any) -> tuple[Any, str | None]:
    """The value converted to the field's type (YAML reads `5e-3` as a string), or why it cannot be."""
    adapter = type_adapter(annotation)
    if adapter is None:
        return value, None
    try:
        return adapter.validate_python(value, strict=False), None
    except ValidationError as err:
        message = err.errors()[0]["msg"]
        return value, f"{message[0].lower()}{message[1:]} (got {value!r})"


def coerce(kind: str, block: dict[str, Any]) -> dict[str, Any]:
    """The `trl:` block with each value converted to its TRL field's type."""
    fields = field_types(config_class(kind))
    return {key: check_value(fields.get(key, Any), value)[0] for key, value in block.items()}


def trl_setting(kind: str, block: dict[str, Any], key: str) -> Any:
    """A setting as the stage's config will hold it: the `trl:` block's value, else the class default."""
    if key in block:
        return coerce(kind, {key: block[key]})[key]
    return next(f.default for f in dataclasses.fields(config_class(kind)) if f.name == key)


def trl_problems(kind: str, block: dict[str, Any], path: str) -> list[Problem]:
    """Every problem with a `trl:` block: unknown keys, keys align owns, wrong types, TRL's own checks."""
    if kind not in CONFIG_CLASSES:
        return [Problem(path, f"a {kind} stage takes no trl: block")] if block else []
    cls = config_class(kind)
    fields = field_types(cls)
    problems = []
    for key, value in block.items():
        where = f"{path}.{key}"
        if key in OWNED_BY_ALIGN:
            problems.append(Problem(where, f"align sets this; {OWNED_BY_ALIGN[key]}"))
        elif key not in fields:
            hint = suggestion(key, sorted(fields))
            problems.append(
                Problem(
                    where,
                    f"unknown {cls.__name__} field '{key}'; {hint}"
                    f"see {cls.__module__.split('.')[0]}'s {cls.__name__} for the fields it takes",
                )
            )
        elif (message := check_value(fields[key], value)[1]) is not None:
            problems.append(Problem(where, message))
    if problems:
        return problems
    try:
        with warnings.catch_warnings():  # deprecation notices belong to training time, not to validate
            warnings.simplefilter("ignore")
            build_config(kind, block, output_dir=tempfile.gettempdir(), precision="fp32", seed=0)
    except Exception as err:  # noqa: BLE001 - TRL raises ValueError/TypeError/etc. from __post_init__
        return [Problem(path, f"{cls.__name__} rejected it: {err}")]
    return []


def build_config(
    kind: str, block: dict[str, Any], *, output_dir: str, precision: str, seed: int, **align_args: Any
) -> Any:
    """TRL's config for a stage: the user's block plus what align owns (precision, outputs, backend)."""
    import torch

    return config_class(kind)(
        **coerce(kind, block),
        output_dir=output_dir,
        seed=seed,
        bf16=precision == "bf16",
        fp16=precision == "fp16",
        use_cpu=not torch.cuda.is_available(),
        **align_args,
    )
