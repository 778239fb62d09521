"""Reading a pipeline file: YAML with `safe_load`, `--set` overrides, every stage validated by its kind's
model and its `trl:` block by TRL's config class, then the checks that span keys. One `ConfigError`
lists every problem with its YAML path. Nothing here loads a model or starts Ray.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError

from align.backends import BACKENDS
from align.checks import cross_check
from align.errors import ConfigError, Problem
from align.spec import KINDS, STAGE_NAME, Defaults, Pipeline, StageBase, Strict
from align.trl_args import trl_problems
from align.validation import pydantic_problems


class Header(Strict):
    """The top level with stages left raw, so that each stage is validated by its own kind."""

    name: Annotated[str, Field(pattern=STAGE_NAME)]
    base_model: str
    allow_custom_code: bool = False
    defaults: Defaults = Defaults()
    stages: Annotated[dict[Annotated[str, Field(pattern=STAGE_NAME)], Any], Field(min_length=1)]


class UniqueKeyLoader(yaml.SafeLoader):
    """`safe_load` that refuses a repeated key: a second `dpo:` stage must not silently replace the first."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} appears twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict[str, Any]:
    """Parse the file with `safe_load`; YAML syntax errors become a problem with a line number."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError([Problem(str(path), f"cannot read the pipeline file: {err.strerror}")]) from None
    except UnicodeDecodeError:
        raise ConfigError([Problem(str(path), "the pipeline file is not UTF-8 text")]) from None
    try:
        raw = yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        reason = getattr(err, "problem", None) or str(err)
        raise ConfigError([Problem(where, f"invalid YAML: {reason}")], source=str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            [Problem("", "the file must be a YAML mapping with name, base_model and stages")],
            source=str(path),
        )
    return raw


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> None:
    """Apply `key.path=value` overrides in place; values are parsed as YAML (`0.2`, `true`, `[a, b]`)."""
    problems = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            problems.append(Problem(f"--set {item}", "expected key.path=value, e.g. stages.dpo.trl.beta=0.2"))
            continue
        node = raw
        *parents, leaf = key.split(".")
        for depth, part in enumerate(parents):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(
                    Problem(".".join(parents[: depth + 1]), f"--set {key}: this is not a mapping")
                )
                break
            node = child
        else:
            try:
                node[leaf] = yaml.safe_load(value)
            except yaml.YAMLError as err:
                problems.append(
                    Problem(f"--set {item}", f"the value is not valid YAML: {getattr(err, 'problem', err)}")
                )
    if problems:
        raise ConfigError(problems)


def validate_stage(name: str, raw_stage: Any) -> tuple[StageBase | None, list[Problem]]:
    """Validate one stage with the model of its `kind`."""
    where = f"stages.{name}"
    if not isinstance(raw_stage, dict):
        return None, [Problem(where, "a stage must be a mapping with at least `kind`")]
    kind = raw_stage.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        allowed = ", ".join(KINDS)
        return None, [Problem(f"{where}.kind", f"{kind!r} is not a stage kind; allowed: {allowed}")]
    try:
        return KINDS[kind].spec.model_validate(raw_stage), []
    except ValidationError as err:
        return None, pydantic_problems(err, prefix=where, model=KINDS[kind].spec)


def parse(raw: dict[str, Any]) -> Pipeline:
    """Validate a raw mapping into a Pipeline, collecting every problem before raising."""
    problems: list[Problem] = []
    try:
        header = Header.model_validate(raw)
    except ValidationError as err:
        problems += pydantic_problems(err, prefix="", model=Header)
        header = None
    stages: dict[str, StageBase] = {}
    raw_stages = raw.get("stages")
    for name, raw_stage in raw_stages.items() if isinstance(raw_stages, dict) else []:
        stage, stage_problems = validate_stage(str(name), raw_stage)
        problems += stage_problems
        if stage is not None:
            stages[str(name)] = stage
            problems += trl_problems(stage.kind, getattr(stage, "trl", {}), f"stages.{name}.trl")
    problems += backend_problems(header, stages)
    if header is None or problems:
        raise ConfigError(problems)
    pipeline = Pipeline(**{**header.model_dump(exclude={"stages"}), "stages": stages})
    edges, problems = cross_check(pipeline)
    if problems:
        raise ConfigError(problems)
    return pipeline.model_copy(update={"edges": edges})


def backend_problems(header: Header | None, stages: dict[str, StageBase]) -> list[Problem]:
    """Every `backend:` names `auto` or a backend of the registry (align/backends/__init__.py)."""
    named = [] if header is None else [("defaults.backend", header.defaults.backend)]
    named += [(f"stages.{name}.backend", stage.backend) for name, stage in stages.items() if stage.backend]
    allowed = ("auto", *BACKENDS)
    return [
        Problem(path, f"{value!r} is not a backend; use one of: {', '.join(allowed)}")
        for path, value in named
        if value not in allowed
    ]


def load(path: str | Path, overrides: list[str] | None = None) -> Pipeline:
    """Read, override and validate a pipeline file; every problem is reported at once."""
    path = Path(path)
    raw = read_yaml(path)
    try:
        apply_overrides(raw, overrides or [])
        return parse(raw)
    except ConfigError as err:
        raise ConfigError(err.problems, source=str(path)) from None
