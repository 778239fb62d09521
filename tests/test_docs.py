"""The manual (docs/ and README.md) against the code: every pipeline YAML example passes `align validate`,
every shipped file and make target it names exists, the generated configuration reference lists every key
the spec accepts with a description, and the README stays a two-minute read."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from align.cli import parser
from align.config.spec import KINDS, Pipeline, StageBase, TrainingStage
from align.config.sweep import SweepSpec
from align.errors import AlignError
from align.models.loading import BUILTIN_MODELS
from align.pipeline.file import Header
from scripts.docs_config import ppo_config_rows
from scripts.docs_fields import code_words, notes
from scripts.docs_pages import cli_page, configuration_page

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    path.relative_to(ROOT).as_posix() for path in [*(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
)
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>```|~~~)(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
WRAPPER = "# completes the stage examples in these pages"
SHIPPED = re.compile(
    r"\b(?:pipelines|recipes|configs|tests|bench|scripts|align)/[\w./-]*\.(?:ya?ml|json|py|md)\b"
)
MAKE = re.compile(r"\bmake ([a-z][\w-]*\w)(?![\w*-])")  # `make bench-*` names a family, not a target


def blocks(page: str, languages: tuple[str, ...]) -> list[tuple[int, str]]:
    """(line, text) of each fenced block of the page in one of `languages`, its indentation removed."""
    text = (ROOT / page).read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        if match["info"].strip().split(" ")[0] in languages:
            indent = len(match["indent"])
            body = "\n".join(line[indent:] for line in match["body"].splitlines())
            found.append((text[: match.start()].count("\n") + 1, body))
    return found


def wrapper() -> dict[str, typing.Any]:
    """The minimal pipeline docs/pipelines.md states for stage examples, as the page writes it."""
    stated = [body for _, body in blocks("docs/pipelines.md", ("yaml",)) if body.startswith(WRAPPER)]
    assert len(stated) == 1, f"docs/pipelines.md states the wrapper for stage examples once ({WRAPPER!r})"
    return yaml.safe_load(stated[0])


def completed(example: typing.Any) -> dict[str, typing.Any] | None:
    """A YAML example as a whole pipeline: itself, or its stages / top-level keys in the stated wrapper;
    None when it is none of these."""
    if not isinstance(example, dict) or not example:
        return None
    if "stages" in example:
        return example
    whole = wrapper()
    if "kind" in example:
        return {**whole, "stages": {**whole["stages"], "example": example}}
    if all(isinstance(stage, dict) and "kind" in stage for stage in example.values()):
        return {**whole, "stages": {**whole["stages"], **example}}
    if set(example) <= set(Header.model_fields):
        return {**whole, **example}
    return None


def validate(path: Path) -> str | None:
    """`align validate PATH` in this process (no second TRL import per file); its error, or None."""
    args = parser().parse_args(["validate", str(path)])
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            args.handler(args)
    except AlignError as err:
        return str(err)
    return None


@pytest.mark.parametrize("page", [page for page in PAGES if blocks(page, ("yaml", "yml"))])
def test_every_yaml_example_validates(page: str, tmp_path: Path) -> None:
    """Each example is written into a `pipelines/` folder beside a link to the repository's `configs/`,
    so its relative paths mean what they mean in the shipped pipelines; a Python block whose first line
    names a module (`# my_rewards.py`) is written beside it, for the reward functions it imports."""
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    for _, code in blocks(page, ("python",)):  # a module the page shows, named on its first line
        if named := re.fullmatch(r"# (\w+\.py)", code.splitlines()[0]):
            (tmp_path / "pipelines" / named[1]).write_text(code, encoding="utf-8")
    failures = []
    for line, body in blocks(page, ("yaml", "yml")):
        try:
            pipeline = completed(yaml.safe_load(body))
        except yaml.YAMLError as err:
            failures.append(f"{page}:{line}: not YAML: {' '.join(str(err).split())}")
            continue
        if pipeline is None:
            failures.append(f"{page}:{line}: not a pipeline, stages or top-level keys; fence it as `text`")
            continue
        path = tmp_path / "pipelines" / f"line{line}.yaml"
        path.write_text(yaml.safe_dump(pipeline, sort_keys=False), encoding="utf-8")
        if (error := validate(path)) is not None:
            failures.append(f"{page}:{line}: {error}")
    assert not failures, "\n".join(failures)


def make_targets() -> set[str]:
    rules = re.findall(r"^([\w.-]+(?: [\w.-]+)*)\s*:(?!=)", (ROOT / "Makefile").read_text(), re.MULTILINE)
    return {target for rule in rules for target in rule.split()}


@pytest.mark.parametrize("page", PAGES)
def test_named_files_and_make_targets_exist(page: str) -> None:
    """A shipped file a page names (`pipelines/x.yaml`, `align/rewards.py`) exists, and so does every
    make target its shell examples and code spans run."""
    text = (ROOT / page).read_text(encoding="utf-8")
    missing = sorted({path for path in SHIPPED.findall(text) if not (ROOT / path).exists()})
    code = "\n".join(
        [*re.findall(r"`([^`\n]+)`", text), *(b for _, b in blocks(page, ("bash", "sh", "text")))]
    )
    targets = sorted(set(MAKE.findall(code)) - make_targets())
    assert not missing, f"{page} names files that do not exist: {missing}"
    assert not targets, f"{page} runs make targets the Makefile lacks: {targets}"


def nested_models(annotation: typing.Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in typing.get_args(annotation) for model in nested_models(arg)]


def reachable() -> list[type[BaseModel]]:
    """Every pydantic class a pipeline file reaches: the top level, every kind, and the blocks they hold."""
    queue, seen = [Pipeline, SweepSpec, StageBase, TrainingStage, *(kind.spec for kind in KINDS.values())], []
    while queue:
        model = queue.pop(0)
        if model not in seen:
            seen.append(model)
            queue += [
                inner for spec in model.model_fields.values() for inner in nested_models(spec.annotation)
            ]
    return seen


def spec_keys() -> dict[str, set[str]]:
    """Every key the spec accepts, by the configuration page's section anchor: the file's top level (as
    the file reader takes it), what every (training) stage shares, each kind's own keys, every block's."""
    found = {
        "the-pipeline-file": set(Header.model_fields),
        "every-stage": set(StageBase.model_fields),
        "every-training-stage": set(TrainingStage.model_fields) - set(StageBase.model_fields),
    }
    for name, kind in KINDS.items():
        shared = TrainingStage if kind.trains else StageBase
        found[f"kind-{name}"] = set(kind.spec.model_fields) - set(shared.model_fields)
    stages = {Pipeline, StageBase, TrainingStage, *(kind.spec for kind in KINDS.values())}
    for model in reachable():
        if model not in stages:
            found[f"block-{model.__name__.lower()}"] = set(model.model_fields)
    return found


def page_keys(page: str) -> dict[str, dict[str, str]]:
    """The configuration page's tables: section anchor -> {key: description}."""
    found: dict[str, dict[str, str]] = {}
    current = None
    for line in page.splitlines():
        if heading := re.match(r"^#+ .*\{#([\w-]+)\}$", line):
            current = heading[1]
            found[current] = {}
        elif current and (row := re.match(r"^\| `([\w]+)` \|(.*)\|$", line)):
            found[current][row[1]] = row[2].split(" | ")[-1].strip()
    return found


def test_configuration_reference_lists_every_key_with_a_description() -> None:
    expected = spec_keys()
    shown = page_keys(configuration_page())
    for anchor, keys in expected.items():
        assert anchor in shown, f"the configuration reference has no section #{anchor}"
        assert set(shown[anchor]) == keys, f"#{anchor}: the page lists {sorted(shown[anchor])}, spec {keys}"
        blank = [key for key in keys if not shown[anchor][key]]
        assert not blank, f"#{anchor}: {blank} have no description: write a docstring under each in its class"
    assert len(expected) >= 25


def test_field_notes_stand_in_only_for_missing_docstrings() -> None:
    """A note is for a key whose class says nothing of it yet: one for an unknown key, or for a key that
    now has a docstring, is stale."""
    models = {model.__name__: model for model in reachable()}
    ppo = {name for name, _, _ in ppo_config_rows()}
    stale = []
    for key in notes():
        owner, _, field = key.partition(".")
        if owner.startswith("model:"):
            known, documented = owner.removeprefix("model:") in BUILTIN_MODELS, False
        elif owner == "PPOConfig":
            known, documented = field in ppo, False
        else:
            known = owner in models and field in vars(models[owner]).get("__annotations__", {})
            documented = known and bool(code_words(models[owner], field)[0])
        if not known or documented:
            stale.append(key)
    assert not stale, f"scripts/docs_field_notes.yaml: stale notes {stale}"


def test_python_reference_renders_every_shipped_reward() -> None:
    """The configuration reference links each shipped reward's entry on the Python page: a reward added
    without one breaks the strict build."""
    from align.rewards import SHIPPED

    page = (ROOT / "docs" / "reference" / "python.md").read_text(encoding="utf-8")
    rendered = set(re.findall(r"^::: align\.rewards\.(\w+)$", page, re.MULTILINE))
    missing = [function.__name__ for function in SHIPPED.values() if function.__name__ not in rendered]
    assert not missing, f"docs/reference/python.md: add '::: align.rewards.NAME' for {missing}"


def test_cli_reference_lists_every_command_and_option() -> None:
    page = cli_page()
    commands = re.findall(r"^## `align ([\w-]+)`$", page, re.MULTILINE)
    subparsers = next(a for a in parser()._actions if a.dest == "command")
    assert commands == list(subparsers.choices)
    for name, sub in subparsers.choices.items():
        section = page.split(f"## `align {name}`")[1].split("\n## ")[0]
        for action in sub._actions:
            for flag in [] if isinstance(action, argparse._HelpAction) else action.option_strings:
                assert f"`{flag}`" in section, f"align {name}: {flag} missing"


def test_readme_is_short_and_starts_with_the_two_commands() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 150
    first = blocks("README.md", ("bash",))[0][1]
    assert first.splitlines()[0].startswith("make demo") and "make test" in first
    links = re.findall(r"\]\(((?!https?:)[^)#]+)(?:#[^)]*)?\)", readme)
    assert links and not [link for link in links if not (ROOT / link).exists()], links
