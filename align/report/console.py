"""What align prints for people: the plan as a table, and a run's outcome per stage."""

from __future__ import annotations

import shutil
import threading
import time

from align.config.data_settings import DataSpec
from align.config.eval_settings import EvalDataSpec
from align.data.lengths import lengths_path, recalled
from align.data.loading import HELD_OUT_ROWS, HELD_OUT_SHARE, NO_EVAL
from align.data.scan import data_shape, scan_notes
from align.data.sources import plan_lines as source_lines
from align.models.chat_templates import plan_lines
from align.models.memory import format_bytes
from align.models.precision import PURE, PURE_RISK, describe
from align.planning.host import host_share
from align.planning.losses import carries_loss
from align.planning.model_sizes import root_model
from align.planning.plan import Plan, StagePlan
from align.records import Progress
from align.report.eval_tables import format_eval
from align.run.package import Package

SHOWN_METRICS = (
    "train_loss_first",
    "train_loss_last",
    "eval_loss_before",
    "eval_loss_after",
    "preference_accuracy_before",
    "preference_accuracy_after",
    "preference_margin_before",
    "preference_margin_after",
    "dpo_reward_accuracy_before",
    "dpo_reward_ties_before",  # 1: policy equals reference, every pair tied (counted half)
    "dpo_reward_accuracy_after",
    "dpo_reward_margin_after",
    "label_margin_before",
    "label_margin_after",
    "merge_max_abs_logit_delta",
    "pairwise_accuracy_before",
    "pairwise_accuracy_after",
    "reward_mean_before",
    "reward_mean_after",
    "train_kl_last",
    "teacher_jsd_before",  # a distill stage: the student's divergence to its teacher, held out
    "teacher_jsd_after",
    "teacher_agreement_before",  # ... and the share of the teacher's greedy tokens it also picks
    "teacher_agreement_after",
)
SAID_METRICS = ("no_signal_at_start", "no_signal")
"""Lines a stage said while it ran (an RL stage with nothing to learn from), repeated under its summary."""


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


def held_out_source(stage) -> str | None:
    """What a training stage measures before and after training, in words."""
    data = stage.data
    if data is None:
        return None
    if isinstance(data, EvalDataSpec):  # an eval stage's
        return f"the prompts {data.prompts}, asked of each model"
    if data.eval == NO_EVAL:
        return "nothing (eval: none)"
    if data.eval is None:
        rows, each = ("each source's rows", " each") if data.is_mixture else ("the training rows", "")
        measured = f"; the first {data.max_eval_rows} measured" if data.max_eval_rows else ""
        return (
            f"a seeded {HELD_OUT_SHARE:.0%} of {rows} (at most {HELD_OUT_ROWS}{each}), kept out of "
            f"training (no eval split given){measured}"
        )
    return f"the eval split {data.eval}"


def data_lines(stage: StagePlan) -> list[str]:
    """What is done to a stage's rows before training (align/data/shapes.py); for a mixture, how its sources
    are mixed and each one's rows and share (align/data/sources.py)."""
    data = stage.data
    noted = scan_notes(data, stage.data_kind) if isinstance(data, DataSpec) else []
    notes = [f"data: {note}" for note in noted]
    if isinstance(data, DataSpec) and data.is_mixture:
        return source_lines(data, stage.data_kind) + notes
    rows = data.prompts if isinstance(data, EvalDataSpec) else data.train if data else None
    shape = None if data is None else data_shape(rows, data.columns)
    return ([] if shape is None else [f"data: {shape}"]) + notes


def precision_as_run(stage: StagePlan) -> str:
    """The precision with where the weights and Adam's moments live, e.g. `bf16 (mixed: fp32 weights ...)`."""
    return describe(stage.precision, stage.trainable_dtype, stage.lora is not None)


def sweep_lines(plan: Plan) -> list[str]:
    """What a sweep runs: its variants (or how they are drawn), what each repeats, what runs once."""
    sweep, spec = plan.pipeline.sweep, plan.pipeline.sweep.spec
    swept = ", ".join(path.removeprefix(f"stages.{sweep.stage}.") for path in spec.parameters)
    if sweep.grid is not None:
        drawn = f"{len(sweep.grid)} variants of {sweep.stage} (a grid over {swept})"
    else:
        seed = spec.seed if spec.seed is not None else plan.pipeline.defaults.seed
        how = f"{spec.method} over {swept}, seed {seed}"
        drawn = f"{spec.samples} variants of {sweep.stage} drawn by Ray Tune ({how})"
    once = [name for name in plan.order if "[" not in name and name not in (*sweep.repeated, *sweep.evals)]
    lines = [
        f"sweep: {drawn}, ranked by {spec.metric} ({spec.mode})",
        f"  each variant runs {', '.join(sweep.repeated)}; once for all: {', '.join(once) or 'nothing'}",
    ]
    if sweep.evals:
        lines.append(f"  compared by {', '.join(sweep.evals)}: a row per variant")
    if spec.early_stop is not None:
        early = spec.early_stop
        lines.append(
            f"  early stop (ASHA): from step {early.grace_steps}, a variant not in the best "
            f"1/{early.reduction_factor:g} by {early.metric} ({early.mode}) stops"
        )
    if sweep.grid is None:
        lines.append(f"  below: {sweep.stage} as written; each variant sets {swept}")
    return lines


def format_plan(plan: Plan) -> str:
    """Stages in order with kind, model source, backend (and why), workers, placement and memory."""
    memory = format_bytes(plan.hardware.device_memory)
    where = f"GPU, {memory} per device" if plan.hardware.accelerator else f"CPU, {memory} of host memory"
    lines = [f"pipeline {plan.pipeline.name}: {len(plan.order)} stages on {where}"]
    if plan.pipeline.sweep is not None:
        lines += sweep_lines(plan)
    for index, name in enumerate(plan.order, 1):
        stage = plan.stages[name]
        lines.append(
            f"{index}. {name}  kind={stage.kind}  model={stage.model_source}  backend={stage.backend}  "
            f"workers={stage.workers}  precision={precision_as_run(stage)}"
        )
        lines.append(f"    why {stage.backend}: {stage.backend_reason}")
        if (held_out := held_out_source(stage)) is not None:
            lines.append(f"    held out: {held_out}")
        lines += [f"    {line}" for line in data_lines(stage)]
        if stage.batching is not None:
            lines.append(f"    batching: {stage.batching[0]} ({stage.batching[1]})")
        if (counts := recalled(lengths_path(stage))) is not None:
            lines += [f"    rows: {line}" for line in counts.lines()]
        if stage.lora_targets is not None:
            lines.append(f"    lora targets: {stage.lora_targets.summary}")
        if stage.data is not None or stage.chat_template is not None:
            lines += [f"    {line}" for line in plan_lines(stage.chat_template, stage.model_source)]
        if stage.lm_head is not None:
            lines.append(f"    lm head: {stage.lm_head.summary}")
        if stage.loss is not None:
            lines.append(f"    loss: {stage.loss}")
        carried = carries_loss(stage.stage, stage.chat_template, root_model(plan.pipeline, name))
        if carried is not None:
            lines.append(f"    carries loss: {carried}")
        if stage.resources is not None:
            lines.append(f"    resources: {stage.resources.describe()}")
        if stage.precision == PURE:
            lines.append(f"    risk: {PURE_RISK}")
        lines += [f"    {role}: {where}" for role, where in stage.placement.description.items()]
        lines += memory_table(stage)
        if (share := host_share(stage, plan.hardware.accelerator)) is not None and share.total:
            lines.append(f"    host memory: {share.describe(plan.hardware.host)}")
    return "\n".join(lines)


def format_outcomes(outcomes) -> str:
    """One line per stage: ran or skipped, time, and the metrics that say whether it worked."""
    lines = ["summary:"]
    width = max([10, *(len(outcome.stage) for outcome in outcomes)])
    for outcome in outcomes:
        shown = ", ".join(
            f"{key}={outcome.metrics[key]:.4g}" for key in SHOWN_METRICS if key in outcome.metrics
        )
        lines.append(f"  {outcome.stage:<{width}} {outcome.status:<8} {outcome.seconds:7.1f}s  {shown}")
        lines += time_line(outcome.metrics)
        lines += [f"    {outcome.metrics[key]}" for key in SAID_METRICS if key in outcome.metrics]
        lines += format_eval(outcome.metrics)  # an eval stage's table; nothing for the others
    return "\n".join(lines)


def time_line(metrics: dict) -> list[str]:
    """Where a trained stage's time went: its train loop (and steady step), then what align did around it
    (training/PhaseClock): `    time: train 61.2s (7.4s/step), prepare 14.0s, held-out 9.1s, ...`."""
    if "time_train_s" not in metrics:
        return []
    step = metrics.get("seconds_per_step_steady")
    parts = [f"train {metrics['time_train_s']:.1f}s" + (f" ({step:.2g}s/step)" if step else "")]
    for name, keys in TIMED_PARTS:
        seconds = sum(metrics.get(key, 0.0) for key in keys)
        if seconds >= 0.05:
            parts.append(f"{name} {seconds:.1f}s")
    return [f"    time: {', '.join(parts)}"]


TIMED_PARTS = (
    ("prepare", ("time_prepare_s",)),
    ("held-out", ("time_measure_before_s", "time_measure_after_s")),
    ("samples", ("time_samples_before_s", "time_samples_after_s")),
    ("save", ("time_save_s",)),
)
"""What align does around a stage's train loop, as its summary's time line names it."""


def format_progress(stage: str, entry: Progress) -> str:
    """`[sft] step 40/120 (33%)  loss 4.013  2.31 it/s  ETA 0:00:35` from a stage's progress file."""
    return f"[{stage}] {progress_text(entry)}"


def progress_text(entry: Progress) -> str:
    """`step 40/120 (33%)  loss 4.013  2.31 it/s  ETA 0:00:35`: the progress line, and `align status`;
    before the first step, what the stage is doing and for how long (`loading the data, 0:01:10`)."""
    if not entry.training:
        return f"{entry.phase}, {duration(time.time() - entry.started)}"
    step, total, first = entry.step, entry.max_steps or 0, entry.first_step
    parts = [f"step {step}/{total}" + (f" ({100 * step // total}%)" if total else "")]
    if entry.value:
        name, value = entry.value
        parts.append(f"{name} {value:.4g}")
    elapsed = entry.time - entry.started
    if step > first and elapsed > 0:
        rate = (step - first) / elapsed
        parts.append(f"{rate:.3g} it/s")
        if total > step:
            parts.append(f"ETA {duration((total - step) / rate)}")
    return "  ".join(parts)


def duration(seconds: float) -> str:
    """`0:01:10`: hours, minutes and seconds."""
    whole = max(0, int(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


class ProgressLine:
    """One live progress line per running stage: redrawn in place on a terminal (stages running side by
    side get one line each, below the run's other lines), and printed at every tenth of the stage
    otherwise (a log file or CI gets ten lines, not one per step). Stages call it from their threads."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.live = stream.isatty()
        self.lines: dict[str, str] = {}  # the drawn block, one line per running stage
        self.tenths: dict[str, int] = {}
        self.phases: dict[str, str] = {}  # the phase last printed per stage, off a terminal
        self.notes: dict[str, int] = {}  # how many of each stage's notes are printed
        self.lock = threading.RLock()  # a signal may land in the main thread while it draws

    def update(self, stage: str, entry: Progress) -> None:
        line = format_progress(stage, entry)
        with self.lock:
            for note in entry.notes[self.notes.get(stage, 0) :]:  # each once, as it comes
                self.event(f"[{stage}] {note}")
            self.notes[stage] = len(entry.notes)
            if self.live:
                self.erase()
                self.lines[stage] = line[: shutil.get_terminal_size().columns - 1]  # one row each
                self.draw()
            elif not entry.training:  # once per phase, without a clock that would always read 0
                if self.phases.get(stage) != entry.phase:
                    self.phases[stage] = entry.phase
                    self.stream.write(f"[{stage}] {entry.phase}\n")
            else:
                total = entry.max_steps or 0
                tenth = 10 * entry.step // total if total else 0
                if tenth > self.tenths.get(stage, 0):
                    self.tenths[stage] = tenth
                    self.stream.write(line + "\n")
            self.stream.flush()

    def event(self, line: str) -> None:
        """A line from the run (a stage starting, ending, retrying), above the progress lines."""
        with self.lock:
            self.erase()
            self.stream.write(line + "\n")
            self.draw()
            self.stream.flush()

    def ended(self, stage: str) -> None:
        """A stage ended (done, failed, stopped early): its progress line goes with it."""
        with self.lock:
            if stage in self.lines:
                self.erase()
                del self.lines[stage]
                self.draw()
                self.stream.flush()

    def end(self) -> None:
        """Leave the last progress lines on screen, and what follows below them."""
        with self.lock:
            self.lines.clear()

    def erase(self) -> None:
        if self.lines:
            self.stream.write(f"\033[{len(self.lines)}F\033[J")  # up to the block's first line, clear below

    def draw(self) -> None:
        for line in self.lines.values():
            self.stream.write(line + "\n")


def format_package(package: Package) -> str:
    """What travels with a submitted job, and what must already be on storage the cluster's nodes see."""
    lines = [f"sent with the job: {package.pipeline_file}"]
    lines += [f"  {name} ({format_bytes(size)})" for name, size in package.packed]
    if package.shared:
        lines.append("not sent: these must exist at the same path on every node of the cluster:")
        lines += [f"  {where}: {path} ({why})" for where, path, why in package.shared]
    return "\n".join(lines)
