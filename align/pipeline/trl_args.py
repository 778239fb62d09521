"""The `trl:` pass-through block: checked against TRL's own config class, then built into it.

align owns a few arguments (where outputs go, precision, seed, the distributed backend); the rest
go to TRL untouched so that TRL's own checks run too, and their errors come back with a YAML path.

TRL's config classes import torch and transformers' TrainingArguments, about 11 s on 2 cores, so
`align validate` and `align plan` do not import them when they have checked the same block before:
each checked (kind, block) is cached with its verdict and the settings the plan reads, keyed by the
versions of TRL and transformers (`checked`).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import tempfile
import typing
import warnings
from functools import cache
from typing import Any

from align.cache import cached_json
from align.config.spec import KINDS
from align.config.strict import takes_a_number
from align.config.validation import suggestion
from align.errors import Problem
from align.fingerprint import digest
from align.models.precision import compute_dtype

PLAN_SETTINGS = (
    "beta",
    "max_completion_length",
    "max_length",
    "per_device_train_batch_size",
    "gradient_checkpointing",
    "precompute_ref_log_probs",
)
"""The config values the plan reads (memory, placement): cached with each check's verdict."""
CHECK_FORMAT = 3  # bump when what a cached check holds changes
FLOORS: dict[str, tuple[float, str]] = {
    "per_device_train_batch_size": (1, "each device needs at least one row a step"),
    "per_device_eval_batch_size": (1, "each device needs at least one row a step"),
    "gradient_accumulation_steps": (1, "a step adds up at least one batch"),
    "num_generations": (
        2,
        "each completion is scored against the others of its prompt's group, so a group needs at least 2",
    ),
    "max_length": (
        8,
        "a chat template's own tokens around one turn take about that many, so no row would keep an answer",
    ),
    "max_prompt_length": (1, "a prompt needs at least one token"),
    "max_completion_length": (1, "a completion needs at least one token"),
}
"""The least value of a `trl:` setting that can train, and why; TRL itself accepts less (0 generations ends
in a division by zero in the worker, 0 accumulation steps trains nothing)."""
MAX_STEPS = 10**9
"""More steps than any run takes: 10^9 steps at 10 a second is over three years."""
WARN_ABOVE: dict[str, tuple[float, str]] = {
    "learning_rate": (1, "training almost surely diverges; fine-tuning uses about 1e-6 to 1e-4"),
}
"""Values legal but almost surely a mistake: validate says so in a warning line and goes on."""
OWNED_BY_ALIGN = {
    "output_dir": "outputs go to <output_root>/<pipeline>/<stage>; set defaults.output_root",
    "seed": "set defaults.seed",
    "bf16": "set the stage's or the defaults' `precision` (auto, fp32, bf16, bf16-pure, fp16)",
    "fp16": "set the stage's or the defaults' `precision` (auto, fp32, bf16, bf16-pure, fp16)",
    "use_cpu": "align picks the device from the hardware",
    "deepspeed": "set `backend: zero2` and the stage's `zero2:` block (its `config:` names your own JSON)",
    "fsdp": "set `backend: fsdp` and the stage's `fsdp:` block",
    "fsdp_config": "set `backend: fsdp` and the stage's `fsdp:` block",
    "local_rank": "Ray sets the ranks",
}


def config_class(kind: str) -> type:
    """The config dataclass the kinds table names (imported lazily: TRL takes seconds to import)."""
    module, _, name = KINDS[kind].config.rpartition(".")
    return getattr(importlib.import_module(module), name)


@cache
def field_types(cls: type) -> dict[str, Any]:
    """Each init field's resolved type annotation."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


@cache
def type_adapter(annotation: Any) -> Any:
    """A pydantic adapter for a field's type, or None for types pydantic cannot express (TRL checks those)."""
    from pydantic import TypeAdapter

    try:
        return TypeAdapter(annotation)
    except Exception:  # noqa: BLE001 - pydantic raises several error types for exotic annotations
        return None


def check_value(annotation: Any, value: Any) -> tuple[Any, str | None]:
    """The value converted to the field's type (YAML reads `5e-3` as a string), or why it cannot be."""
    from pydantic import ValidationError

    adapter = type_adapter(annotation)
    if adapter is None:
        return value, None
    try:
        return adapter.validate_python(value, strict=False), None
    except ValidationError as err:
        if not isinstance(value, list) and takes_a_list(annotation):  # TRL lists one value itself
            as_list, problem = check_value(annotation, [value])
            if problem is None:
                return as_list, None
        message = err.errors()[0]["msg"]
        return value, f"{message[0].lower()}{message[1:]} (got {value!r})"


def takes_a_list(annotation: Any) -> bool:
    """Whether a field's type is a list (or an optional one): `loss_type: ipo` means `[ipo]` to TRL."""
    return list in (typing.get_origin(annotation), *map(typing.get_origin, typing.get_args(annotation)))


def coerce(kind: str, block: dict[str, Any]) -> dict[str, Any]:
    """The `trl:` block with each value converted to its TRL field's type."""
    fields = field_types(config_class(kind))
    return {key: check_value(fields.get(key, Any), value)[0] for key, value in block.items()}


def trl_setting(kind: str, block: dict[str, Any], key: str) -> Any:
    """A setting the plan reads (`PLAN_SETTINGS`), as the stage's config will hold it."""
    return checked(kind, block)["settings"][key]


def trl_problems(kind: str, block: dict[str, Any], path: str) -> list[Problem]:
    """Every problem with a `trl:` block, each under `path`: unknown keys, keys align owns, wrong types,
    values that cannot train, and TRL's own `__post_init__` checks."""
    if KINDS[kind].config is None:
        return [Problem(path, f"a {kind} stage takes no trl: block")] if block else []
    return [Problem(f"{path}{key}", message) for key, message in checked(kind, block)["problems"]]


def trl_warnings(kind: str, block: dict[str, Any], path: str) -> list[Problem]:
    """The values of a valid `trl:` block that are legal but almost surely a mistake (`WARN_ABOVE`)."""
    if KINDS[kind].config is None or not block:
        return []
    return [Problem(f"{path}{key}", message) for key, message in checked(kind, block)["warnings"]]


def checked(kind: str, block: dict[str, Any]) -> dict[str, Any]:
    """The verdict on a `trl:` block and the plan's settings, from the cache when this block was checked
    under the same TRL and transformers before; else computed (importing TRL) and cached."""
    versions = {name: importlib.metadata.version(name) for name in ("trl", "transformers")}
    key = digest({"kind": kind, "block": block, "versions": versions, "format": CHECK_FORMAT})
    return cached_json("trl-checks", key, lambda: check_block(kind, block))


def check_block(kind: str, block: dict[str, Any]) -> dict[str, Any]:
    """Problems as (`.key` or "", message), and the plan's settings from the config TRL built."""
    problems = field_problems(kind, block)
    if problems:
        return {"problems": problems, "settings": {}, "warnings": []}
    try:
        with warnings.catch_warnings():  # deprecation notices belong to training time, not to validate
            warnings.simplefilter("ignore")
            config = build_config(kind, block, output_dir=tempfile.gettempdir(), precision="fp32", seed=0)
    except Exception as err:  # noqa: BLE001 - TRL raises ValueError/TypeError/etc. from __post_init__
        problem = ("", f"{config_class(kind).__name__} rejected it: {err}")
        return {"problems": [problem], "settings": {}, "warnings": []}
    return {
        "problems": [],
        "settings": {key: getattr(config, key, None) for key in PLAN_SETTINGS},
        "warnings": [(f".{key}", message) for key, message in value_warnings(coerce(kind, block))],
    }


def field_problems(kind: str, block: dict[str, Any]) -> list[tuple[str, str]]:
    """Unknown keys, keys align owns, and values of the wrong type."""
    cls = config_class(kind)
    fields = field_types(cls)
    problems = []
    for key, value in block.items():
        where = f".{key}"
        if key in OWNED_BY_ALIGN:
            problems.append((where, f"align sets this; {OWNED_BY_ALIGN[key]}"))
        elif key not in fields:
            hint = suggestion(key, sorted(fields))
            message = (
                f"unknown {cls.__name__} field '{key}'; {hint}"
                f"see {cls.__module__.split('.')[0]}'s {cls.__name__} for the fields it takes"
            )
            problems.append((where, message))
        elif (message := value_problem(key, fields[key], value)) is not None:
            problems.append((where, message))
    return problems


def value_problem(key: str, annotation: Any, value: Any) -> str | None:
    """Why a value cannot be the field's: the wrong type, a YAML boolean for a number (pydantic would take
    `yes` as 1), or a number no run can train with (`FLOORS`, `MAX_STEPS`)."""
    if isinstance(value, bool) and takes_a_number(annotation):
        return f"a number is needed here, not the YAML boolean {str(value).lower()}"
    converted, message = check_value(annotation, value)
    if message is not None or not isinstance(converted, int | float):
        return message
    if key in FLOORS and converted < FLOORS[key][0]:
        least, why = FLOORS[key]
        return f"{value!r} is below {least:g}: {why}"
    if key == "learning_rate" and converted <= 0:
        return f"{value!r} trains nothing (0) or climbs the loss (below 0): give a positive rate, e.g. 1e-5"
    if key == "max_steps" and converted > MAX_STEPS:
        return (
            f"{value!r} steps is more than any run takes ({MAX_STEPS:.0e} steps at 10 a second is over three "
            "years): give the steps you mean, or -1 to train for num_train_epochs"
        )
    return None


def value_warnings(block: dict[str, Any]) -> list[tuple[str, str]]:
    """(key, message) for each value above its `WARN_ABOVE` limit."""
    return [
        (key, f"{block[key]:g} is above {limit:g}: {why}")
        for key, (limit, why) in WARN_ABOVE.items()
        if isinstance(block.get(key), int | float) and block[key] > limit
    ]


def build_config(
    kind: str,
    block: dict[str, Any],
    *,
    output_dir: str,
    precision: str,
    seed: int,
    accelerator: bool = False,
    **align_args: Any,
) -> Any:
    """TRL's config for a stage: the user's block plus what align owns (precision, outputs, device and
    backend)."""
    return config_class(kind)(
        **coerce(kind, block),
        output_dir=output_dir,
        seed=seed,
        bf16=compute_dtype(precision) == "bf16",
        fp16=precision == "fp16",
        use_cpu=not accelerator,
        **align_args,
    )
