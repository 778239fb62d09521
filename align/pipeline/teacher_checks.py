"""A distill stage's teacher, checked at validate: it names a causal LM, runs beside the student, and shares
the student's vocabulary, since distillation compares the two next-token distributions token by token.

A model's vocabulary is its tokenizer's: a stage's output has its root model's tokenizer plus the special
tokens of each chat template applied along its chain of stages. Two chains from one root with the same
templates share it without reading a file; otherwise both tokenizers are read (tokenizer files and
config.json, never the weights).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from align.cache import is_dir
from align.config.spec import DistillStage, Pipeline
from align.errors import Problem
from align.models.loading import BUILTIN_MODELS, model_problem, resolve_model
from align.pipeline.graph import reference_target

NOT_A_CAUSAL_LM = ("reward", "eval")
"""Stage kinds whose output is not a model that generates: a reward stage's is a classifier, an eval
stage's a report."""
ACTOR_TRANSFER = (
    "from an actor, the teacher's full-vocabulary logits at every token of every rollout would cross Ray's "
    "object store: one rollout of 8 x 256 tokens of SmolLM2's 49,152-token vocabulary is 403 MB of fp32 "
    "logits, which took 1.6 s to move alone (bench/results/distill-transfer-cpu.md), where beside the "
    "student nothing moves"
)


@dataclass(frozen=True)
class Lineage:
    """Where a model's tokenizer comes from: its root model and the chat templates applied after it."""

    root: str
    templates: tuple[str, ...]

    def describe(self) -> str:
        added = f" with chat_template {', '.join(self.templates)}" if self.templates else ""
        return f"{self.root}{added}"


def lineage(pipeline: Pipeline, value: str, own_template: str | None = None) -> Lineage:
    """The lineage of a model value: a stage's output is its chain's root with every template applied along
    the chain; `own_template` is applied last (the distill stage's own, on the student's tokenizer)."""
    templates, seen = [], set()
    while (target := reference_target(value)) in pipeline.stages and target not in seen:
        seen.add(target)
        templates.append(pipeline.stage_chat_template(target))
        value = pipeline.stage_model(target)
    applied = [*reversed(templates), own_template]
    return Lineage(value, tuple(dict.fromkeys(template for template in applied if template)))


def tokenizer_folder(root: str) -> str | None:
    """The folder holding a root model's tokenizer: a local folder, a builtin (built once, as the run would),
    or a hub id cached here; None when it cannot be read without a download."""
    if root in BUILTIN_MODELS:
        return resolve_model(root)
    if is_dir(Path(root)):
        return root
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(root, "tokenizer_config.json")
    return str(Path(found).parent) if isinstance(found, str) else None


def vocabulary(found: Lineage) -> tuple[dict[str, int], int] | None:
    """A lineage's tokens (token -> id, as the stage's tokenizer holds them) and its embedding rows (the
    larger of config.json's vocab_size and the tokenizer's length); None where the tokenizer is not here."""
    from align.models.chat_templates import apply, resolve_template
    from align.models.loading import load_tokenizer

    folder = tokenizer_folder(found.root)
    if folder is None:
        return None
    tokenizer = load_tokenizer(folder)
    for template in found.templates:
        apply(resolve_template(template), tokenizer)
    return tokenizer.get_vocab(), max(len(tokenizer), config_vocab_size(Path(folder)))


def config_vocab_size(folder: Path) -> int:
    try:
        config: dict[str, Any] = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    text = config.get("text_config") or config
    return int(text.get("vocab_size") or 0)


def vocabulary_problem(student: Lineage, teacher: Lineage) -> str | None:
    """Why the two lineages' vocabularies differ, naming both tokenizers; None when they match (or when one
    cannot be read here: TRL compares the models' vocab sizes when the stage starts)."""
    if student == teacher:
        return None
    try:
        ours, theirs = vocabulary(student), vocabulary(teacher)
    except (OSError, ValueError) as err:
        return f"cannot read a tokenizer to compare the vocabularies: {err}"
    if ours is None or theirs is None or ours == theirs:
        return None
    (own_tokens, own_rows), (their_tokens, their_rows) = ours, theirs
    differing = sorted(set(own_tokens.items()) ^ set(their_tokens.items()), key=lambda pair: pair[1])
    example = f"; e.g. token {differing[0][0]!r} (id {differing[0][1]}) is in one only" if differing else ""
    return (
        f"the teacher's tokenizer ({teacher.describe()}: {len(their_tokens):,} tokens, {their_rows:,} "
        f"embedding rows) differs from the student's ({student.describe()}: {len(own_tokens):,} tokens, "
        f"{own_rows:,} rows){example}. Distillation compares the two next-token distributions token by "
        "token, so they must share one vocabulary: distil from a teacher of the student's family, with the "
        "same chat template"
    )


def teacher_source_problem(pipeline: Pipeline, value: str) -> str | None:
    """Why a teacher value names no model that generates (None when it does)."""
    target = reference_target(value)
    if target is None:
        no_code = pipeline.allow_custom_code
        return None if "${" in value else model_problem(value, allow_custom_code=no_code)
    source = pipeline.stages.get(target)  # an unknown stage is reported by the reference check
    if source is not None and source.kind in NOT_A_CAUSAL_LM:
        return (
            f"refers to stage '{target}', a {source.kind} stage, whose output is not a language model; "
            "a teacher is a model that generates (an sft, dpo, grpo, distill or merge stage's output, a "
            "folder, a builtin or a hub id)"
        )
    return None


def teacher_problems(pipeline: Pipeline) -> list[Problem]:
    """Every distill stage's teacher: a model, not in an actor, with the student's vocabulary."""
    problems = []
    for name, stage in pipeline.stages.items():
        if not isinstance(stage, DistillStage):
            continue
        where = f"stages.{name}.teacher"
        if stage.teacher.as_actor:
            problems.append(
                Problem(
                    f"{where}.placement",
                    f"a teacher runs beside the student on every rank: {ACTOR_TRANSFER}; remove "
                    "`placement`, and shard a teacher too big for one rank with `backend: fsdp`",
                )
            )
        if (message := teacher_source_problem(pipeline, stage.teacher.model)) is not None:
            problems.append(Problem(f"{where}.model", message))
            continue
        own = pipeline.stage_chat_template(name)
        student = lineage(pipeline, pipeline.stage_model(name), own)
        if (message := vocabulary_problem(student, lineage(pipeline, stage.teacher.model))) is not None:
            problems.append(Problem(where, message))
    return problems
