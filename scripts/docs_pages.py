"""The generated reference pages as Markdown: the configuration reference (from scripts/docs_config.py's
sections), the stage kinds' table, and the CLI reference (from `align.cli.parser()`)."""

from __future__ import annotations

import argparse
import importlib.metadata
import textwrap

from align.backends import BACKENDS
from align.cli import EXIT_USER_ERROR, parser
from align.config.spec import KINDS
from align.data.corpora import BUILTIN_DATA, TOY_DATA
from align.models.chat_templates import BUILTIN as CHAT_TEMPLATES
from align.models.loading import BUILTIN_MODELS
from align.pipeline.checks import IGNORED_BY_TRL
from align.pipeline.trl_args import OWNED_BY_ALIGN
from align.rewards import SHIPPED
from scripts.docs_config import (
    Section,
    data_forms,
    guide,
    ppo_config_rows,
    reference_sections,
    trainer,
    trl_link,
)
from scripts.docs_fields import notes, sentence

GENERATED = (
    "Generated from the code when the site is built, so it cannot drift: edit {source}, not this page."
)


def cell(text: str) -> str:
    """A table cell: pipes escaped, never empty."""
    return text.replace("|", "\\|") or " "


def table(header: tuple[str, ...], body: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(cell(item) for item in row) + " |" for row in body]


def first_sentence(text: str | None) -> str:
    flat = " ".join((text or "").split())
    return flat.split(". ")[0].rstrip(".") + "." if flat else ""


def section_lines(found: Section) -> list[str]:
    level = "##" if found.anchor in ("the-pipeline-file", "every-stage", "every-training-stage") else "###"
    lines = [f"{level} {found.title} {{#{found.anchor}}}", "", *(f"{line}\n" for line in found.intro)]
    keys = [(f"`{key}`", *rest) for key, *rest in found.rows]
    return lines + table(("key", "type", "allowed", "default", "description"), keys) + [""]


def trl_lines() -> list[str]:
    """What the `trl:` block is, the keys align keeps, those it refuses per kind, and PPO's own keys."""
    lines = [
        "## The `trl:` block {#the-trl-block}",
        "",
        "A training stage's `trl:` block is passed to its trainer's config class, so every key that class "
        "takes works, with TRL's own defaults and checks. `align validate` checks each key's name and type "
        "against the class first, then builds it once so that TRL's own checks run, and names the key "
        "(`stages.dpo.trl.beta`) in any error.",
        "",
    ]
    kinds = [(f"`{name}`", trl_link(kind.config)) for name, kind in KINDS.items() if kind.config]
    kinds = [
        (name, "align's own [`PPOConfig`](#ppo-trl)" if "align." in config else config)
        for name, config in kinds
    ]
    lines += table(("kind", "config class"), kinds) + ["", "### Keys align sets {#keys-align-sets}", ""]
    lines += ["These are refused in `trl:`, with where to set them instead.", ""]
    lines += table(("key", "set instead"), [(f"`{k}`", why) for k, why in OWNED_BY_ALIGN.items()]) + [""]
    lines += ["### Keys refused for one kind", "", "Keys the pinned TRL accepts and then ignores:", ""]
    refused = [(f"`{kind}`", f"`{key}`", why) for (kind, key), why in IGNORED_BY_TRL.items()]
    lines += table(("kind", "key", "why"), refused) + [""]
    lines += [
        "`use_vllm: true` (GRPO, RLOO) is refused where vLLM is not installed.",
        "",
        "### PPO's `trl:` block {#ppo-trl}",
        "",
        "A `ppo` stage trains with align's own PPO trainer (TRL removed its PPO). Its `trl:` block takes "
        f"every key of transformers' {transformers_link()} and these:",
        "",
    ]
    ppo = [(f"`{name}`", default, comment) for name, default, comment in ppo_config_rows()]
    return lines + table(("key", "default", "note"), ppo) + [""]


def transformers_link() -> str:
    version = importlib.metadata.version("transformers")
    url = f"https://huggingface.co/docs/transformers/v{version}/en/main_classes/trainer"
    return f"[`TrainingArguments`]({url}#transformers.TrainingArguments)"


def builtin_lines() -> list[str]:
    """The names a file may use without a path: models, data, chat templates, rewards, backends."""
    models = [
        (f"`{name}`", notes().get(f"model:{name}", first_sentence(build.__doc__)))
        for name, build in BUILTIN_MODELS.items()
    ]
    data = [
        (f"`{ref}`", ", ".join(f"`{c}`" for c in columns))
        for ref, (_, columns) in {**BUILTIN_DATA, **TOY_DATA}.items()
    ]
    templates = [
        (f"`{name}`", ", ".join(f"`{t}`" for t in template.special_tokens), f"`{template.eos}`")
        for name, template in CHAT_TEMPLATES.items()
    ]
    rewards = [
        (
            f"`{name}`",
            f"[`{function.__name__}`](python.md#align.rewards.{function.__name__})",
            " ".join((function.__doc__ or "").split()),
        )
        for name, function in SHIPPED.items()
    ]
    backends = [(f"`{name}`", backend.policy_held) for name, backend in BACKENDS.items()]
    return [
        "## Builtins {#builtins}",
        "",
        "### Models",
        "",
        *table(("`base_model`, `model`", "what it is"), models),
        "",
        "### Data",
        "",
        *table(("data ref", "columns"), data),
        "",
        "### Chat templates",
        "",
        *table(("`chat_template`", "special tokens", "end of turn"), templates),
        "",
        "### Reward functions",
        "",
        *table(("`function`", "Python", "score"), rewards),
        "",
        "### Backends",
        "",
        "`backend: auto` picks one of these from the memory plan.",
        "",
        *table(("`backend`", "how each rank holds the trained model"), backends),
        "",
    ]


def configuration_page() -> str:
    sections = reference_sections()
    lines = [
        "# Configuration reference",
        "",
        GENERATED.format(source="the docstrings in `align/config/`"),
        "",
        "A pipeline file is YAML. Unknown keys are errors (`align validate` names each with the keys "
        "allowed there), `null` means the default, and relative paths are read from the file's folder.",
        "",
    ]
    for found in sections:
        if found.anchor == "kind-" + next(iter(KINDS)):
            lines += ["## Stage kinds {#stage-kinds}", "", "Each kind's own keys.", ""]
        if found.anchor.startswith("block-") and not any(line.startswith("## Blocks") for line in lines):
            lines += ["## Blocks {#blocks}", "", "The blocks the keys above hold.", ""]
        lines += section_lines(found)
    return "\n".join(lines + trl_lines() + builtin_lines())


def kinds_table() -> str:
    """The stage kinds as a table, with each kind's guide where docs/stages/ has one (for stages/index.md)."""
    body = []
    for name in KINDS:
        page = guide(name)
        shown = f"[{name}]({page})" if page else f"`{name}`"
        keys = f"[its keys](../reference/configuration.md#kind-{name})"
        body.append((shown, trainer(name), data_forms(name) or "none", keys))
    return "\n".join(table(("kind", "trainer", "rows with", "reference"), body))


def argument_row(action: argparse.Action) -> tuple[str, str, str]:
    name = ", ".join(f"`{flag}`" for flag in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.option_strings and action.nargs != 0:
        name += f" `{action.metavar or action.dest.upper()}`"
    default = action.default
    shown = "" if default in (None, [], False, argparse.SUPPRESS) else f"`{default}`"
    if action.required and action.option_strings:
        shown = "required"
    repeat = (
        " (repeatable)"
        if isinstance(action, argparse._AppendAction) and "repeatable" not in (action.help or "")
        else ""
    )
    return name, shown, sentence(action.help or "") + repeat


def cli_page() -> str:
    top = parser()
    commands = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    lines = [
        "# Command-line reference",
        "",
        GENERATED.format(source="`align/cli/`"),
        "",
        f"{top.description} Exit codes: 0 done; {EXIT_USER_ERROR} a problem with the file, its data or the "
        "command line, in one message and no traceback; 1 a stage that failed; 130 (Ctrl-C) or 143 "
        "(SIGTERM) a run that was stopped, its stages kept for the next run to resume.",
        "",
    ]
    for name, sub in commands.choices.items():
        usage = " ".join(sub.format_usage().removeprefix("usage: ").split())
        wrapped = textwrap.fill(usage, width=100, subsequent_indent="    ", break_on_hyphens=False)
        summary = sentence(helps.get(name) or "")
        lines += [f"## `align {name}`", "", summary, "", "```text", wrapped, "```", ""]
        actions = [a for a in sub._actions if not isinstance(a, argparse._HelpAction)]
        lines += table(("argument", "default", "what it does"), [argument_row(a) for a in actions]) + [""]
    return "\n".join(lines)
