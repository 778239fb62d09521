"""An eval stage's figures (`eval/results.json`): every model's score on every reward with its interval,
win rates beside the baseline, the harness's scores, and a few prompts with each model's first answer.
The eval stage writes it; `align report` reads its side-by-side samples."""

from __future__ import annotations

from typing import Any

from align.records.versioned import Record

EVAL_RESULTS = "results.json"


class EvalResults(Record):
    baseline: str
    models: list[str]
    rewards: list[str]
    prompts: int
    generation: dict[str, Any]
    figures: dict[str, Any]
    lm_eval: dict[str, Any] = {}
    samples: list[dict[str, str]] = []  # a prompt, and each model's first answer by name
