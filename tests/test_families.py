"""Models that are not a Llama, as a user brings them: eight transformers families (MoE and GPT-2's Conv1D
included), each a base with no chat template, given `chat_template: chatml`. Each is planned to the exact
parameter count of the built model and peft's own LoRA count (the template's token rows included), with the
LM-head path its tying calls for, then run in one pipeline per family, in three modes: LoRA (SFT -> DPO ->
merge), full parameters, and LoRA under 2-rank fsdp; three of them also as a full-parameter fsdp stage whose
shards are what the plan said. What each writes carries the template and chats in plain transformers/peft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from align.models.chat_templates import BUILTIN
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.lora import FUSED, PLAIN
from align.planning.plan import build
from align.stages.context import token_rows_by_module
from tests.families import FAMILIES, build_family
from tests.pipelines import (
    PREF_DATA,
    SFT_DATA,
    placement_reports,
    run,
    stage,
    stage_folder,
    stage_record,
)

pytestmark = pytest.mark.integration

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
LORA = {"r": 8}
SHARDED = ("qwen2", "mixtral", "gpt2")  # a dense model, the MoE one, tied embeddings with Conv1D
TOLERANCE = 0.02  # a rank's share of a parameter's first dimension is equal but for the last one
CHATML = BUILTIN["chatml"]
HI = [{"role": "user", "content": "Hi"}]


def stages(family: str) -> dict[str, dict]:
    """The three modes on the family's base: LoRA SFT -> LoRA DPO -> merge, full-parameter SFT, LoRA SFT
    under 2-rank fsdp; and for SHARDED families a full-parameter fsdp SFT."""
    sft_data = {**SFT_DATA, "max_train_rows": 64, "max_eval_rows": 8}
    pref_data = {**PREF_DATA, "max_train_rows": 64, "max_eval_rows": 8}
    base = f"models/{family}"
    chain = {
        "sft": stage("sft", steps=3, lora=LORA, model=base, data=sft_data),
        "dpo": stage("dpo", steps=3, lora=LORA, model="${stages.sft.output}", data=pref_data),
        "merge": {"kind": "merge", "model": "${stages.dpo.output}"},
        "full": stage("sft", steps=3, model=base, data=sft_data),
        "fsdp_lora": stage("sft", steps=3, lora=LORA, model=base, backend="fsdp", workers=2, data=sft_data),
    }
    if family in SHARDED:
        chain["fsdp_full"] = stage("sft", steps=2, model=base, backend="fsdp", workers=2, data=SFT_DATA)
    return chain


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    """The folder holding every family's template-less base under models/."""
    folder = tmp_path_factory.mktemp("families")
    for family in FAMILIES:
        built = build_family(family, folder / "models", chat_template=False)
        assert AutoTokenizer.from_pretrained(built).chat_template is None
    return folder


def pipeline_file(folder: Path, family: str) -> Path:
    body = {
        "name": f"family_{family}",
        "base_model": f"models/{family}",
        "chat_template": "chatml",
        "defaults": {"output_root": "runs", "precision": "fp32", "seed": 0, "workers": 1},
        "stages": stages(family),
    }
    path = folder / f"family_{family}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def tied_head(folder: Path) -> bool:
    model = AutoModelForCausalLM.from_pretrained(folder)
    return model.get_output_embeddings().weight is model.get_input_embeddings().weight


def trainable(model: torch.nn.Module) -> int:
    return sum(param.numel() for param in model.parameters() if param.requires_grad)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_plan_counts_peft_exactly_and_reads_the_head_as_peft_wraps_it(models, family):
    plan = build(load(pipeline_file(models, family)), CPU).stages
    tokenizer = AutoTokenizer.from_pretrained(models / "models" / family)
    rows = tokenizer.convert_tokens_to_ids(list(CHATML.special_tokens))
    model = AutoModelForCausalLM.from_pretrained(models / "models" / family)
    built = sum(param.numel() for param in model.parameters())
    indices = token_rows_by_module(model, rows)  # in an untied head too
    with_rows = get_peft_model(
        model, LoraConfig(r=8, target_modules="all-linear", trainable_token_indices=indices)
    )
    model = AutoModelForCausalLM.from_pretrained(models / "models" / family)
    without_rows = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear"))

    assert plan["sft"].memory.trainable_params == trainable(with_rows)
    assert plan["fsdp_lora"].memory.trainable_params == trainable(without_rows)  # fsdp: no rows train
    assert plan["full"].memory.trainable_params == built
    assert (plan["sft"].lm_head.path, plan["dpo"].lm_head.path) == (PLAIN, PLAIN)  # peft wraps the head
    assert (plan["full"].lm_head.path, plan["fsdp_lora"].lm_head.path) == (FUSED, FUSED)
    if family in SHARDED:
        assert plan["fsdp_full"].memory.trainable_params == built


@pytest.fixture(scope="module", params=list(FAMILIES))
def ran(request, models) -> tuple[str, Path]:
    """(the family, its pipeline file), run once for every test of the family."""
    path = pipeline_file(models, request.param)
    run(path)
    return request.param, path


def test_each_mode_trains(ran):
    family, path = ran
    metrics = {name: stage_record(path, name)["metrics"] for name in stages(family)}
    for name in ("sft", "dpo", "full", "fsdp_lora"):
        assert metrics[name]["trainable_changed"] == 1.0, name
    for name in ("sft", "full", "fsdp_lora"):
        assert metrics[name]["eval_loss_after"] < metrics[name]["eval_loss_before"], name
    assert metrics["merge"]["merge_max_abs_logit_delta"] <= 1e-4
    if family in SHARDED:
        fsdp_holds_the_planned_shard(path, "fsdp_full")


def fsdp_holds_the_planned_shard(path: Path, name: str) -> None:
    planned = {row["what"]: row["device"] for row in stage_record(path, name)["memory_plan"]}
    reports = placement_reports(path, name)
    assert [report["rank"] for report in reports] == [0, 1]
    for report in reports:
        assert report["param_elements_local"] == pytest.approx(
            report["param_elements_total"] / 2, rel=TOLERANCE
        )
    for held in sorted((stage_folder(path, name) / "logs").glob("fsdp-rank*.json")):
        bytes_held = json.loads(held.read_text())["models"][0]["param_storage_bytes"]
        assert bytes_held == pytest.approx(planned["parameters"], rel=TOLERANCE), held.name


def chats(model: torch.nn.Module, tokenizer) -> None:
    """The template renders a prompt the model completes: greedy, a few tokens past the prompt."""
    assert tokenizer.chat_template == CHATML.text and tokenizer.eos_token == CHATML.eos
    prompt = tokenizer.apply_chat_template(
        HI, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    assert prompt["input_ids"][0, 0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    out = model.eval().generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > prompt["input_ids"].shape[1]


def test_what_each_mode_writes_carries_the_template_and_chats_in_plain_transformers(ran):
    family, path = ran
    base = path.parent / "models" / family
    rows = AutoModelForCausalLM.from_pretrained(base).get_input_embeddings().weight.detach()
    for name in ("sft", "dpo", "fsdp_lora"):
        adapter = stage_folder(path, name) / "adapter"
        tokenizer = AutoTokenizer.from_pretrained(adapter)
        model = AutoModelForCausalLM.from_pretrained(base)
        model.resize_token_embeddings(len(tokenizer))  # peft loads onto a base with the tokenizer's rows
        chats(PeftModel.from_pretrained(model, adapter), tokenizer)
        saved = load_file(adapter / "adapter_model.safetensors")
        deltas = [tensor for key, tensor in saved.items() if "trainable_tokens_delta" in key]
        if name == "fsdp_lora":
            assert deltas == []  # the rows stay as loaded under fsdp, as the plan says
            continue
        ids = tokenizer.convert_tokens_to_ids(list(CHATML.special_tokens))
        assert len(deltas) == (1 if tied_head(base) else 2), (
            name
        )  # the embeddings' rows, and an untied head's
        assert not torch.allclose(deltas[0], rows[ids]), name  # the rows trained
    for name in ("merge", "full"):
        folder = stage_folder(path, name) / "model"
        tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)
        assert model.generation_config.eos_token_id[0] == tokenizer.convert_tokens_to_ids(CHATML.eos)
        chats(model, tokenizer)
