"""A sweep, expanded before the plan: the pipeline file with `sweep:` becomes ordinary stages, one copy of the
swept stage per variant (`dpo[beta=0.1]`) and of every stage that reads it, and each eval stage downstream
compares every variant. The plan, the records and the skip logic then see plain stages; Ray Tune draws the
values and runs the variants (align/run/sweep.py).

Every path of `sweep.parameters` is checked against the stage's own model and every value against its
type, by validating the stage with that value set, before anything loads."""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field
from typing import Any

from align.config.sweep import SweepSpec
from align.errors import Problem
from align.pipeline.graph import downstream, reference_target, references

SPLIT = "."


@dataclass(frozen=True)
class Sweep:
    """A validated sweep with what expanding it needs: the file as resolved YAML data (without `sweep:`),
    the repeated stages in file order, and, for a grid, its variants (random and Optuna draw theirs on
    Ray Tune as the sweep runs)."""

    spec: SweepSpec
    raw: dict[str, Any] = field(repr=False)
    repeated: tuple[str, ...]
    evals: tuple[str, ...]  # eval stages that compare the variants
    grid: tuple[dict[str, Any], ...] | None

    @property
    def stage(self) -> str:
        return self.spec.stage()

    def label(self, values: dict[str, Any]) -> str:
        """`beta=0.1,learning_rate=1e-05`: each swept setting by its last key (longer where two share one)."""
        keys = short_keys(list(self.spec.parameters))
        return ",".join(f"{keys[path]}={shown(values[path])}" for path in self.spec.parameters)

    def name(self, stage: str, values: dict[str, Any]) -> str:
        return f"{stage}[{self.label(values)}]"

    def variant_stages(self, values: dict[str, Any]) -> list[str]:
        """The stages one variant runs: the swept one and those repeated with it, by their variant names."""
        return [self.name(stage, values) for stage in self.repeated]


def shown(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def short_keys(paths: list[str]) -> dict[str, str]:
    """Each path's shortest tail of keys that no other path ends with."""
    keys = {}
    for path in paths:
        parts = path.split(SPLIT)[2:]
        for size in range(1, len(parts) + 1):
            tail = SPLIT.join(parts[-size:])
            if not any(other != path and other.endswith(SPLIT + tail) for other in paths):
                keys[path] = tail
                break
    return keys


def set_path(raw: dict[str, Any], path: str, value: Any) -> None:
    """Set `value` at a dotted YAML path, making the mappings on the way."""
    node = raw
    *parents, leaf = path.split(SPLIT)
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value


def grid_values(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every combination of the lists, the first parameter slowest, as Tune's grid_search runs them."""
    paths = list(spec.parameters)
    return [dict(zip(paths, combo, strict=True)) for combo in itertools.product(*spec.parameters.values())]


def renamed(value: Any, names: dict[str, str]) -> Any:
    """`value` with every `${stages.X.output}` of a stage in `names` pointing at its new name."""
    if isinstance(value, dict):
        return {key: renamed(item, names) for key, item in value.items()}
    if isinstance(value, list):
        return [renamed(item, names) for item in value]
    if isinstance(value, str) and (target := reference_target(value)) in names:
        return "${stages." + names[target] + ".output}"
    return value


def expand(sweep: Sweep, variants: list[dict[str, Any]]) -> dict[str, Any]:
    """The file's data with each repeated stage copied per variant (in place of the original, with the
    variant's values set), and each comparing eval stage asking every variant's model."""
    raw = copy.deepcopy(sweep.raw)
    stages: dict[str, Any] = {}
    for name, body in raw["stages"].items():
        if name not in sweep.repeated:
            stages[name] = compare_variants(body, sweep, variants) if name in sweep.evals else body
            continue
        for values in variants:
            names = {stage: sweep.name(stage, values) for stage in sweep.repeated}
            copied = renamed(copy.deepcopy(body), names)
            if name == sweep.stage:
                for path, value in values.items():
                    set_path({"stages": {name: copied}}, path, value)
            stages[names[name]] = copied
    return {**raw, "stages": stages}


def compare_variants(body: dict[str, Any], sweep: Sweep, variants: list[dict[str, Any]]) -> dict[str, Any]:
    """An eval stage's `models:` with each model read from a repeated stage replaced by one per variant."""
    models = {}
    for key, value in body.get("models", {}).items():
        target = reference_target(value) if isinstance(value, str) else None
        if target not in sweep.repeated:
            models[key] = value
            continue
        for values in variants:
            label = sweep.label(values)
            models[f"{key}[{label}]"] = "${stages." + sweep.name(target, values) + ".output}"
    return {**body, "models": models}


def candidates(space: Any) -> list[Any]:
    """The values a parameter can take that can be checked up front: a list's items, a choice's, a range's
    ends."""
    if isinstance(space, list):
        return space
    name, args = next(iter(space.items()))
    return list(args)


def repeated_and_evals(spec: SweepSpec, stages: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The swept stage and the stages that read it (repeated per variant), and the eval stages among those
    readers (run once, comparing every variant), both in file order."""
    edges, _ = references(stages)
    readers = downstream(edges, {spec.stage()})
    evals = [name for name in stages if name in readers and stages[name].kind == "eval"]
    below_evals = downstream(edges, set(evals)) - set(evals)
    repeated = [name for name in stages if name in readers and name not in evals and name not in below_evals]
    return repeated, evals


def stage_problems(spec: SweepSpec, stages: dict[str, Any]) -> list[Problem]:
    """The paths name one stage of the file, and not an eval stage."""
    named = sorted({path.split(SPLIT)[1] for path in spec.parameters})
    where = "sweep.parameters"
    if len(named) > 1:
        return [Problem(where, f"the paths name stages {', '.join(named)}; a sweep varies one stage")]
    if named[0] not in stages:
        return [Problem(where, f"no stage {named[0]!r}; stages: {', '.join(stages)}")]
    if stages[named[0]].kind == "eval":
        return [Problem(where, f"{named[0]!r} is an eval stage; sweep the stage whose output it compares")]
    return []


def metric_problems(spec: SweepSpec, stages: dict[str, Any]) -> list[Problem]:
    """The metric names something a variant records: `eval/<model>/<reward>` of a model an eval stage reads
    from a repeated stage, or `<stage>/<name>` of a repeated stage."""
    repeated, evals = repeated_and_evals(spec, stages)
    head, _, rest = spec.metric.partition("/")
    if head == "eval":
        model = rest.partition("/")[0]
        compared = {
            key: name
            for name in evals
            for key, value in stages[name].models.items()
            if reference_target(value) in repeated
        }
        if model not in compared:
            hint = f"models that read the swept stage: {', '.join(compared)}" if compared else "none reads it"
            return [
                Problem("sweep.metric", f"{spec.metric!r}: no eval stage compares a model {model!r} ({hint})")
            ]
        if stages[compared[model]].baseline_name == model:
            return [Problem(f"stages.{compared[model]}.baseline", "the baseline cannot be a swept model")]
        if spec.method == "optuna":
            return [
                Problem(
                    "sweep.metric",
                    "optuna learns from each variant as it ends, and an eval stage compares them all at the "
                    "end: rank by a metric the swept stage records (e.g. dpo/preference_accuracy_after), "
                    "or use random",
                )
            ]
        return []
    if head not in repeated or not rest:
        return [
            Problem(
                "sweep.metric",
                f"{spec.metric!r}: give eval/<model>/<reward>, or <stage>/<metric> of {', '.join(repeated)}",
            )
        ]
    return []
