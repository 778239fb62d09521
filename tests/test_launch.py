"""The plan, then the launch: a StagePlan is decided once by `build` and never rewritten; what the controller
adds when it starts a stage (inputs, pinned data, its share of the cores, the memory priced at launch) is a
`Launch` beside it. And each block only some kinds take is read from the type that has it."""

from __future__ import annotations

import ast
import json
import shutil
from dataclasses import fields
from pathlib import Path

import yaml

from align.config.stage_parts import teacher_of
from align.models.loading import resolve_model
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.launch import Launch
from align.planning.plan import ModelInput, StagePlan, build
from align.records import StageResult
from align.run.controller import run_plan
from align.run.launch import Launched

PACKAGE = Path(__file__).resolve().parents[1] / "align"
CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
REPLACED_IN_STEAD = {("report/rows_view.py", "chat_template")}
"""`align data` before an upstream stage has run shows its rows with the template along the chain, in the
plan's stead (a preview of what the run will read): the one plan made outside planning/ by design."""


def dataclass_fields(tree: ast.AST, skip: str) -> set[str]:
    """The fields of every dataclass in `tree` but `skip` (what `dataclasses.replace` may set)."""
    return {
        item.target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and node.name != skip
        and any("dataclass" in ast.unparse(decorator) for decorator in node.decorator_list)
        for item in node.body
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
    }


def is_dataclass_replace(called: ast.expr) -> bool:
    """`replace(...)` or `dataclasses.replace(...)` (not a string's `.replace`)."""
    if isinstance(called, ast.Name):
        return called.id == "replace"
    return (
        isinstance(called, ast.Attribute)
        and called.attr == "replace"
        and ast.unparse(called.value) == "dataclasses"
    )


def test_no_module_outside_planning_rewrites_a_stage_plan() -> None:
    """Told apart by what it would set: a `replace(...)` setting a field that only StagePlan has."""
    trees = {path: ast.parse(path.read_text()) for path in PACKAGE.rglob("*.py")}
    others = set().union(*(dataclass_fields(tree, "StagePlan") for tree in trees.values()))
    plan_only = {field.name for field in fields(StagePlan)} - others
    assert {"upstream", "backend_reason", "chat_template"} <= plan_only
    found = set()
    for path, tree in trees.items():
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("planning/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and is_dataclass_replace(node.func):
                found |= {(where, kw.arg) for kw in node.keywords if kw.arg in plan_only}
    assert found == REPLACED_IN_STEAD


class Recorder:
    """Remembers each launch, writing what the stage's kind would."""

    def __init__(self) -> None:
        self.launches: dict[str, Launch] = {}

    def __call__(self, plan, launch: Launch, scratch: Path, resume: Path | None) -> Launched:
        self.launches[launch.name] = launch
        output = "adapter" if launch.plan.lora else "model"
        (scratch / output).mkdir()
        return Launched(StageResult(output=output, metrics={}))


def test_each_stage_launches_the_plan_build_made_with_what_the_run_adds_beside_it(tmp_path: Path) -> None:
    base = tmp_path / "base"
    base.mkdir()
    shutil.copy(Path(resolve_model("tiny")) / "config.json", base)  # a model folder, never loaded
    (tmp_path / "sft.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    sft = {"kind": "sft", "data": {"train": str(tmp_path / "sft.jsonl")}, "lora": {"r": 4}}
    body = {
        "name": "launch",
        "base_model": str(base),
        "defaults": {"output_root": str(tmp_path / "runs")},
        "stages": {"sft": sft, "merge": {"kind": "merge", "model": "${stages.sft.output}"}},
    }
    (tmp_path / "launch.yaml").write_text(yaml.safe_dump(body, sort_keys=False))
    plan = build(load(tmp_path / "launch.yaml"), CPU)
    recorder = Recorder()
    run_plan(plan, launch=recorder)
    for name, launch in recorder.launches.items():
        assert launch.plan is plan.stages[name]  # the very plan: nothing rewrote it on the way
        assert launch.resources.alongside == 1
    adapter = str(tmp_path / "runs" / "launch" / "sft" / "adapter")
    assert recorder.launches["merge"].inputs.model == ModelInput(str(base), (adapter,))


def test_each_block_is_read_from_the_kind_that_has_it() -> None:
    plan = build(load("pipelines/demo_number_or_word.yaml"), CPU)
    for stage in plan.stages.values():
        spec = stage.stage  # each as the old probes read it, now from the type that has it
        assert stage.teacher == getattr(spec, "teacher", None) == teacher_of(spec)
        assert stage.trl == getattr(spec, "trl", {}) and stage.rewards == getattr(spec, "rewards", [])
        assert stage.lora == getattr(spec, "lora", None) and stage.data == getattr(spec, "data", None)
        assert stage.eval_models == getattr(spec, "models", {})
    kinds = {stage.kind for stage in plan.stages.values()}
    assert "eval" in kinds and kinds & {"sft", "dpo", "grpo"}
