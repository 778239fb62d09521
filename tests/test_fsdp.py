"""The fsdp backend: parameters really sharded (not DDP in disguise), a plain saved model, an exact resume.

Integration tests run 2 ranks through the real CLI (Ray Train, gloo on CPU); the rest are unit tests.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from align.backends import BACKENDS, fsdp_shards
from align.config.spec import FSDPSpec
from align.errors import ConfigError
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.plan import build
from tests.pipelines import (
    PREF_DATA,
    placement_reports,
    run,
    stage,
    stage_folder,
    stage_record,
    write_pipeline,
)

CPU = Hardware(accelerator=False, device_memory=80 * 2**30)
CONSTANT_LR = {"lr_scheduler_type": "constant"}
FSDP = BACKENDS["fsdp"]
PRESET = Path(__file__).resolve().parents[1] / "configs" / "fsdp" / "fsdp2.yaml"


def fsdp_pipeline(folder: Path, name: str, stages: dict[str, dict], **defaults) -> Path:
    """A pipeline whose stages run under fsdp on 2 ranks, in fp32 with a fixed seed."""
    settings = {"backend": "fsdp", "workers": 2, "precision": "fp32", "seed": 0, **defaults}
    return write_pipeline(folder, name, stages, **settings)


def stage_plan(folder: Path, **fields):
    """The plan of a one-stage SFT pipeline on this CPU, with `fields` set on the stage."""
    path = fsdp_pipeline(folder, "unit", {"sft": stage("sft", **fields)})
    return build(load(path), CPU).stages["sft"]


def metrics_by_step(path: Path, stage_name: str) -> dict[int, float]:
    """Training loss per optimizer step, from the stage's logs/metrics.jsonl."""
    lines = (stage_folder(path, stage_name) / "logs" / "metrics.jsonl").read_text().splitlines()
    return {entry["step"]: entry["loss"] for entry in map(json.loads, lines) if "loss" in entry}


def fsdp_reports(path: Path, stage_name: str) -> list[dict]:
    """Each rank's `logs/fsdp-rank{R}.json`: every model that rank sharded."""
    logs = stage_folder(path, stage_name) / "logs"
    return [json.loads(p.read_text()) for p in sorted(logs.glob("fsdp-rank*.json"))]


def assert_sharded(facts: dict) -> None:
    """Half of the parameters on each of 2 ranks, held as DTensors; DDP would hold all of them."""
    assert facts["dtensor_params"] > 0, facts
    assert facts["param_elements_local"] == pytest.approx(facts["param_elements_total"] / 2, rel=0.02), facts


def assert_memory_sharded(model: dict) -> None:
    """Half of the parameter bytes on each of 2 ranks, counted in the storages behind the shards."""
    assert model["param_storage_bytes"] == pytest.approx(model["param_bytes_total"] / 2, rel=0.02), model


def assert_trained_sharded(reports: list[dict]) -> None:
    """Both ranks hold half the parameters and half the AdamW states (two moments per local element)."""
    assert [r["rank"] for r in reports] == [0, 1]
    for facts in reports:
        assert_sharded(facts)
        assert facts["optimizer_state_elements_local"] == 2 * facts["param_elements_local"], facts


# ---- unit tests ----------------------------------------------------------------------------------------


def test_verify_refuses_an_unsharded_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config)
    plan = SimpleNamespace(name="sft", workers=2)
    total = sum(p.numel() for p in model.parameters())
    with pytest.raises(RuntimeError, match="stage 'sft'") as refused:
        fsdp_shards.verify(model, plan)
    assert f"about {total / 2:,.0f} of the {total:,}" in str(refused.value)
    assert f"this rank holds {total:,} (0 DTensor parameters)" in str(refused.value)


@pytest.mark.parametrize(
    ("fields", "defaults", "path"),
    [
        ({"lora": {"r": 4, "load_in_4bit": True}}, {}, "stages.sft.lora.load_in_4bit: fsdp shards"),
        ({}, {"workers": 1}, "stages.sft.workers"),
        ({"trl": {"resume_from_checkpoint": "/nonexistent"}}, {}, "stages.sft.trl.resume_from_checkpoint"),
        ({"fsdp": {"mixed_precision": "fp16"}}, {}, "stages.sft.fsdp.mixed_precision"),
    ],
)
def test_what_fsdp_cannot_do_is_refused_at_plan_time_with_the_yaml_path(
    tmp_path, capsys, fields, defaults, path
):
    """Refused by `align validate`/`plan` before Ray starts, not minutes later inside a worker."""
    from align.cli import main

    pipeline = fsdp_pipeline(tmp_path, "refused", {"sft": stage("sft", **fields)}, **defaults)
    with pytest.raises(ConfigError, match=path.replace(".", r"\.")):
        build(load(pipeline), CPU)
    assert main(["validate", str(pipeline)]) == 2
    assert path in capsys.readouterr().err


def test_settings_follow_the_stage(tmp_path):
    plain = FSDP.model_kwargs(stage_plan(tmp_path))["distributed_config"]
    assert (plain.fsdp_size, plain.fsdp_mixed_precision, plain.fsdp_cpu_offload) == (2, False, False)
    assert FSDP.trainer_args(stage_plan(tmp_path)) == {"save_only_model": True}

    bf16 = FSDP.model_kwargs(stage_plan(tmp_path, fsdp={"mixed_precision": "bf16"}))["distributed_config"]
    assert bf16.fsdp_mixed_precision
    offload = FSDP.model_kwargs(stage_plan(tmp_path, fsdp={"cpu_offload": True}))["distributed_config"]
    assert offload.fsdp_cpu_offload == torch.cuda.is_available()  # on a CPU run the shards are in host memory


def test_preset_documents_the_defaults():
    preset = yaml.safe_load(PRESET.read_text())
    assert preset["backend"] == "fsdp"
    assert FSDPSpec.model_validate(preset["fsdp"]) == FSDPSpec()


# ---- the settings on the live FSDP2 units (2 processes, no Ray) ----------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def unit_facts(model: torch.nn.Module) -> dict:
    """What one training step and one no-grad forward show about the stage's settings."""
    from torch.distributed.tensor import DTensor

    layer = model.model.layers[0]
    attention_dtypes = []
    layer.self_attn.q_proj.register_forward_hook(lambda m, i, out: attention_dtypes.append(str(out.dtype)))
    ids = torch.randint(0, model.config.vocab_size, (2, 16))
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    forwards_per_step = len(attention_dtypes)
    with torch.no_grad():
        model(input_ids=ids)
    return {
        "forwards_per_step": forwards_per_step,  # 2: activation checkpointing recomputes in backward
        "compute_dtype": attention_dtypes[0],
        "sharded_after_forward": isinstance(layer.self_attn.q_proj.weight, DTensor),
        # FSDP2 has no public getter for its prefetch lists
        "forward_prefetch": len(layer._get_fsdp_state()._states_to_forward_prefetch),
    }


def shards_as_views(model: torch.nn.Module) -> None:
    """Make every shard a view into a live tensor twice its size: half the elements, all the bytes."""
    for param in model.parameters():
        local = param._local_tensor
        param._local_tensor = torch.cat([local, local])[: local.size(0)]


def prepare_on_rank(rank: int, port: int, plans: dict, out: str) -> None:
    """One rank: load the tiny model as each plan says, prepare it, and record what its units do and hold.

    Last, `verify` meets shards that are views of whole tensors, as transformers loads them on CPU.
    """
    import torch.distributed as dist

    from align.models.loading import load_causal_lm, resolve_model

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    dist.init_process_group("gloo")
    facts = {}
    for name, plan in plans.items():
        model = FSDP.prepare(load_causal_lm(resolve_model("tiny"), **FSDP.model_kwargs(plan)), plan)
        facts[f"{name} bytes"] = fsdp_shards.held_storage_bytes(model)
        facts[name] = unit_facts(model)
    viewed = load_causal_lm(resolve_model("tiny"), **FSDP.model_kwargs(plans["off"]))
    shards_as_views(viewed)
    try:
        fsdp_shards.verify(viewed, plans["off"])
    except RuntimeError as refused:
        facts["refused"] = str(refused)
    Path(out, f"rank{rank}.json").write_text(json.dumps(facts))
    dist.destroy_process_group()


@pytest.mark.integration
def test_prepare_applies_reshard_prefetch_precision_and_checkpointing(tmp_path):
    from align.models.loading import resolve_model

    resolve_model("tiny")  # build the builtin once, before two ranks race for it
    on = {
        "activation_checkpointing": True,
        "reshard_after_forward": True,
        "prefetch": True,
        "mixed_precision": "bf16",
    }
    off = {
        "activation_checkpointing": False,
        "reshard_after_forward": False,
        "prefetch": False,
        "mixed_precision": "fp32",
    }
    plans = {"on": stage_plan(tmp_path, fsdp=on), "off": stage_plan(tmp_path, fsdp=off)}
    torch.multiprocessing.spawn(prepare_on_rank, args=(free_port(), plans, str(tmp_path)), nprocs=2)
    for rank in (0, 1):
        facts = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert facts["on"] == {
            "forwards_per_step": 2,
            "compute_dtype": "torch.bfloat16",
            "sharded_after_forward": True,
            "forward_prefetch": 1,
        }
        assert facts["off"] == {
            "forwards_per_step": 1,
            "compute_dtype": "torch.float32",
            "sharded_after_forward": False,
            "forward_prefetch": 0,
        }
        # The storages behind the shards hold half the parameter bytes: each shard owns its memory.
        for name in ("on bytes", "off bytes"):
            storage, total = facts[name]
            assert storage == pytest.approx(total / 2, rel=0.02), (name, storage, total)
        assert "the shards are views of larger tensors that stay alive" in facts["refused"]


# ---- SFT through the CLI: sharding, the saved model, and resume ----------------------------------------


@pytest.fixture(scope="module")
def run_a(tmp_path_factory) -> Path:
    """Run A: 8 uninterrupted steps (constant learning rate, fp32, fixed seed)."""
    folder = tmp_path_factory.mktemp("fsdp-sft")
    path = fsdp_pipeline(folder, "fsdp-sft", {"a": stage("sft", steps=8, trl=CONSTANT_LR, samples=4)})
    run(path)
    return path


@pytest.mark.integration
def test_sft_shards_every_rank_and_loss_falls(run_a):
    assert_trained_sharded(placement_reports(run_a, "a"))
    for report in fsdp_reports(run_a, "a"):
        assert_memory_sharded(report["models"][0])
    losses = list(metrics_by_step(run_a, "a").values())
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.2, losses
    metrics = stage_record(run_a, "a")["metrics"]
    assert metrics["eval_loss_after"] < metrics["eval_loss_before"]
    # every rank joined the greedy samples' forwards (one rank alone would hang on the sharded model)
    assert len(stage_record(run_a, "a")["samples"]) == 4


@pytest.mark.integration
def test_saved_model_is_whole_and_loads_in_plain_transformers(run_a):
    from transformers import AutoModelForCausalLM

    from align.models.loading import resolve_model

    saved = stage_folder(run_a, "a") / "model"
    assert (saved / "model.safetensors").is_file()
    assert "distributed_config" not in json.loads((saved / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(saved)
    total = placement_reports(run_a, "a")[0]["param_elements_total"]
    assert sum(p.numel() for p in model.parameters()) == total
    base = AutoModelForCausalLM.from_pretrained(resolve_model("tiny"))
    for (name, trained), initial in zip(model.named_parameters(), base.parameters(), strict=True):
        assert not torch.equal(trained, initial), f"{name} did not change"
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[1, 2, 3]])).logits
    assert torch.isfinite(logits).all()


@pytest.mark.integration
def test_resume_from_a_sharded_checkpoint_matches_the_uninterrupted_run(run_a, tmp_path):
    """B1 is A stopped at step 4 with a checkpoint; B2 resumes it to step 8. Together they match A.

    Two runs: the plan refuses a resume folder that holds no sharded checkpoint (`check_supported`),
    and b1's folder exists only once b1 has run.
    """
    from torch.distributed.checkpoint import FileSystemReader

    checkpoint = tmp_path / "runs" / "fsdp-stop" / "b1" / "checkpoints" / "checkpoint-4"
    stop = {"b1": stage("sft", steps=4, trl={**CONSTANT_LR, "save_strategy": "steps", "save_steps": 4})}
    resume = {"b2": stage("sft", steps=8, trl={**CONSTANT_LR, "resume_from_checkpoint": str(checkpoint)})}
    stopped = fsdp_pipeline(tmp_path, "fsdp-stop", stop)
    run(stopped)
    resumed_path = fsdp_pipeline(tmp_path, "fsdp-resume", resume)
    run(resumed_path)

    uninterrupted = metrics_by_step(run_a, "a")
    first_half = metrics_by_step(stopped, "b1")
    second_half = {step: loss for step, loss in metrics_by_step(resumed_path, "b2").items() if step > 4}
    assert sorted(first_half) == [1, 2, 3, 4] and sorted(second_half) == [5, 6, 7, 8]
    resumed = [{**first_half, **second_half}[step] for step in range(1, 9)]
    expected = [uninterrupted[step] for step in range(1, 9)]
    torch.testing.assert_close(torch.tensor(resumed), torch.tensor(expected), rtol=1e-4, atol=1e-4)

    # The checkpoint holds the sharded optimizer: one DCP file per rank, each Adam moment in 2 chunks.
    # HF's own rank-0 optimizer.pt/scheduler.pt are not written (save_only_model), so nothing competes.
    assert {"model.safetensors", "trainer_state.json", "fsdp_state"} <= {p.name for p in checkpoint.iterdir()}
    assert not (checkpoint / "optimizer.pt").exists() and not (checkpoint / "scheduler.pt").exists()
    shards = sorted(p.name for p in (checkpoint / "fsdp_state").glob("*.distcp"))
    assert shards == ["__0_0.distcp", "__1_0.distcp"]
    stored = FileSystemReader(str(checkpoint / "fsdp_state")).read_metadata().state_dict_metadata
    moments = [key for key in stored if key.startswith("optimizer.state.") and key.endswith(".exp_avg")]
    assert len(moments) == 20  # every parameter of the 2-layer tiny Llama (the tied head shares one)
    assert all(len(stored[key].chunks) == 2 for key in moments)
    assert "scheduler.last_epoch" in stored


# ---- DPO through the CLI: policy and frozen reference both sharded -------------------------------------


@pytest.mark.integration
def test_dpo_shards_the_policy_and_the_reference(tmp_path):
    # held-out pairs are scored one forward at a time, each a collective: keep them few
    data = {**PREF_DATA, "max_eval_rows": 8}
    path = fsdp_pipeline(tmp_path, "fsdp-dpo", {"dpo": stage("dpo", steps=4, data=data)})
    run(path)
    assert_trained_sharded(placement_reports(path, "dpo"))
    for report in fsdp_reports(path, "dpo"):
        assert sorted(model["trainable"] for model in report["models"]) == [False, True]  # reference, policy
        for model in report["models"]:
            assert_sharded(model)
            assert_memory_sharded(model)
    record = stage_record(path, "dpo")
    assert record["status"] == "succeeded"
    assert len(metrics_by_step(path, "dpo")) == 4
    metrics = record["metrics"]
    assert metrics["train_loss_last"] < metrics["train_loss_first"]
    assert metrics["trainable_changed"] == 1.0 and metrics["reference_copy_loaded"] == 1.0


@pytest.mark.integration
def test_lora_shards_the_frozen_base_trains_the_adapters_and_merges(tmp_path):
    """LoRA under fsdp: each rank holds half the frozen base plus the whole (replicated) adapters, the
    loss falls, and the merged model gives the adapter model's logits."""
    sft = stage("sft", steps=6, lora={"r": 8}, trl={**CONSTANT_LR, "learning_rate": 1e-2})
    path = fsdp_pipeline(
        tmp_path, "fsdp-lora", {"sft": sft, "merge": {"kind": "merge", "model": "${stages.sft.output}"}}
    )
    run(path)
    planned = {row["what"]: row["device"] for row in stage_record(path, "sft")["memory_plan"]}
    adapters = placement_reports(path, "sft")[0]["trainable_elements_total"]
    assert planned["gradients"] == 4 * adapters  # fp32 and replicated: each rank holds every gradient
    for report in fsdp_reports(path, "sft"):
        held = report["models"][0]
        base = held["param_elements_total"] - adapters
        assert held["param_elements_local"] == pytest.approx(base / 2 + adapters, rel=0.02), held
        assert held["param_storage_bytes"] == pytest.approx(planned["parameters"], rel=0.01), held
    losses = list(metrics_by_step(path, "sft").values())
    assert len(losses) == 6 and losses[-1] < losses[0], losses
    assert (stage_folder(path, "sft") / "adapter" / "adapter_model.safetensors").is_file()
    assert stage_record(path, "merge")["metrics"]["merge_max_abs_logit_delta"] <= 1e-4


# ---- the same on GPUs (NCCL) ---------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.gpu(devices=2)
def test_sft_shards_every_rank_on_two_gpus(tmp_path):
    path = fsdp_pipeline(tmp_path, "fsdp-gpu", {"sft": stage("sft", steps=4)}, precision="auto")
    run(path)
    assert_trained_sharded(placement_reports(path, "sft"))
    losses = list(metrics_by_step(path, "sft").values())
    assert len(losses) == 4 and losses[-1] < losses[0], losses
