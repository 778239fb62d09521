"""lm-evaluation-harness tasks on a model already loaded by an eval stage: `lm_eval: {tasks, include_path,
limit}`. The model object is handed to lm-eval's HF wrapper (`HFLM(pretrained=model)`), which then runs as
one process; an eval stage spreads its models over its ranks instead (align/stages/eval.py)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from align.config.eval_settings import LmEvalSpec
from align.errors import ConfigError
from align.pipeline.eval_checks import lm_eval_problem

SKIPPED = ("alias", "sample_len", "samples")


@contextmanager
def single_process() -> Iterator[None]:
    """lm-eval returns its results only where LOCAL_RANK is 0 (it reads a launcher's rank from there), but
    here each rank runs its own models alone: every rank is rank 0 to lm-eval while it runs."""
    saved = os.environ.get("LOCAL_RANK")
    os.environ["LOCAL_RANK"] = "0"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("LOCAL_RANK")
        else:
            os.environ["LOCAL_RANK"] = saved


def task_scores(model: Any, tokenizer: Any, spec: LmEvalSpec, seed: int, where: str) -> dict[str, dict]:
    """Each task's metrics for `model`, as lm-eval aggregates them: {task: {"exact_match,none": 0.75, ...}}
    (stderr entries included). A task lm-eval cannot find is refused naming `lm_eval.tasks`."""
    import lm_eval
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    tokenizer.padding_side = "left"
    manager = TaskManager(include_path=spec.include_path, include_defaults=spec.include_path is None)
    if (problem := lm_eval_problem(spec, where, manager)) is not None:
        raise ConfigError([problem])
    harness_model = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=8)
    with single_process():
        results = lm_eval.simple_evaluate(
            model=harness_model,
            tasks=list(spec.tasks),
            limit=spec.limit,
            num_fewshot=spec.num_fewshot,
            task_manager=manager,
            apply_chat_template=spec.apply_chat_template and tokenizer.chat_template is not None,
            log_samples=False,
            random_seed=seed,
            numpy_random_seed=seed,
            torch_random_seed=seed,
            fewshot_random_seed=seed,
        )
    return {
        task: {
            name: float(value)
            for name, value in metrics.items()
            if name not in SKIPPED and isinstance(value, (int, float))
        }
        for task, metrics in results["results"].items()
    }
