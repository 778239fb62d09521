"""Whether an online RL stage has anything to learn from, said while it runs.

GRPO and RLOO turn each group's rewards (the completions of one prompt) into advantages relative to the
group: when every completion of a group scores the same, its advantages are 0 and it moves nothing. TRL logs
the share of such groups as `frac_reward_zero_std`; align's PPO logs the same key for a rollout whose scores
have no spread. A run where most groups are flat, log after log, learns nothing whatever its loss reads.

`SignalWatch` says so once (`no_signal:` sets the share and the number of logs), as a line the console
prints and in the stage's metrics, with what usually causes it: completions cut by `max_completion_length`
(one shown), or a reward that gives every completion the same score (named, with one completion and its
score). Before training, a held-out reward identical on every prompt says the same of the starting model.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from align.rewards import completion_text, shorten
from align.stages.progress import add_note

MOST = 0.5
"""From this share of cut completions on, the cut is named as a likely cause."""


@dataclass(frozen=True)
class Scored:
    """Completions and what each reward gave each of them, row-aligned (NaN: a function's None), and the
    weighted total of each where it was computed."""

    completions: list[Any]
    values: dict[str, list[float]]
    totals: list[float] | None = None


def constant_rewards(scored: Scored) -> dict[str, float | None]:
    """Each reward that gave every completion the same value, with that value (None: no opinion on any)."""
    constant = {}
    for name, values in scored.values.items():
        given = {value for value in values if not math.isnan(value)}
        if len(given) <= 1:
            constant[name] = next(iter(given), None)
    return constant


def token_count(tokenizer: Any, completion: Any) -> int:
    return len(tokenizer(completion_text(completion), add_special_tokens=False)["input_ids"])


def cut_completions(scored: Scored, tokenizer: Any, limit: int) -> list[Any]:
    """The completions that reach `limit` tokens: cut there, unless one stopped on its very last token. The
    text is tokenized again, as the sampler's token ids are not kept."""
    return [completion for completion in scored.completions if token_count(tokenizer, completion) >= limit]


def reward_cause(name: str, value: float | None, scored: Scored) -> str:
    """`reward exact_answer never fired: 0 for all 32 completions, e.g. '13 + 28' scored 0`."""
    example = shorten(scored.completions[0], 80)
    total = len(scored.completions)
    if value is None:
        return f"reward {name} gave no score (None) to any of {total} completions, e.g. {example}"
    what = "never fired" if value == 0 else "gave every completion the same score"
    return f"reward {name} {what}: {value:g} for all {total} completions, e.g. {example} scored {value:g}"


def likely_causes(scored: Scored | None, tokenizer: Any, limit: int, cut_share: float | None) -> list[str]:
    """What usually makes every completion score alike, as found in `scored` (the latest batch): most
    completions cut at `limit` (`cut_share`, counted from `scored` when not given), and rewards that never
    vary."""
    if scored is None or not scored.completions:
        return []
    causes = []
    cut = cut_completions(scored, tokenizer, limit)
    share = len(cut) / len(scored.completions) if cut_share is None else cut_share
    if share >= MOST:
        shown = max(cut or scored.completions, key=lambda c: len(completion_text(c)))
        causes.append(
            f"{share:.0%} of completions were cut at max_completion_length={limit} before they could "
            f"finish, e.g. {shorten(shown, 80)}"
        )
    causes += [reward_cause(name, value, scored) for name, value in constant_rewards(scored).items()]
    return causes


def explained(head: str, causes: list[str]) -> str:
    if not causes:
        causes = [
            "the rewards tell prompts apart but not the completions of one prompt: sample more varied "
            "completions (temperature, num_generations) or use a reward that can tell them apart"
        ]
    return f"{head}. Likely: " + "; ".join(causes)


def flat_start(scored: Scored, tokenizer: Any, limit: int) -> str | None:
    """The line for a starting model whose held-out samples all get the same total reward, else None."""
    totals = scored.totals or []
    given = {round(total, 9) for total in totals if not math.isnan(total)}
    if len(given) > 1 or not totals:
        return None
    value = next(iter(given), math.nan)
    head = (
        f"no learning signal at the start: the starting model's held-out reward is {value:g} on every one "
        f"of {len(totals)} samples, so RL has no difference between completions to learn from"
    )
    return explained(head, likely_causes(scored, tokenizer, limit, None))


class SignalWatch(TrainerCallback):
    """Reads each log's `frac_reward_zero_std`; once `share` or more of the groups were flat in each of the
    last `logs` logs, writes the line (a progress note on rank 0) and keeps it for the stage's metrics.

    `latest()` gives the latest batch of completions and their rewards, to show one of each cause; `unit`
    names what was flat (`groups`, or PPO's `rollouts`)."""

    def __init__(
        self,
        settings: Any,
        logs_dir: Path,
        latest: Callable[[], Scored | None],
        tokenizer: Any,
        limit: int,
        unit: str = "groups",
    ) -> None:
        self.settings, self.logs_dir, self.latest = settings, logs_dir, latest
        self.tokenizer, self.limit, self.unit = tokenizer, limit, unit
        self.window: deque[tuple[float, float | None]] = deque(maxlen=settings.logs if settings else 1)
        self.found: dict[str, Any] = {}

    def on_log(self, args, state, control, logs=None, **kwargs):
        flat = (logs or {}).get("frac_reward_zero_std")
        if self.settings is None or "no_signal" in self.found or not isinstance(flat, int | float):
            return
        self.window.append((float(flat), (logs or {}).get("completions/clipped_ratio")))
        shares = [share for share, _ in self.window]
        if len(shares) < self.settings.logs or min(shares) < self.settings.share:
            return
        cut = [ratio for _, ratio in self.window if isinstance(ratio, int | float)]
        head = (
            f"no learning signal: {sum(shares) / len(shares):.0%} of the {self.unit} had identical rewards "
            f"over the last {len(shares)} logs (to step {state.global_step}), so the rewards prefer no "
            "completion to another"
        )
        cut_share = sum(cut) / len(cut) if cut else None
        self.say(explained(head, likely_causes(self.latest(), self.tokenizer, self.limit, cut_share)))
        self.found["no_signal_step"] = float(state.global_step)

    def at_start(self, scored: Scored) -> None:
        """Before the first step: the starting model's held-out samples, scored, with their totals."""
        if self.settings is not None and (line := flat_start(scored, self.tokenizer, self.limit)):
            add_note(self.logs_dir, line)
            self.found["no_signal_at_start"] = line

    def say(self, line: str) -> None:
        add_note(self.logs_dir, line)
        self.found["no_signal"] = line

    def metrics(self) -> dict[str, Any]:
        """What was said, for the stage's record: `no_signal_at_start`, `no_signal` and its step."""
        return dict(self.found)
