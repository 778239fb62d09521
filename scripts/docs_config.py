"""The configuration reference page, written from the spec when the site is built (scripts/docs_hooks.py):
every key of the pipeline file, of each stage kind and of each block; what the `trl:` block passes to
TRL and what align keeps for itself; and the builtins a file may name.

`reference_sections()` is the page as data (one table of keys per section), which tests/test_docs.py
compares with the spec; `configuration_page()` writes it as Markdown.
"""

from __future__ import annotations

import ast
import importlib.metadata
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import BaseModel

from align.config.spec import KINDS, Pipeline, StageBase, TrainingStage
from align.data.loading import DATA_COLUMNS
from align.pipeline.file import Header
from scripts.docs_fields import (
    default_words,
    description,
    field_type,
    models_in,
    notes,
    sentence,
    yaml_value,
)

ROOT = Path(__file__).resolve().parents[1]
REFERENCE_RULES = {
    "never": "none",
    "always": "yes: under LoRA the stage's own model with its adapters off, else a frozen copy",
    "with_kl": "only when `trl.beta` > 0",
}
Row = tuple[str, str, str, str, str]


@dataclass
class Section:
    """One table of keys: its anchor and heading, what it is, the block it documents and the keys shown."""

    anchor: str
    title: str
    intro: list[str]
    owner: type[BaseModel]
    keys: list[str]
    path: str  # where its keys sit in a file: "" (top level), "stages.NAME", "stages.NAME.lora"...
    rows: list[Row] = field(default_factory=list)


def anchor(model: type[BaseModel]) -> str:
    return f"block-{model.__name__.lower()}"


def link(model: type[BaseModel]) -> str:
    """A key's type when it holds a block: a link to the block's own table (a stage's, for `stages`)."""
    return "[stage](#every-stage)" if model is StageBase else f"[block](#{anchor(model)})"


def rows(owner: type[BaseModel], keys: list[str]) -> list[Row]:
    """key, type, allowed values, default and description of each key."""
    table = []
    for key in keys:
        spec = owner.model_fields[key]
        kind, allowed = field_type(spec, link)
        table.append((key, kind, allowed, default_words(spec), " ".join(description(owner, key).split())))
    return table


def section(anchor_: str, title: str, intro: list[str], owner: type[BaseModel], keys: list[str], path: str):
    return Section(anchor_, title, [line for line in intro if line], owner, keys, path, rows(owner, keys))


def docstring(model: type) -> str:
    return " ".join((model.__doc__ or "").split())


def kind_sections() -> list[Section]:
    """One section per stage kind: its own keys, beyond those every (training) stage takes."""
    sections = []
    for name, kind in KINDS.items():
        shared = TrainingStage if kind.trains else StageBase
        keys = sorted(
            (key for key in kind.spec.model_fields if key not in shared.model_fields),
            key=lambda k: k != "kind",
        )
        also = " and of [every training stage](#every-training-stage)" if kind.trains else ""
        intro = [docstring(kind.spec), f"It also takes every key of [every stage](#every-stage){also}."]
        found = section(
            f"kind-{name}", f"`kind: {name}`", intro + kind_facts(name), kind.spec, keys, "stages.NAME"
        )
        kind_row = ("kind", "string", f"`{name}`", "required", "Selects this kind.")
        found.rows = [kind_row if row[0] == "kind" else row for row in found.rows]
        sections.append(found)
    return sections


def kind_facts(name: str) -> list[str]:
    """The `trl:` class, the data it reads, its reference model and its guide, as the kinds table says."""
    kind = KINDS[name]
    facts = []
    if kind.config is None:
        facts.append("It takes no `trl:` block.")
    elif kind.config.startswith("trl."):
        facts.append(f"`trl:` is TRL's {trl_link(kind.config)} (see [the trl: block](#the-trl-block)).")
    else:
        facts.append("`trl:` is align's own `PPOConfig`: [its keys](#ppo-trl).")
    if kind.data is not None:
        facts.append(f"Its data: rows with {data_forms(name)}.")
    if kind.trains:
        facts.append(f"Reference model: {REFERENCE_RULES[kind.reference]}.")
    if page := guide(name):
        facts.append(f"Guide: [{page.removesuffix('.md')}](../stages/{page}).")
    return facts


def guide(name: str) -> str | None:
    """The page of docs/stages/ that guides a kind: its own, else that of a kind of the same spec class
    (rloo's is grpo's, cpo's is orpo's); None where there is none."""
    same = [other for other, kind in KINDS.items() if kind.spec is KINDS[name].spec]
    pages = [f"{kind}.md" for kind in [name, *same] if (ROOT / "docs" / "stages" / f"{kind}.md").exists()]
    return pages[0] if pages else None


def data_forms(name: str) -> str:
    """The column sets a kind's rows may have, as TRL's formats name them."""
    columns = DATA_COLUMNS[KINDS[name].data] if KINDS[name].data else []
    return "; or ".join(", ".join(f"`{column}`" for column in form) for form in columns)


def trainer(name: str) -> str:
    """The trainer a kind runs, from its config class."""
    config = KINDS[name].config
    if config is None:
        return "none"
    if not config.startswith("trl."):
        return "align's own PPO"
    found = f"TRL's `{config.rsplit('.', 1)[1].removesuffix('Config')}Trainer`"
    return found + (" (experimental)" if ".experimental." in config else "")


def trl_link(config: str) -> str:
    """TRL's documentation of a config class, at the installed TRL's version."""
    name = config.rsplit(".", 1)[1]
    page = f"{name.removesuffix('Config').lower()}_trainer"
    version = importlib.metadata.version("trl")
    return f"[`{name}`](https://huggingface.co/docs/trl/v{version}/en/{page}#{config})"


def block_sections(start: list[Section]) -> list[Section]:
    """A section for every block reachable from the keys of `start`, in the order first met, with each
    path it appears at (and the kinds that have it there, for a kind's own key)."""
    skip = {StageBase, TrainingStage, *(kind.spec for kind in KINDS.values())}
    places: dict[type[BaseModel], dict[str, list[str]]] = {}
    queue = [
        (s.owner, s.keys, s.path, s.anchor.removeprefix("kind-") if s in start[3:] else "") for s in start
    ]
    while queue:
        owner, keys, path, kind = queue.pop(0)
        for key in keys:
            for model, listed in models_in(owner.model_fields[key].annotation):
                if model in skip:
                    continue
                where = f"{path}.{key}{'[]' if listed else ''}".lstrip(".")
                if model not in places:
                    places[model] = {}
                    queue.append((model, list(model.model_fields), where, ""))
                kinds = places[model].setdefault(where, [])
                if kind and kind not in kinds:
                    kinds.append(kind)
    sections = []
    for model, paths in places.items():
        shown = [f"`{path}`" + (f" ({', '.join(kinds)})" if kinds else "") for path, kinds in paths.items()]
        intro = [docstring(model), f"At {', '.join(shown)}."]
        sections.append(section(anchor(model), shown[0], intro, model, list(model.model_fields), ""))
    return sections


def reference_sections() -> list[Section]:
    """The page's tables of keys, in reading order: the file, stages, each kind, then every block."""
    top_keys = [key for key in Header.model_fields if key in Pipeline.model_fields]
    top = section("the-pipeline-file", "The pipeline file", [docstring(Pipeline)], Pipeline, top_keys, "")
    every = section(
        "every-stage",
        "Every stage: `stages.NAME`",
        ["Keys every stage takes, whatever its kind."],
        StageBase,
        list(StageBase.model_fields),
        "stages.NAME",
    )
    training_keys = [key for key in TrainingStage.model_fields if key not in StageBase.model_fields]
    training = section(
        "every-training-stage",
        "Every training stage",
        ["Keys every stage that trains takes (every kind but `merge` and `eval`)."],
        TrainingStage,
        training_keys,
        "stages.NAME",
    )
    # A key the Pipeline keeps as something of its own (excluded: `sweep`) is shown as the file has it
    top.rows = [
        rows(Header, [row[0]])[0] if Pipeline.model_fields[row[0]].exclude else row for row in top.rows
    ]
    kinds = kind_sections()
    as_written = replace(top, owner=Header)
    return [top, every, training, *kinds, *block_sections([as_written, every, training, *kinds])]


def ppo_config_rows() -> list[tuple[str, str, str]]:
    """The keys align's PPOConfig adds to transformers' TrainingArguments: name, default, and its note
    (scripts/docs_field_notes.yaml) or comment. Read from its source: importing it would import
    transformers, seconds the site need not wait."""
    path = ROOT / "align" / "trainers" / "ppo_config.py"
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    config = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "PPOConfig")
    found = []
    for node in config.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            comment = sentence(lines[node.end_lineno - 1].partition("#")[2])
            text = notes().get(f"PPOConfig.{node.target.id}", comment)
            found.append((node.target.id, yaml_value(ast.literal_eval(node.value)), text))
    return found
