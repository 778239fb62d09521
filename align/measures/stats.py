"""Figures with their uncertainty, as an eval stage reports them: a mean with its 95% bootstrap interval,
and a win rate against a baseline (ties counted half) with its interval.

Method: scipy's `stats.bootstrap` over prompts (the unit that was sampled), 9,999 resamples, bias-corrected
and accelerated (BCa) percentile intervals, seeded so that a rerun gives the same interval. Where BCa is
undefined (every resample equal, or too few values to estimate its acceleration) the plain percentile
interval is used; a sample whose values are all equal has a zero-width interval at that value.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

CONFIDENCE = 0.95
RESAMPLES = 9_999


@dataclass(frozen=True)
class Interval:
    """A mean over `n` values and its confidence interval [low, high]."""

    mean: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def mean_interval(values: Sequence[float], *, seed: int = 0, confidence: float = CONFIDENCE) -> Interval:
    """The mean of `values` with its bootstrap interval (BCa; percentile where BCa is undefined)."""
    from scipy.stats import bootstrap

    data = np.asarray(values, dtype=float)
    if data.size == 0:
        raise ValueError("no values: a mean needs at least one")
    mean = float(data.mean())
    if data.size == 1 or np.all(data == data[0]):
        return Interval(mean, mean, mean, int(data.size))
    for method in ("BCa", "percentile"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # BCa's "degenerate distribution" warning: handled below
            found = bootstrap(
                (data,),
                np.mean,
                confidence_level=confidence,
                n_resamples=RESAMPLES,
                method=method,
                rng=np.random.default_rng(seed),
            ).confidence_interval
        low, high = float(found.low), float(found.high)
        if math.isfinite(low) and math.isfinite(high):
            break
    # a resampled mean never leaves the data's range; the interval always holds the sample mean
    return Interval(mean, min(low, mean), max(high, mean), int(data.size))


def outcomes(scores: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Per prompt: 1 where the model scored above the baseline, 0.5 on a tie, 0 below."""
    if len(scores) != len(baseline):
        raise ValueError(f"{len(scores)} scores against {len(baseline)} of the baseline: pair them by prompt")
    return [1.0 if a > b else 0.5 if a == b else 0.0 for a, b in zip(scores, baseline, strict=True)]


def win_rate(
    scores: Sequence[float], baseline: Sequence[float], *, seed: int = 0, confidence: float = CONFIDENCE
) -> Interval:
    """How often the model beats the baseline on the same prompts, ties counted half, with its interval:
    0.5 means no difference; a model against itself is exactly 0.5 [0.5, 0.5]."""
    return mean_interval(outcomes(scores, baseline), seed=seed, confidence=confidence)
