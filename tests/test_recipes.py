"""The CPU recipes (recipes/*.yaml): each validates and plans from the real model with no hub, starts from
`smollm2-135m` and ends in an eval stage of at least 200 held-out prompts against the base; each data
generator (recipes/data/make_*.py) is seeded (same seed, same bytes; the committed rows are its output),
and no held-out question is asked in training. The runs themselves are `make recipes`."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from align.cli import main

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(path.relative_to(ROOT).as_posix() for path in (ROOT / "recipes").glob("*.yaml"))
GENERATORS = sorted((ROOT / "recipes" / "data").glob("make_*.py"))
HELD_OUT = "test.jsonl"
MIN_HELD_OUT = 200


@pytest.fixture(autouse=True)
def at_repo_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)


def recipe(path: str) -> dict:
    return yaml.safe_load((ROOT / path).read_text(encoding="utf-8"))


def generate(generator: Path, out: Path, seed: int = 0) -> dict[str, bytes]:
    """Run the generator as a user would; every file it wrote, by name."""
    command = [sys.executable, str(generator), "--seed", str(seed), "--out", str(out)]
    subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
    return {path.name: path.read_bytes() for path in sorted(out.iterdir())}


def data_folder(generator: Path) -> Path:
    """The generators write recipes/data/<task>/ by default."""
    return generator.parent / generator.stem.removeprefix("make_")


def questions(generator: Path, rows: bytes) -> set:
    """Each row's question as its generator defines sameness (`question(row)`): the numbers of a sum in either
    order, the person a sentence is about."""
    spec = importlib.util.spec_from_file_location(generator.stem, generator)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {module.question(json.loads(line)) for line in rows.decode().splitlines()}


def test_there_are_both_cpu_recipes_and_their_generators() -> None:
    kinds = {stage["kind"] for path in RECIPES for stage in recipe(path)["stages"].values()}
    assert {"sft", "dpo", "grpo", "eval"} <= kinds, RECIPES
    assert len(GENERATORS) == len(RECIPES)


@pytest.mark.parametrize("path", RECIPES)
def test_recipe_validates_and_plans(capsys: pytest.CaptureFixture[str], path: str) -> None:
    assert main(["validate", path]) == 0
    assert f"\n{path}: valid pipeline " in "\n" + capsys.readouterr().out
    assert main(["plan", path]) == 0
    out = capsys.readouterr().out
    stages = recipe(path)["stages"]
    for name, stage in stages.items():
        assert re.search(rf"^\d+\. {name} +kind={stage['kind']} ", out, re.MULTILINE), out
    assert re.search(rf"^pipeline {recipe(path)['name']}: {len(stages)} stages on CPU", out, re.MULTILINE), (
        out
    )


@pytest.mark.parametrize("path", RECIPES)
def test_recipe_starts_from_the_real_model_and_ends_in_a_held_out_eval_against_it(path: str) -> None:
    pipeline = recipe(path)
    assert pipeline["base_model"] == "smollm2-135m"
    name, last = list(pipeline["stages"].items())[-1]
    assert last["kind"] == "eval", f"{path}: the last stage, {name}, is not an eval"
    assert last["models"][last["baseline"]] == "smollm2-135m"
    trained = [f"${{stages.{stage}.output}}" for stage in pipeline["stages"] if stage != name]
    assert set(trained) <= set(last["models"].values())
    prompts = ROOT / "recipes" / last["data"]["prompts"]
    assert prompts.name == HELD_OUT
    assert len(prompts.read_text().splitlines()) >= MIN_HELD_OUT


@pytest.mark.parametrize("path", RECIPES)
def test_every_data_file_of_a_recipe_is_a_generators_output(path: str) -> None:
    """No hand-written rows: each file a stage reads is in a folder that one make_*.py script writes."""
    written = {data_folder(generator) for generator in GENERATORS}
    refs = re.findall(r"^\s+(?:train|eval|prompts): (data/\S+)", (ROOT / path).read_text(), re.MULTILINE)
    assert refs, path
    for ref in refs:
        assert (ROOT / "recipes" / ref).parent in written, ref


@pytest.mark.parametrize("generator", GENERATORS, ids=lambda path: path.name)
def test_generator_is_seeded_and_wrote_the_committed_rows(generator: Path, tmp_path: Path) -> None:
    first = generate(generator, tmp_path / "first")
    assert first == generate(generator, tmp_path / "again")
    assert first != generate(generator, tmp_path / "other", seed=1)
    committed = {path.name: path.read_bytes() for path in sorted(data_folder(generator).iterdir())}
    assert committed == first, f"rerun `python {generator.relative_to(ROOT)}`: the committed rows differ"


@pytest.mark.parametrize("generator", GENERATORS, ids=lambda path: path.name)
def test_generator_holds_its_held_out_questions_out_of_training(generator: Path, tmp_path: Path) -> None:
    files = generate(generator, tmp_path)
    held_out_rows = files.pop(HELD_OUT)
    assert len(held_out_rows.decode().splitlines()) >= MIN_HELD_OUT
    held_out = questions(generator, held_out_rows)
    assert files, "no training file"
    for name, rows in files.items():
        asked = questions(generator, rows)
        assert asked, name
        assert not held_out & asked, f"{name} asks {sorted(held_out & asked)[:3]} of the held-out questions"
