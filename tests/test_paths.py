"""Paths mean what the user meant: relative paths in a pipeline file are taken from the file's folder, those
given with `--set` from the working directory, whatever directory align runs in; names that are not paths
(builtins, hub ids, `hf:` refs, stage references, reward functions) pass untouched."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from align.cache import user_path
from align.cli import main
from align.pipeline.file import load, resolve_paths

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = {"prompt": "What is 2 + 2?"}
PAIR = {"prompt": "Hi", "chosen": "Hello!", "rejected": "Go away."}
HELD_OUT_PAIR = {"prompt": "Bye", "chosen": "See you!", "rejected": "Finally."}  # never trained on


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def model_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return path


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`project/pipes/` holds a pipeline's data, models and DeepSpeed JSON; the test runs in `elsewhere/`."""
    pipes = tmp_path / "project" / "pipes"
    write_jsonl(pipes / "data" / "prefs.jsonl", [PAIR])
    write_jsonl(tmp_path / "project" / "shared" / "eval.jsonl", [HELD_OUT_PAIR])
    write_jsonl(pipes / "data" / "prompts.jsonl", [PROMPTS])
    model_folder(pipes / "models" / "base")
    model_folder(pipes / "models" / "judge")
    (pipes / "ds").mkdir()
    shutil.copy(ROOT / "configs" / "deepspeed" / "zero2.json", pipes / "ds" / "zero2.json")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    return pipes


def write_pipeline(folder: Path, body: dict, name: str = "pipeline.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def dpo_body(**stage: object) -> dict:
    return {
        "name": "paths",
        "base_model": "models/base",
        "stages": {
            "dpo": {
                "kind": "dpo",
                "data": {"train": "data/prefs.jsonl", "eval": "../shared/eval.jsonl"},
                "zero2": {"config": "ds/zero2.json"},
                "trl": {"resume_from_checkpoint": "runs/old/checkpoint-5"},
                **stage,
            }
        },
    }


def test_relative_paths_in_the_file_are_taken_from_its_folder(project: Path) -> None:
    pipeline = load(write_pipeline(project, dpo_body()))
    stage = pipeline.stages["dpo"]
    assert pipeline.base_model == str(project / "models" / "base")
    assert stage.data.train == str(project / "data" / "prefs.jsonl")
    assert stage.data.eval == str(project.parent / "shared" / "eval.jsonl")  # `..` collapsed
    assert stage.zero2.config == str(project / "ds" / "zero2.json")
    assert stage.trl["resume_from_checkpoint"] == str(project / "runs" / "old" / "checkpoint-5")
    assert pipeline.defaults.output_root == str(project / "runs")  # the default, beside the file too
    assert pipeline.source_dir == str(project)


def test_a_relative_pipeline_path_on_the_command_line_works_the_same(project: Path, monkeypatch) -> None:
    write_pipeline(project, dpo_body())
    monkeypatch.chdir(project.parent)
    pipeline = load("pipes/pipeline.yaml")
    assert pipeline.stages["dpo"].data.train == str(project / "data" / "prefs.jsonl")


def test_set_paths_are_taken_from_the_working_directory(project: Path) -> None:
    here = Path.cwd()
    write_jsonl(here / "mine.jsonl", [PAIR])
    overrides = [
        "stages.dpo.data.train=mine.jsonl",
        "defaults.output_root=out",
        "stages.dpo.zero2={config: my.json}",  # a whole block set at once is resolved too
    ]
    pipeline = load(write_pipeline(project, dpo_body()), overrides)
    stage = pipeline.stages["dpo"]
    assert stage.data.train == str(here / "mine.jsonl")
    assert stage.data.eval == str(project.parent / "shared" / "eval.jsonl")  # the file's own, unchanged
    assert pipeline.defaults.output_root == str(here / "out")
    assert stage.zero2.config == str(here / "my.json")


def test_an_output_root_written_in_the_file_is_taken_from_its_folder(project: Path) -> None:
    body = {**dpo_body(), "defaults": {"output_root": "../runs"}}
    assert load(write_pipeline(project, body)).defaults.output_root == str(project.parent / "runs")


def test_names_that_are_not_paths_pass_untouched(project: Path) -> None:
    (project / "datasets").mkdir()
    body = {
        "name": "names",
        "base_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "stages": {
            "sft": {"kind": "sft", "model": "tiny", "data": {"train": "align:chatterbot/sft/train"}},
            "dpo": {
                "kind": "dpo",
                "model": "${stages.sft.output}",
                "data": {"train": "hf:trl-lib/ultrafeedback_binarized@train", "eval": "datasets/prefs@test"},
            },
        },
    }
    raw = resolve_paths(body, (), project)  # checks aside: the prefs folder is absent
    assert raw["base_model"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert raw["stages"]["sft"]["model"] == "tiny"
    assert raw["stages"]["sft"]["data"]["train"] == "align:chatterbot/sft/train"
    assert raw["stages"]["dpo"]["model"] == "${stages.sft.output}"
    assert raw["stages"]["dpo"]["data"]["train"] == "hf:trl-lib/ultrafeedback_binarized@train"
    assert raw["stages"]["dpo"]["data"]["eval"] == f"{project / 'datasets' / 'prefs'}@test"  # split kept


def test_org_name_is_a_path_when_it_starts_like_one_or_its_org_is_a_folder_beside_the_file(
    project: Path,
) -> None:
    for value, expected in [
        ("models/base", str(project / "models" / "base")),  # `models` is a folder beside the file
        ("models/typo", str(project / "models" / "typo")),  # ... so this is a local path with a typo
        ("./org/name", str(project / "org" / "name")),
        ("../org/name", str(project.parent / "org" / "name")),
        ("/abs/org/name", "/abs/org/name"),
        ("org/name", "org/name"),  # a hub id
    ]:
        assert resolve_paths({"base_model": value}, (), project)["base_model"] == expected, value


def test_a_misspelt_local_model_is_reported_with_the_path_align_looked_at(project: Path, capsys) -> None:
    path = write_pipeline(project, dpo_body() | {"base_model": "models/typo"})
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"base_model: '{project / 'models' / 'typo'}' is not a builtin model, a folder, or a hub id" in err


def test_reward_models_are_paths_and_reward_functions_are_imports(project: Path) -> None:
    (project / "my_paths_test_rewards.py").write_text(
        "def short(completions, **_):\n    return [1.0 for _ in completions]\n"
    )
    body = {
        "name": "rl",
        "base_model": "models/base",
        "allow_custom_code": True,
        "stages": {
            "grpo": {
                "kind": "grpo",
                "data": {"train": "data/prompts.jsonl"},
                "rewards": [{"model": "models/judge"}, {"function": "my_paths_test_rewards.short"}],
            }
        },
    }
    try:
        pipeline = load(write_pipeline(project, body))  # imports the function from the file's folder
    finally:
        sys.modules.pop("my_paths_test_rewards", None)
        if str(project) in sys.path:
            sys.path.remove(str(project))
    rewards = pipeline.stages["grpo"].rewards
    assert rewards[0].model == str(project / "models" / "judge")
    assert rewards[1].function == "my_paths_test_rewards.short"
    assert pipeline.module_roots() == [str(Path.cwd()), str(project)]
    assert "source_dir" not in pipeline.model_dump()  # where the file lies is no part of its config


def test_validate_from_another_directory_succeeds(project: Path, capsys) -> None:
    body = dpo_body(model="tiny") | {"base_model": "tiny"}
    path = write_pipeline(project, body)
    assert main(["validate", str(path)]) == 0, capsys.readouterr().err
    assert "valid pipeline 'paths'" in capsys.readouterr().out


def test_user_path_takes_relative_paths_from_the_base_and_expands_home(tmp_path: Path) -> None:
    assert user_path("a/../b.jsonl", tmp_path) == tmp_path / "b.jsonl"
    assert user_path("/x/y", tmp_path) == Path("/x/y")
    assert user_path("~/x") == Path.home() / "x"
    assert user_path("~no_such_user_x/m", tmp_path) == tmp_path / "~no_such_user_x" / "m"  # a plain name
    assert user_path("rel") == Path.cwd() / "rel"
