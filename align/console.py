"""What align prints for people: the plan as a table, and a run's outcome per stage."""

from __future__ import annotations

from align.memory import format_bytes
from align.plan import Plan

SHOWN_METRICS = (
    "train_loss_first",
    "train_loss_last",
    "eval_loss_before",
    "eval_loss_after",
    "preference_accuracy_before",
    "preference_accuracy_after",
    "preference_margin_before",
    "preference_margin_after",
    "label_margin_before",
    "label_margin_after",
    "merge_max_abs_logit_delta",
    "pairwise_accuracy_before",
    "pairwise_accuracy_after",
    "reward_mean_before",
    "reward_mean_after",
    "train_kl_last",
)


def memory_table(stage) -> list[str]:
    """Per-rank bytes under each backend, the chosen one marked, host (offloaded) bytes in brackets."""
    options = stage.memory_by_backend
    if not options:
        return ["    memory: no estimate (architecture unknown until the model is present)"]
    chosen = next((name for name, value in options.items() if value is stage.memory), None)
    header = "    per rank        " + "".join(f"{('*' if n == chosen else '') + n:>20}" for n in options)
    lines = [header]
    for index, (label, *_rest) in enumerate(next(iter(options.values())).rows()):
        cells = []
        for estimate in options.values():
            _, device, host = estimate.rows()[index]
            cells.append(format_bytes(device) + (f" [{format_bytes(host)}]" if host else ""))
        lines.append(f"    {label:<16}" + "".join(f"{cell:>20}" for cell in cells))
    return lines


def format_plan(plan: Plan) -> str:
    """Stages in order with kind, model source, backend (and why), workers, placement and memory."""
    hardware = "GPU" if plan.hardware.accelerator else "CPU"
    lines = [
        f"pipeline {plan.pipeline.name}: {len(plan.order)} stages on {hardware}, "
        f"{format_bytes(plan.hardware.device_memory)} per device"
    ]
    for index, name in enumerate(plan.order, 1):
        stage = plan.stages[name]
        lines.append(
            f"{index}. {name}  kind={stage.kind}  model={stage.model_source}  backend={stage.backend}  "
            f"workers={stage.workers}  precision={stage.precision}"
        )
        lines.append(f"    why {stage.backend}: {stage.backend_reason}")
        lines += [f"    {role}: {where}" for role, where in stage.placement.description.items()]
        lines += memory_table(stage)
    return "\n".join(lines)


def format_outcomes(outcomes) -> str:
    """One line per stage: ran or skipped, time, and the metrics that say whether it worked."""
    lines = ["summary:"]
    for outcome in outcomes:
        shown = ", ".join(
            f"{key}={outcome.metrics[key]:.4g}" for key in SHOWN_METRICS if key in outcome.metrics
        )
        lines.append(f"  {outcome.stage:<10} {outcome.status:<8} {outcome.seconds:7.1f}s  {shown}")
    return "\n".join(lines)
