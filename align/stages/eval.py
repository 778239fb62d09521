"""Did alignment help? An eval stage trains nothing: it asks each named model the same held-out prompts,
scores every answer with the stage's `rewards:` (functions, reward models), runs any lm-evaluation-harness
tasks, and compares each model with the baseline.

The prompts are sharded over the stage's ranks (rank r asks rows r, r + N, ...), each rank holding one model
at a time; lm-eval tasks are spread by model (model i on rank i mod N). Rank 0 gathers everything and
computes the figures (align/measures/stats.py): per model and reward the mean over prompts with its 95%
bootstrap interval and n, and per model the win rate against the baseline on the same prompts, ties counted
half, with its interval. They go into the record's metrics (`eval/<model>/<reward>...`), and the whole
table, every answer and a few side-by-side samples into the stage's `eval/` folder, which `align report`
reads.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from align.data.loading import load_data
from align.measures.stats import mean_interval, win_rate
from align.records import EVAL_RESULTS, EvalResults, StageResult, write
from align.stages.context import StageContext, load_stage_model, on_training_device, stage_tokenizer
from align.stages.eval_answers import answers, shaped
from align.stages.rl import Rewards, stage_rewards
from align.stages.samples import shown

OUTPUT = "eval"
ANSWERS = "answers.jsonl"
SIDE_BY_SIDE = 8  # prompts shown with every model's answer
TOTAL = "total"  # the weighted sum, when a stage has more than one reward


def ranks() -> tuple[int, int]:
    """(this rank, how many), from the process group the workers started (1 rank without one)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def gathered(part: Any, world: int) -> list[Any]:
    """Every rank's `part`, in rank order."""
    if world == 1:
        return [part]
    parts: list[Any] = [None] * world
    torch.distributed.all_gather_object(parts, part)
    return parts


def run(ctx: StageContext) -> StageResult:
    """Ask, score, gather, compare; rank 0 writes eval/results.json and eval/answers.jsonl."""
    stage, where = ctx.plan.stage, ctx.plan.where
    rank, world = ranks()
    seed = stage.generation.seed if stage.generation.seed is not None else ctx.plan.seed
    rows = None
    if stage.data is not None:
        rows = load_data(stage.data.prompts, "prompts", f"{where}.data.prompts", stage.data.columns)
        if stage.data.max_rows:
            rows = rows.select(range(min(stage.data.max_rows, len(rows))))
    mine = list(range(rank, len(rows), world)) if rows is not None else []
    rewards = scorer(ctx) if stage.rewards else None
    part: dict[str, Any] = {"rows": mine, "answers": {}, "scores": {}, "lm_eval": {}}
    for index, (name, source) in enumerate(ctx.inputs.models.items()):
        harness_here = stage.lm_eval is not None and index % world == rank
        if not mine and not harness_here:
            continue
        model_ctx = ctx.with_model(source)
        model = on_training_device(ctx, load_stage_model(model_ctx, frozen=True)).eval()
        tokenizer = stage_tokenizer(model_ctx, padding_side="left")
        if mine:
            texts, values = ask(model, tokenizer, rows.select(mine), rewards, stage.generation, seed)
            part["answers"][name], part["scores"][name] = texts, values
        if harness_here:
            from align.stages.eval_harness import task_scores

            part["lm_eval"][name] = task_scores(model, tokenizer, stage.lm_eval, seed, where)
        del model
    parts = gathered(part, world)
    if rank != 0:
        return StageResult(output=OUTPUT)
    return conclude(ctx, rows, parts, rewards.names if rewards else [], seed)


def scorer(ctx: StageContext) -> Rewards:
    """The stage's rewards, any reward model on this rank's device."""
    rewards = stage_rewards(ctx)
    rewards.sources = [
        on_training_device(ctx, source) if isinstance(source, torch.nn.Module) else source
        for source in rewards.sources
    ]
    return rewards


def ask(
    model: Any, tokenizer: Any, rows: Any, rewards: Rewards, generation: Any, seed: int
) -> tuple[list[list[str]], dict[str, list[list[float]]]]:
    """One model's answers to `rows` (num_samples each) and each reward's score of each, per row."""
    count = generation.num_samples
    prompts = list(rows["prompt"])
    texts = answers(model, tokenizer, prompts, generation, seed)
    asked = [prompt for prompt in prompts for _ in range(count)]
    columns = {key: [v for v in rows[key] for _ in range(count)] for key in rows.column_names}
    columns.pop("prompt")
    completions = [shaped(prompt, text) for prompt, text in zip(asked, texts, strict=True)]
    values = rewards.score(asked, completions, columns)
    if len(values) > 1:
        values[TOTAL] = rewards.total(values)

    def by_row(found: list) -> list[list]:
        return [found[i : i + count] for i in range(0, len(found), count)]

    return by_row(texts), {key: by_row(found) for key, found in values.items()}


def conclude(ctx: StageContext, rows: Any, parts: list[Any], names: list[str], seed: int) -> StageResult:
    """Rank 0: every rank's answers in row order, the figures, and the files of the eval/ folder."""
    stage = ctx.plan.stage
    models, baseline = list(stage.models), stage.baseline_name
    order = [row for part in parts for row in part["rows"]]
    said = {name: [a for part in parts for a in part["answers"].get(name, [])] for name in models}
    reward_names = [*names, TOTAL] if len(names) > 1 else names
    scores = {  # model -> reward -> per row (mean over its samples), in `order`
        name: {
            reward: [sum(v) / len(v) for part in parts for v in part["scores"].get(name, {}).get(reward, [])]
            for reward in reward_names
        }
        for name in models
    }
    figures = figures_of(scores, baseline, seed)
    harness = {name: found for part in parts for name, found in part["lm_eval"].items()}
    folder = ctx.output_dir / OUTPUT
    folder.mkdir(parents=True, exist_ok=True)
    by_row = sorted(range(len(order)), key=order.__getitem__)
    samples = []
    with open(folder / ANSWERS, "w") as out:
        for position in by_row:
            row = rows[order[position]]
            line = {
                "row": order[position],
                "prompt": shown(row["prompt"]),
                "answers": {name: said[name][position] for name in models},
                "scores": {name: {r: scores[name][r][position] for r in reward_names} for name in models},
            }
            out.write(json.dumps(line) + "\n")
            if len(samples) < SIDE_BY_SIDE:
                samples.append({"prompt": line["prompt"], **{n: a[0] for n, a in line["answers"].items()}})
    results = EvalResults(
        baseline=baseline,
        models=models,
        rewards=reward_names,
        prompts=len(order),
        generation=stage.generation.model_dump(mode="json"),
        figures=figures,
        lm_eval=harness,
        samples=samples,
    )
    write(folder / EVAL_RESULTS, results)
    return StageResult(output=OUTPUT, metrics=flat_metrics(figures, harness))


def figures_of(scores: dict[str, dict[str, list[float]]], baseline: str, seed: int) -> dict[str, Any]:
    """Per model and reward: the mean with its interval and n; beside the baseline's, the win rate."""
    figures: dict[str, Any] = {}
    for name, by_reward in scores.items():
        figures[name] = {}
        for reward, values in by_reward.items():
            if not values:
                continue
            entry = mean_interval(values, seed=seed).as_dict()
            if name != baseline:
                entry["win"] = win_rate(values, scores[baseline][reward], seed=seed).as_dict()
            figures[name][reward] = entry
    return figures


def flat_metrics(figures: dict[str, Any], harness: dict[str, Any]) -> dict[str, float]:
    """The record's metrics: `eval/<model>/<reward>` (the mean), `/low`, `/high`, `/n`, `/win`, `/win_low`,
    `/win_high`; `lm_eval/<model>/<task>/<metric>` for the harness's."""
    metrics: dict[str, float] = {}
    for name, by_reward in figures.items():
        for reward, entry in by_reward.items():
            key = f"eval/{name}/{reward}"
            metrics.update({key: entry["mean"], f"{key}/low": entry["low"], f"{key}/high": entry["high"]})
            metrics[f"{key}/n"] = float(entry["n"])
            if "win" in entry:
                win = entry["win"]
                metrics.update({f"{key}/win": win["mean"], f"{key}/win_low": win["low"]})
                metrics[f"{key}/win_high"] = win["high"]
    for name, tasks in harness.items():
        for task, found in tasks.items():
            for metric, value in found.items():
                metrics[f"lm_eval/{name}/{task}/{metric.replace(',none', '')}"] = value
    return metrics
