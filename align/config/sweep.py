"""The `sweep:` block: which values of a pipeline to vary, how Ray Tune draws them, and what ranks the
variants. Its paths are checked against the stages by align/pipeline/sweep.py; here only its own shape."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from align.config.strict import Strict

DISTRIBUTIONS = ("uniform", "loguniform", "randint", "choice")
"""What a swept value may be drawn from (Ray Tune's of the same names); a plain list is a grid."""


class EarlyStop(Strict):
    """Stop variants that lag (Ray Tune's ASHA): at `grace_steps`, then at each `reduction_factor` times as
    many steps, a variant whose `metric` (a value its trainer logs: `loss`, `rewards/margins`, ...) is not in
    the best 1/`reduction_factor` of those that got there stops."""

    metric: str = "loss"
    """A value the swept stage's trainer logs while it trains (TRL's log names)."""
    mode: Literal["min", "max"] = "min"
    """Whether a lower (`min`) or higher (`max`) `metric` is better."""
    grace_steps: Annotated[int, Field(ge=1)] = 2
    """No variant is stopped before this many optimizer steps."""
    reduction_factor: Annotated[float, Field(gt=1)] = 2.0
    """At each rung, the share of variants that go on is 1/`reduction_factor`."""


class SweepSpec(Strict):
    """Variants of one stage, run side by side on Ray Tune; the stages it reads run once, those that read it
    are repeated per variant, and an eval stage downstream compares every variant."""

    parameters: Annotated[dict[str, Any], Field(min_length=1)]
    """YAML path (`stages.dpo.trl.beta`) -> a list of values (a grid) or one distribution:
    `{uniform: [low, high]}`, `{loguniform: [low, high]}`, `{randint: [low, high]}` or `{choice: [...]}`."""
    method: Literal["grid", "random", "optuna"] = "grid"
    """`grid`: every combination of the lists; `random`: `samples` draws; `optuna`: `samples` draws by
    Optuna's TPE, each from the results so far."""
    samples: Annotated[int, Field(ge=1)] = 1
    """How many variants `random` and `optuna` draw (a grid runs each of its combinations once)."""
    metric: str
    """What ranks the variants: an eval stage's `eval/<model>/<reward>` (the model whose output the swept
    stage gives), or `<stage>/<recorded metric>` of the swept stage or one that reads it."""
    mode: Literal["max", "min"] = "max"
    """Whether a higher (`max`) or lower (`min`) `metric` is better."""
    early_stop: EarlyStop | None = None
    """Stop lagging variants while they train (ASHA); without it every variant runs to the end."""
    max_concurrent: Annotated[int, Field(ge=1)] | None = None
    """At most this many variants at once; by default as many as the resources hold."""
    seed: int | None = None
    """Seeds `random` and `optuna` draws (default: `defaults.seed`): the same seed draws the same variants."""

    @field_validator("parameters")
    @classmethod
    def values_or_distribution(cls, parameters: dict[str, Any]) -> dict[str, Any]:
        for path, space in parameters.items():
            if not path.startswith("stages.") or path.count(".") < 2:
                raise ValueError(
                    f"{path!r}: name a stage's setting by its YAML path, e.g. stages.dpo.trl.beta"
                )
            problem = space_problem(space)
            if problem:
                raise ValueError(f"{path!r}: {problem}")
        return parameters

    @model_validator(mode="after")
    def grid_has_lists(self) -> SweepSpec:
        drawn = [path for path, space in self.parameters.items() if isinstance(space, dict)]
        if self.method == "grid" and drawn:
            raise ValueError(
                f"method grid takes lists of values; {drawn[0]!r} is a distribution: "
                "use method: random (or optuna) with samples: N"
            )
        if self.method == "grid" and self.samples > 1:
            raise ValueError(
                "samples is for random and optuna; a grid runs each combination once (one seed gives the "
                "same run twice)"
            )
        return self

    def stage(self) -> str:
        """The swept stage: the one every path names."""
        return next(iter(self.parameters)).split(".")[1]


def space_problem(space: Any) -> str | None:
    """What is wrong with one parameter's values, or None."""
    if isinstance(space, list):
        return None if space else "give at least one value"
    if not isinstance(space, dict) or len(space) != 1 or next(iter(space)) not in DISTRIBUTIONS:
        return f"give a list of values or one of {', '.join(f'{{{name}: ...}}' for name in DISTRIBUTIONS)}"
    name, args = next(iter(space.items()))
    if name != "choice" and isinstance(args, list) and any(isinstance(a, str) for a in args):
        return f"{name} takes two numbers [low, high]; YAML reads 1e-4 as text: write 1.0e-4"
    if name == "choice":
        return None if isinstance(args, list) and args else "choice takes a non-empty list"
    numbers = isinstance(args, list) and len(args) == 2 and all(isinstance(a, int | float) for a in args)
    if not numbers or not args[0] < args[1]:
        return f"{name} takes [low, high] with low < high"
    if name == "loguniform" and args[0] <= 0:
        return "loguniform takes [low, high] with 0 < low"
    if name == "randint" and not all(isinstance(a, int) for a in args):
        return "randint takes two integers [low, high)"
    return None
