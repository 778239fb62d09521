"""`align data`: a stage's rows exactly as its trainer will see them, with the tokens that carry loss marked,
and what `max_length` does to the whole file.

The rows are the trainer's own preparation (align/stages/prepared.py: TRL's `_prepare_dataset` with the
stage's tokenizer, template and config), decoded token by token: nothing here renders a template itself, so
the preview cannot disagree with training. Loss-bearing tokens are green on a terminal and `[[...]]` in
plain text; the tokens `max_length` cuts are left out and counted.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from align.data.lengths import IGNORED, LengthReport, lengths_path, remember
from align.errors import AlignError, ConfigError, Problem
from align.models.loading import resolve_model
from align.pipeline.graph import reference_target
from align.planning.launch import Launch, launch_of
from align.planning.plan import ModelInput, Plan, StageInputs, StagePlan, root_model
from align.run.inputs import resolve_inputs
from align.run.records import stage_dir

MARKS = {False: ("[[", "]]"), True: ("\033[1;32m", "\033[0m")}
"""How loss-bearing tokens are set apart: in plain text, and on a terminal (bold green)."""
PROMPT_KINDS = ("grpo", "rloo", "ppo")


@dataclass
class Preview:
    stage: StagePlan
    notes: list[str]  # how the tokenizer was found when an upstream stage has not run; what trains
    rows: list[str]  # each row rendered, several lines each
    report: LengthReport | None
    total: int
    problem: str | None = None  # the stage would stop here before training (too many rows lost to the cut)
    marks: tuple[str, str] = MARKS[False]


def default_stage(plan: Plan) -> str:
    """The first stage that reads training rows."""
    named = [name for name in plan.order if previewable(plan.stages[name])]
    if not named:
        raise ConfigError([Problem("stages", "no stage of this pipeline reads training rows (`data.train`)")])
    return named[0]


def previewable(stage: StagePlan) -> bool:
    from align.stages.prepared import TRAINERS

    return stage.kind in TRAINERS or stage.kind in PROMPT_KINDS


def with_inputs(plan: Plan, name: str) -> tuple[Launch, str | None]:
    """The stage launched with its inputs resolved as a run would; when a stage it reads has not run, the
    root model with the nearest chat template along the chain (what that stage saves beside its output)."""
    stage = plan.stages[name]
    pipeline = plan.pipeline
    folders = {other: stage_dir(pipeline.defaults.output_root, pipeline.name, other) for other in plan.stages}
    try:
        return launch_of(stage, resolve_inputs(stage, folders)), None
    except AlignError:
        pass
    chain, value = [], stage.model_source
    while (target := reference_target(value)) in plan.stages:
        chain.append(target)
        value = plan.stages[target].model_source
    template = next(
        (plan.stages[step].chat_template for step in [name, *chain] if plan.stages[step].chat_template), None
    )
    base = root_model(pipeline, name)
    inputs = StageInputs(ModelInput(resolve_model(base, f"stages.{name}.model")))
    note = f"{chain[0]} has not run: the rows are shown with {base}'s tokenizer" + (
        f" and the chat template {template.source}" if template else ""
    )
    return launch_of(replace(stage, chat_template=template), inputs), note


def chosen_stage(plan: Plan, name: str | None) -> str:
    """The stage `--stage` names, refused with the ones that can be shown; by default the first."""
    name = name or default_stage(plan)
    if name not in plan.stages:
        raise ConfigError([Problem("--stage", f"no stage {name!r}; the stages are: {', '.join(plan.order)}")])
    if not previewable(plan.stages[name]):
        readers = [other for other in plan.order if previewable(plan.stages[other])]
        kind = plan.stages[name].kind
        problem = f"a {kind} stage reads no training rows; stages that do: {', '.join(readers) or 'none'}"
        raise ConfigError([Problem(f"stages.{name}", problem)])
    return name


def preview(plan: Plan, name: str | None, count: int | None, colour: bool) -> Preview:
    """The first `count` training rows of stage `name` (None: every row) as its trainer sees them, and the
    counts over all of them (kept for `align plan`)."""
    from align.data.mixtures import stage_rows
    from align.stages.context import StageContext, explicit_prompt, stage_config, stage_tokenizer
    from align.stages.preamble import data_processes
    from align.stages.prepared import counted_lengths, cut, decided_loss, lost_rows_problem, prepare

    name = chosen_stage(plan, name)
    launch, note = with_inputs(plan, name)
    stage, notes = launch.plan, [note] if note else []
    with tempfile.TemporaryDirectory(prefix="align-data-") as scratch:
        ctx = StageContext(stage, Path(scratch), launch=launch)
        found = stage_rows(stage.stage.data, stage.data_kind, stage.seed, stage.where)
        side = "left" if stage.kind in ("dpo", *PROMPT_KINDS) else "right"
        tokenizer = stage_tokenizer(ctx, padding_side=side)
        scope = decided_loss(ctx, tokenizer, found.train)
        loss = {"assistant_only_loss": scope.assistant_only} if scope is not None else {}
        # a large file is prepared in several processes, as the stage's rank prepares it
        config = stage_config(ctx, {**data_processes(ctx, len(found.train)), **loss})
    train = explicit_prompt(found.train)
    if stage.kind == "kto":  # unpaired as the runner unpairs it: each pair is two rows
        from align.stages.kto import prompted, unpaired

        train = unpaired(prompted(train, f"{stage.where}.data.train"))
    shown = range(len(train) if count is None else min(count, len(train)))
    sources = found.sources if stage.stage.data.is_mixture and len(found.sources) == len(train) else None
    labels = [f"row {index}" + (f" from {sources[index]}" if sources else "") for index in shown]
    if stage.kind in PROMPT_KINDS:
        rows = [render_prompt(label, train[i], tokenizer) for label, i in zip(labels, shown, strict=True)]
        return Preview(stage, notes, rows, None, len(train))
    report = counted_lengths(ctx, train, tokenizer, config)
    remember(lengths_path(plan.stages[name]), report)  # under the plan's own key, which `align plan` reads
    prepared = prepare(stage.kind, train, tokenizer, config)
    if scope is not None:
        notes.append(f"loss: {scope.words}")
    refused = f"{stage.where}.data.train: {scope.problem}" if scope is not None and scope.problem else None
    marks = MARKS[colour]
    rows = [
        render(stage.kind, label, prepared[i], tokenizer, cut(config), marks)
        for label, i in zip(labels, shown, strict=True)
    ]
    problem = refused or lost_rows_problem(stage, report)
    return Preview(stage, notes, rows, report, len(train), problem, marks)


def decoded(tokenizer: Any, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def marked(tokenizer: Any, ids: list[int], bearing: list[bool], marks: tuple[str, str]) -> str:
    """The tokens decoded run by run, each run of loss-bearing tokens between `marks`."""
    pieces, start = [], 0
    for end in range(1, len(ids) + 1):
        if end == len(ids) or bearing[end] != bearing[start]:
            text = decoded(tokenizer, ids[start:end])
            if bearing[start]:  # a newline the template ends a turn with closes after the mark
                body = text.rstrip("\n")
                text = f"{marks[0]}{body}{marks[1]}{text[len(body) :]}"
            pieces.append(text)
            start = end
    return "".join(pieces)


def cut_note(length: int, limit: int | None) -> str:
    return (
        f"\n  (cut: {length - limit:,} tokens past max_length {limit:,} not trained on)"
        if limit and length > limit
        else ""
    )


def render(
    kind: str,
    label: str,
    row: dict[str, Any],
    tokenizer: Any,
    limits: tuple[int | None, str],
    marks: tuple[str, str],
) -> str:
    """One prepared row as the trainer sees it, after the cut (`limits`: max_length and the end it keeps)."""
    limit, mode = limits
    if kind == "sft":
        ids, labels = row["input_ids"], row["labels"]
        kept = slice(-limit, None) if limit and mode == "keep_end" else slice(None, limit)
        bearing = [label != IGNORED for label in labels[kept]]
        header = f"{label}: {len(ids):,} tokens, {sum(bearing):,} loss-bearing"
        return (
            f"{header}\n{indented(marked(tokenizer, ids[kept], bearing, marks))}{cut_note(len(ids), limit)}"
        )
    if kind == "reward":
        parts = [f"{label}: scored at the last token of each"]
        for side in ("chosen", "rejected"):
            ids = row[f"{side}_ids"]
            dropped = " (dropped: longer than max_length)" if limit and len(ids) > limit else ""
            parts.append(f"  {side} ({len(ids):,} tokens){dropped}:\n{indented(decoded(tokenizer, ids), 4)}")
        return "\n".join(parts)
    prompt = row["prompt_ids"]
    sides = ("chosen", "rejected") if kind == "dpo" else ("completion",)
    verdict = f", label {'desirable' if row['label'] else 'undesirable'}" if kind == "kto" else ""
    parts = [
        f"{label}{verdict}:",
        f"  prompt ({len(prompt):,} tokens):\n{indented(decoded(tokenizer, prompt[:limit]), 4)}",
    ]
    for side in sides:
        ids = row[f"{side}_ids"]
        room = None if limit is None else max(0, limit - len(prompt))
        text = (
            marked(tokenizer, ids[:room], [True] * len(ids[:room]), marks) if ids[:room] else "(nothing left)"
        )
        parts.append(
            f"  {side} ({len(ids):,} tokens):\n{indented(text, 4)}{cut_note(len(prompt) + len(ids), limit)}"
        )
    return "\n".join(parts)


def render_prompt(label: str, row: dict[str, Any], tokenizer: Any) -> str:
    """A prompt as an RL trainer renders it for generation (TRL's `maybe_apply_chat_template`): the
    completions it samples carry the loss, the prompt none."""
    from trl.data_utils import maybe_apply_chat_template

    text = maybe_apply_chat_template({"prompt": row["prompt"]}, tokenizer)["prompt"]
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    header = f"{label}: prompt of {len(ids):,} tokens (the sampled completions carry the loss)"
    return f"{header}\n{indented(text)}"


def indented(text: str, by: int = 2) -> str:
    return "\n".join((" " * by + line).rstrip() for line in text.rstrip("\n").split("\n"))


def format_preview(found: Preview) -> str:
    """The rows, then the counts over the file."""
    stage = found.stage
    lines = [
        f"stage {stage.name} ({stage.kind}): {len(found.rows):,} of {found.total:,} training rows, "
        "as its trainer sees them"
    ]
    lines += [f"note: {note}" for note in found.notes]
    if stage.kind not in PROMPT_KINDS:
        lines.append(f"loss-bearing tokens are marked {found.marks[0]}like this{found.marks[1]}")
    lines += ["", *("\n".join([row, ""]) for row in found.rows)]
    if found.report is not None:
        lines += ["over the whole file:", *(f"  {line}" for line in found.report.lines())]
    if found.problem:
        lines.append(f"this stage would stop before training: {found.problem}")
    return "\n".join(lines)
