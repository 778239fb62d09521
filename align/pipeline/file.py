"""Reading a pipeline file: YAML with `safe_load`, `--set` overrides, every stage validated by its kind's
model and its `trl:` block by TRL's config class, then the checks that span keys. One `ConfigError`
lists every problem with its YAML path. Nothing here loads a model or starts Ray.

Paths mean what the user meant: a relative path written in a pipeline file is relative to that file's
folder; a relative path given on the command line with `--set` is relative to the current working
directory. Both are made absolute here, once, on the driver (`PATH_FIELDS`), so the plan, the records and
the Ray workers (which run in Ray's session folder) only ever see absolute paths. The default
`output_root` (`runs`) counts as written in the file: outputs go beside the pipeline file, wherever align
runs from. Not paths: builtin names (`tiny`, `align:...`), hub ids (`org/name`, unless `org` is a folder
beside the file, or the value starts with `./`, `../`, `/` or `~`), `hf:` refs, `${stages.X.output}`
references, and reward `function:`s, which are dotted imports (see `Pipeline.module_roots`).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError

from align.backends import BACKENDS
from align.cache import exists, user_path
from align.config.spec import KINDS, STAGE_NAME, VARIANT_NAME, Defaults, Pipeline, StageBase
from align.config.stage_parts import trl_of
from align.config.strict import Strict
from align.config.sweep import SweepSpec
from align.config.validation import lenient, pydantic_problems
from align.data.loading import data_location
from align.errors import ConfigError, Problem
from align.models.chat_templates import BUILTIN as BUILTIN_TEMPLATES
from align.models.loading import model_location
from align.pipeline.checks import cross_check
from align.pipeline.sweep import (
    Sweep,
    candidates,
    expand,
    grid_values,
    metric_problems,
    repeated_and_evals,
    set_path,
    stage_problems,
)
from align.pipeline.trl_args import trl_problems, trl_warnings


class Header(Strict):
    """The top level with stages left raw, so that each stage is validated by its own kind."""

    name: Annotated[str, Field(pattern=STAGE_NAME)]
    base_model: str
    allow_custom_code: bool = False
    chat_template: str | None = None
    defaults: Defaults = Defaults()
    stages: Annotated[dict[Annotated[str, Field(pattern=VARIANT_NAME)], Any], Field(min_length=1)]
    # `load` takes `sweep` out of the file and checks it against the stages; here it is a key a file may have
    sweep: SweepSpec | None = None


MERGE_TAG = "tag:yaml.org,2002:merge"


class UniqueKeyLoader(yaml.SafeLoader):
    """`safe_load` that refuses a repeated key (a second `dpo:` stage must not silently replace the first),
    a merge key (`<<: *x`: its keys would be overridden without a word) and an alias inside the node it
    names (a recursive value, which no setting can mean)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.open_anchors: list[str | None] = []

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) and event.anchor in self.open_anchors:
            raise yaml.composer.ComposerError(
                None,
                None,
                f"the alias *{event.anchor} is inside the value &{event.anchor} names, so that "
                "value would contain itself; copy the keys it needs instead",
                event.start_mark,
            )
        anchor = getattr(event, "anchor", None)
        self.open_anchors.append(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self.open_anchors.pop()

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen = set()
        for key_node, _ in node.value:
            if key_node.tag == MERGE_TAG:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    "merge keys (`<<: *name`) are not read: write the keys out where they "
                    "apply (an alias of a whole value, `key: *name`, is read)",
                    key_node.start_mark,
                )
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
        # PyYAML's `problem` alone can be half a sentence ("but found another document")
        said = [getattr(err, "context", None), getattr(err, "problem", None)]
        reason = ", ".join(filter(None, said)) or str(err)
        raise ConfigError([Problem(where, f"invalid YAML: {reason}")], source=str(path)) from None
    if not isinstance(raw, dict):
        raise ConfigError(
            [Problem("", "the file must be a YAML mapping with name, base_model and stages")],
            source=str(path),
        )
    return raw


def file_location(value: str, base: Path) -> str:
    return str(user_path(value, base))


def template_location(value: str, base: Path) -> str:
    """A chat template: a name as written (a builtin, or refused as one), else a file or folder made
    absolute; a bare word is a path only where one exists beside the file."""
    bare = "/" not in value and not value.endswith(".jinja") and not value.startswith((".", "~"))
    if value in BUILTIN_TEMPLATES or (bare and not exists(base / value)):
        return value
    return file_location(value, base)


PATH_FIELDS: dict[tuple[str, ...], Callable[[str, Path], str]] = {
    ("base_model",): model_location,
    ("defaults", "output_root"): file_location,
    ("stages", "*", "model"): model_location,
    ("stages", "*", "data", "train"): data_location,
    ("stages", "*", "data", "train", "*", "path"): data_location,  # a mixture's sources
    ("stages", "*", "data", "eval"): data_location,
    ("stages", "*", "zero2", "config"): file_location,
    ("stages", "*", "trl", "resume_from_checkpoint"): file_location,
    ("stages", "*", "rewards", "*", "model"): model_location,
    ("stages", "*", "models", "*"): model_location,  # an eval stage's named models
    ("stages", "*", "teacher"): model_location,  # a distill stage's, as a model value
    ("stages", "*", "teacher", "model"): model_location,  # ... or in its block
    ("stages", "*", "data", "prompts"): data_location,
    ("stages", "*", "lm_eval", "include_path"): file_location,
    ("chat_template",): template_location,
    ("stages", "*", "chat_template"): template_location,
}
"""Every value of the file that can be a path (`*`: any stage, any list item), and how it is resolved."""


def resolve_paths(value: Any, at: tuple[str, ...], base: Path) -> Any:
    """`value`, found at the YAML path `at`, with each path in it made absolute against `base`."""
    if isinstance(value, dict):
        return {key: resolve_paths(item, (*at, str(key)), base) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve_paths(item, (*at, "*"), base) for item in value]
    if not isinstance(value, str) or "${" in value:
        return value
    for fields, resolve in PATH_FIELDS.items():
        if len(fields) == len(at) and all(part in ("*", key) for part, key in zip(fields, at, strict=True)):
            return resolve(value, base)
    return value


def apply_overrides(raw: dict[str, Any], overrides: list[str], base: Path) -> None:
    """Apply `key.path=value` overrides in place; values are parsed as YAML (`0.2`, `true`, `[a, b]`), and
    the paths in them are taken from `base`, the directory align runs in."""
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
                node[leaf] = resolve_paths(yaml.safe_load(value), (*parents, leaf), base)
            except yaml.YAMLError as err:
                problems.append(
                    Problem(f"--set {item}", f"the value is not valid YAML: {getattr(err, 'problem', err)}")
                )
    if problems:
        raise ConfigError(problems)


def validate_stage(name: str, raw_stage: Any) -> tuple[StageBase | None, list[Problem]]:
    """Validate one stage with the model of its `kind`. A stage whose only problems are unknown keys comes
    back too, less those keys, so that its models and data are still checked in the same pass."""
    where = f"stages.{name}"
    if not isinstance(raw_stage, dict):
        return None, [Problem(where, "a stage must be a mapping with at least `kind`")]
    kind = raw_stage.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        allowed = ", ".join(KINDS)
        return None, [Problem(f"{where}.kind", f"{kind!r} is not a stage kind; allowed: {allowed}")]
    spec = KINDS[kind].spec
    try:
        return spec.model_validate(raw_stage), []
    except ValidationError as err:
        return lenient(spec, raw_stage, err), pydantic_problems(err, prefix=where, model=spec)


def validate_header(raw: dict[str, Any]) -> tuple[Header | None, list[Problem]]:
    """The top level, as `validate_stage` validates a stage."""
    try:
        return Header.model_validate(raw), []
    except ValidationError as err:
        return lenient(Header, raw, err), pydantic_problems(err, prefix="", model=Header)


ACROSS = "models, data, references"
"""What the checks across stages read of a stage, named where they wait for it."""


def parse(raw: dict[str, Any], source_dir: str | None = None) -> Pipeline:
    """Validate a raw mapping into a Pipeline, every problem in one pass: the top level and each stage on
    their own, then the checks across stages (align.pipeline.checks) on every part that has its shape. A
    check that needs a part with a problem waits, and is counted in the error. Its paths must be absolute
    already (`load` sees to that); `source_dir` is the folder of the file it came from."""
    header, problems = validate_header(raw)
    stages: dict[str, StageBase] = {}
    raw_stages = raw.get("stages")
    named = [str(name) for name in raw_stages] if isinstance(raw_stages, dict) else []
    for name in named:
        stage, stage_problems = validate_stage(name, raw_stages[name])
        problems += stage_problems
        if stage is not None:
            stages[name] = stage
            problems += trl_problems(stage.kind, trl_of(stage), f"stages.{name}.trl")
    problems += backend_problems(header, stages)
    if header is None:
        raise ConfigError(problems, waiting=tuple(f"stages.{name} ({ACROSS})" for name in named))
    fields = header.model_dump(exclude={"stages", "sweep"})  # `load` reads the sweep on its own
    pipeline = Pipeline(**fields, stages=stages, source_dir=source_dir)
    found = cross_check(pipeline, named)
    held = [f"stages.{name} ({ACROSS})" for name in named if name not in stages]
    if problems or found.problems:
        raise ConfigError(problems + found.problems, waiting=(*held, *found.waiting))
    warnings = [
        warning
        for name, stage in stages.items()
        for warning in trl_warnings(stage.kind, trl_of(stage), f"stages.{name}.trl")
    ]
    update = {"edges": found.edges, "warnings": tuple(warnings), "absent": tuple(found.absent)}
    return pipeline.model_copy(update=update)


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


def resolved(path: Path, overrides: list[str]) -> dict[str, Any]:
    """The file as YAML data with `overrides` applied and every path absolute: the file's from its folder,
    those of `overrides` from the working directory. What `load` parses, and what `align submit` ships."""
    raw = read_yaml(path)
    defaults = raw.setdefault("defaults", {})
    if isinstance(defaults, dict):  # the default output_root counts as written in the file
        defaults.setdefault("output_root", Defaults().output_root)
    raw = resolve_paths(raw, (), user_path(str(path.parent)))
    apply_overrides(raw, overrides, Path(os.getcwd()))
    return raw


def load(path: str | Path, overrides: list[str] | None = None) -> Pipeline:
    """Read, override and validate a pipeline file; every problem is reported at once. A file with
    `sweep:` comes back expanded into its variants where they are known up front (a grid)."""
    path = Path(path)
    source_dir = str(user_path(str(path.parent)))
    try:
        raw = resolved(path, overrides or [])
        sweep = raw.pop("sweep", None)
        return parse(raw, source_dir) if sweep is None else swept(raw, sweep, source_dir)
    except ConfigError as err:
        raise ConfigError(err.problems, source=str(path), waiting=err.waiting) from None


SWEEP_CHECKS = "sweep (its stage, values and metric)"


def swept(raw: dict[str, Any], sweep_raw: Any, source_dir: str) -> Pipeline:
    """The pipeline of a file with `sweep:`: the grid's variants as stages, or, for values drawn as the
    sweep runs, the stages as written; either way with the validated `Sweep`."""
    problems, spec = [], None
    try:
        spec = SweepSpec.model_validate(sweep_raw)
    except ValidationError as err:
        problems = pydantic_problems(err, prefix="sweep", model=SweepSpec)
    try:
        written = parse(raw, source_dir)
    except ConfigError as err:
        waiting = (*err.waiting, SWEEP_CHECKS) if spec is not None else err.waiting
        raise ConfigError(problems + err.problems, waiting=waiting) from None
    if spec is not None:
        problems += stage_problems(spec, written.stages) or value_problems(spec, raw, Path(source_dir))
        problems += [] if problems else metric_problems(spec, written.stages)
    if problems:
        raise ConfigError(problems)
    repeated, evals = repeated_and_evals(spec, written.stages)
    grid = grid_values(spec) if spec.method == "grid" else None
    sweep = Sweep(spec, raw, tuple(repeated), tuple(evals), None if grid is None else tuple(grid))
    return with_variants(sweep, grid, source_dir) if grid else written.model_copy(update={"sweep": sweep})


def value_problems(spec: SweepSpec, raw: dict[str, Any], base: Path) -> list[Problem]:
    """Each swept value checked as the stage's own: the stage validated with it set, named by its place in
    `sweep.parameters` (a distribution's ends stand for it)."""
    stage = spec.stage()
    problems = []
    for path, space in spec.parameters.items():
        for index, value in enumerate(candidates(space)):
            body = copy.deepcopy(raw["stages"][stage])
            set_path({"stages": {stage: body}}, path, resolve_paths(value, tuple(path.split(".")), base))
            found, own = validate_stage(stage, body)
            if found is not None:
                own += trl_problems(found.kind, trl_of(found), f"stages.{stage}.trl")
            problems += [Problem(f"sweep.parameters.{path}[{index}]", f"{p.path}: {p.message}") for p in own]
    return problems


def with_variants(sweep: Sweep, variants: list[dict[str, Any]], source_dir: str | None) -> Pipeline:
    """The pipeline with `variants` of the swept stage (and of what reads it) as stages of their own."""
    return parse(expand(sweep, variants), source_dir).model_copy(update={"sweep": sweep})
