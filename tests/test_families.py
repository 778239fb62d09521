"""Models that are not a Llama: eight transformers families (MoE and GPT-2's Conv1D included), each planned
to the exact parameter count of the built model and peft's own LoRA count, then run SFT (LoRA) -> DPO (LoRA)
-> merge in one pipeline, and three of them as a full-parameter 2-rank fsdp stage whose shards are what the
plan said."""

from __future__ import annotations

import json

import pytest
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.plan import build
from tests.families import FAMILIES, build_family
from tests.pipelines import (
    PREF_DATA,
    SFT_DATA,
    placement_reports,
    run,
    stage,
    stage_folder,
    stage_record,
    write_pipeline,
)

pytestmark = pytest.mark.integration

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
LORA = {"r": 8}
SHARDED = ("qwen2", "mixtral", "gpt2")  # a dense model, the MoE one, tied embeddings with Conv1D
TOLERANCE = 0.02  # a rank's share of a parameter's first dimension is equal but for the last one


def chain(family: str) -> dict[str, dict]:
    """SFT with LoRA on the family's folder, DPO with LoRA on its output, the adapters merged."""
    sft_data = {**SFT_DATA, "max_train_rows": 64, "max_eval_rows": 8}
    pref_data = {**PREF_DATA, "max_train_rows": 64, "max_eval_rows": 8}
    return {
        f"sft_{family}": stage("sft", steps=3, lora=LORA, model=f"models/{family}", data=sft_data),
        f"dpo_{family}": stage(
            "dpo", steps=3, lora=LORA, model=f"${{stages.sft_{family}.output}}", data=pref_data
        ),
        f"merge_{family}": {"kind": "merge", "model": f"${{stages.dpo_{family}.output}}"},
    }


def full_sharded(family: str) -> dict:
    return stage("sft", steps=2, model=f"models/{family}", backend="fsdp", workers=2, data=SFT_DATA)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    folder = tmp_path_factory.mktemp("families")
    for family in FAMILIES:
        build_family(family, folder / "models")
    stages = {name: spec for family in FAMILIES for name, spec in chain(family).items()}
    stages.update({f"fsdp_{family}": full_sharded(family) for family in SHARDED})
    path = write_pipeline(folder, "families", stages, precision="fp32", seed=0, workers=1)
    return path


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_plan_counts_the_built_model_and_peft_exactly(matrix, family):
    model = AutoModelForCausalLM.from_pretrained(matrix.parent / "models" / family)
    built = sum(param.numel() for param in model.parameters())
    adapted = get_peft_model(model, LoraConfig(r=LORA["r"], target_modules="all-linear"))
    trainable = sum(param.numel() for param in adapted.parameters() if param.requires_grad)

    planned = build(load(matrix), CPU).stages[f"sft_{family}"].memory
    assert planned.trainable_params == trainable
    full = build(load(matrix), CPU).stages.get(f"fsdp_{family}")
    if full is not None:
        assert full.memory.trainable_params == built


@pytest.fixture(scope="module")
def ran(matrix):
    run(matrix)
    return matrix


@pytest.mark.parametrize("family", list(FAMILIES))
def test_sft_dpo_merge_runs_and_the_merge_matches(ran, family):
    sft = stage_record(ran, f"sft_{family}")["metrics"]
    dpo = stage_record(ran, f"dpo_{family}")["metrics"]
    merge = stage_record(ran, f"merge_{family}")["metrics"]
    assert sft["trainable_changed"] == 1.0 and dpo["trainable_changed"] == 1.0
    assert sft["eval_loss_after"] < sft["eval_loss_before"]
    assert merge["merge_max_abs_logit_delta"] <= 1e-4


@pytest.mark.parametrize("family", SHARDED)
def test_full_parameter_fsdp_holds_the_planned_shard(ran, family):
    name = f"fsdp_{family}"
    planned = {row["what"]: row["device"] for row in stage_record(ran, name)["memory_plan"]}
    reports = placement_reports(ran, name)
    assert [report["rank"] for report in reports] == [0, 1]
    for report in reports:
        assert report["param_elements_local"] == pytest.approx(
            report["param_elements_total"] / 2, rel=TOLERANCE
        )
    for held in sorted((stage_folder(ran, name) / "logs").glob("fsdp-rank*.json")):
        bytes_held = json.loads(held.read_text())["models"][0]["param_storage_bytes"]
        assert bytes_held == pytest.approx(planned["parameters"], rel=TOLERANCE), held.name
