"""What Ray Tune decides in a sweep, and nothing more: the values each variant gets (a grid's, a seeded random
draw, or Optuna's TPE, told each variant's end) and which variant ASHA stops early. It hears typed events (a
logged step of a variant's swept stage, a variant's end) and answers with values and stops; the run's one
schedule runs the variants' stages (align/run/sweep.py).

Tune's searchers and ASHA are driven here through their own methods (`suggest`, `on_trial_complete`,
`on_trial_result`), without a Tuner; ASHA is handed a stand-in for each trial (align/compat/ray.py, whose
contract test fails on a Ray whose ASHA reads more of a trial)."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Protocol

from align.compat.ray import asha_add, asha_remove, asha_says_stop
from align.config.sweep import EarlyStop
from align.pipeline.sweep import Sweep
from align.records import Progress
from align.run.sweep_state import key


@dataclass(frozen=True)
class Logged:
    """One step a variant's swept stage logged, with its values (TRL's names): what ASHA judges."""

    stage: str
    step: int
    values: dict[str, float]


@dataclass(frozen=True)
class Stop:
    """ASHA's word to stop a variant's stage, at which step and why (for a person and for `sweep.json`)."""

    stage: str
    step: int
    reason: str


@dataclass
class LoggedSteps:
    """Each stage's progress file, as the driver reads it now and then, as one Logged per step it logged: once
    each, in order, however far apart the reads (the file keeps the recent steps). The last step is left to
    the stage's end: ASHA stops a trial at its last rung."""

    heard: dict[str, int] = field(default_factory=dict)  # the last step heard of each stage

    def new(self, stage: str, entry: Progress) -> list[Logged]:
        last, since = entry.max_steps or math.inf, self.heard.get(stage, -1)
        found = []
        for logged in entry.recent:
            if since < logged.step < last:
                since = logged.step
                found.append(Logged(stage, since, logged.values))
        self.heard[stage] = since
        return found


def search_space(sweep: Sweep) -> dict[str, Any]:
    """Tune's space for the swept values: each list a `choice`, each distribution Tune's of that name."""
    from ray import tune

    drawn = {"uniform": tune.uniform, "loguniform": tune.loguniform, "randint": tune.randint}
    space = {}
    for path, values in sweep.spec.parameters.items():
        if isinstance(values, list):
            space[path] = tune.choice(values)
        else:
            ((name, args),) = values.items()
            space[path] = tune.choice(args) if name == "choice" else drawn[name](*args)
    return space


class Draws(Protocol):
    """Where a sweep's values come from: `next` (None once every variant asked for is drawn), and `tell`,
    a variant's end, with its metric (None when it did not finish)."""

    def next(self) -> dict[str, Any] | None: ...

    def upcoming(self) -> list[dict[str, Any]]: ...

    def tell(self, values: dict[str, Any], value: float | None, failed: bool) -> None: ...


@dataclass
class Listed:
    """Values fixed before the sweep runs (a grid's, or random draws): told nothing."""

    values: list[dict[str, Any]]

    def next(self) -> dict[str, Any] | None:
        return self.values.pop(0) if self.values else None

    def upcoming(self) -> list[dict[str, Any]]:
        return list(self.values)

    def tell(self, values: dict[str, Any], value: float | None, failed: bool) -> None:
        pass


def random_draws(sweep: Sweep, seed: int, earlier: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`samples` draws (Tune's, seeded as its BasicVariantGenerator seeds them), the earlier runs' first: a
    rerun goes on through the same sequence, so an interrupted sweep ends with the variants of one that was
    not. A value drawn twice is one variant."""
    import numpy as np
    from ray.tune.search.variant_generator import generate_variants

    rng, space = np.random.default_rng(seed), {"config": search_space(sweep)}
    fresh = [next(generate_variants(space, random_state=rng))[1]["config"] for _ in range(sweep.spec.samples)]
    unique = {key(values): values for values in [*earlier, *fresh]}
    return list(unique.values())[: max(sweep.spec.samples, len(earlier))]


class Optuna:
    """Optuna's TPE (Tune's OptunaSearch): each variant drawn from the ends told so far, the earlier runs'
    values first (so none is drawn anew)."""

    def __init__(self, sweep: Sweep, seed: int, earlier: list[dict[str, Any]]) -> None:
        from ray.tune.search.optuna import OptunaSearch

        spec = sweep.spec
        space = OptunaSearch.convert_search_space(search_space(sweep))
        self.search = OptunaSearch(space, spec.metric, spec.mode, earlier or None, seed=seed)
        self.left = max(spec.samples, len(earlier))
        self.metric = spec.metric
        self.trials: dict[str, list[str]] = {}  # a variant's values -> its trials (Optuna may draw one twice)
        self.ids = itertools.count()

    def next(self) -> dict[str, Any] | None:
        if self.left <= 0:
            return None
        self.left -= 1
        trial = f"variant-{next(self.ids)}"
        values = self.search.suggest(trial)
        self.trials.setdefault(key(values), []).append(trial)
        return values

    def upcoming(self) -> list[dict[str, Any]]:
        return []  # each is drawn from the ends told so far

    def tell(self, values: dict[str, Any], value: float | None, failed: bool) -> None:
        for trial in self.trials.pop(key(values), []):
            result = None if value is None else {self.metric: value}
            self.search.on_trial_complete(trial, result, error=failed)


def draws(sweep: Sweep, seed: int, earlier: list[dict[str, Any]]) -> Draws:
    if sweep.grid is not None:
        return Listed(list(sweep.grid))
    if sweep.spec.method == "optuna":
        return Optuna(sweep, seed, earlier)
    return Listed(random_draws(sweep, seed, earlier))


class EarlyStopper:
    """ASHA (Tune's AsyncHyperBandScheduler) over the variants' logged steps: at `grace_steps` and each
    `reduction_factor` times as many, a variant whose value is not in the best 1/`reduction_factor` of
    those that got there is stopped."""

    def __init__(self, early: EarlyStop, max_t: int) -> None:
        from ray.tune.schedulers import ASHAScheduler

        self.early = early
        self.asha = ASHAScheduler(
            time_attr="step",
            metric=early.metric,
            mode=early.mode,
            grace_period=early.grace_steps,
            reduction_factor=early.reduction_factor,
            max_t=max_t,
        )
        self.watched: set[str] = set()

    def judge(self, event: Logged) -> Stop | None:
        """ASHA's word on one logged step: a Stop, or None to go on."""
        value = event.values.get(self.early.metric)
        if not isinstance(value, int | float):
            return None
        if event.stage not in self.watched:
            asha_add(self.asha, event.stage)
            self.watched.add(event.stage)
        result = {"step": event.step, self.early.metric: value}
        if not asha_says_stop(self.asha, event.stage, result):
            return None
        shown = f"{self.early.metric} {value:.4g}"
        reason = f"stopped early by ASHA at step {event.step} ({shown}, {self.early.mode} is better)"
        return Stop(event.stage, event.step, reason)

    def forget(self, stage: str) -> None:
        """A variant's stage ended: ASHA keeps its values at the rungs it reached, and nothing else."""
        if stage in self.watched:
            asha_remove(self.asha, stage)
            self.watched.discard(stage)
