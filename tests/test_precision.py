"""`precision: bf16` is mixed precision (fp32 weights and Adam state, bf16 compute); `bf16-pure` is the
opt-in to bf16 weights and Adam state, whose small updates are lost; a stage publishes in its input's dtype.

Training runs without Ray on the tiny model: one rank under ddp in this process, two under fsdp spawned
on gloo. bf16 autocast works on CPU.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from align.cli import main
from align.data.loading import load_data
from align.errors import ConfigError
from align.models.loading import load_causal_lm, load_tokenizer, resolve_model
from align.models.precision import PURE_RISK
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.launch import launch_of
from align.planning.plan import ModelInput, StageInputs, StagePlan, build
from align.run.inputs import resolve_inputs
from align.stages import runner_for
from align.stages.context import StageContext

CPU = Hardware(accelerator=False, device_memory=80 * 10**9)
STEPS = 40
MOVED = 0.005
"""lr 1e-3 for 40 steps moves RMSNorm weights by about 0.02 in fp32; bf16 cannot store a change below 2^-8
(0.0039) of a weight at 1.0, so under pure bf16 each Adam step of at most lr rounds back to 1.0."""


def write_sft_pipeline(folder: Path, precision: str, steps: int = STEPS, **fields) -> Path:
    """One SFT stage on the tiny model, lr 1e-3, micro batch 2 of 32 tokens, seed 0."""
    trl = {
        "max_steps": steps,
        "learning_rate": 1e-3,
        "per_device_train_batch_size": 2,
        "max_length": 32,
        "logging_steps": steps,
        "save_strategy": "no",
        "report_to": "none",
    }
    body = {
        "name": "precision",
        "base_model": "tiny",
        "defaults": {"output_root": str(folder), "precision": precision, "seed": 0, "backend": "ddp"},
        "stages": {
            "sft": {
                "kind": "sft",
                # 32 tokens keep a step cheap; what the cut leaves of the rows is not what is measured
                "data": {
                    "train": "align:chatterbot/sft/train",
                    "max_train_rows": 64,
                    "max_emptied_share": 1.0,
                    "max_cut_answers_share": 1.0,
                },
                "trl": trl,
            }
            | fields
        },
    }
    path = folder / "precision.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def sft_plan(folder: Path, precision: str, steps: int = STEPS, **fields) -> StagePlan:
    plan = build(load(write_sft_pipeline(folder, precision, steps, **fields)), CPU).stages["sft"]
    return plan


def run_in_process(plan: StagePlan, output_dir: Path) -> dict:
    """Run the stage's runner here and return rank 0's placement report (dtypes held after step 1)."""
    launch = launch_of(plan, resolve_inputs(plan, {}))
    runner_for(plan.kind).run(StageContext(plan=plan, output_dir=output_dir, launch=launch))
    return json.loads((output_dir / "logs" / "placement-rank0.json").read_text())


def rmsnorm_drift(model_dir: Path) -> float:
    """The largest |w - 1| over every RMSNorm weight of a saved model (they start at exactly 1.0)."""
    with safe_open(str(model_dir / "model.safetensors"), "pt") as weights:
        norms = [weights.get_tensor(name).float() for name in weights.keys() if "norm" in name]
    assert len(norms) == 5  # 2 per layer of the 2-layer tiny Llama, and the final one
    return max(float((norm - 1).abs().max()) for norm in norms)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("precision", "weights", "moments"),
    [("bf16", "float32", "float32"), ("bf16-pure", "bfloat16", "bfloat16")],
)
def test_mixed_bf16_moves_rmsnorm_weights_that_pure_bf16_leaves_at_one(tmp_path, precision, weights, moments):
    report = run_in_process(sft_plan(tmp_path, precision), tmp_path / "out")

    assert (report["trainable_dtypes"], report["optimizer_state_dtypes"]) == ([weights], [moments])
    drift = rmsnorm_drift(tmp_path / "out" / "model")
    if precision == "bf16":
        assert drift > MOVED
    else:
        assert drift == 0.0  # every update lost: no fp32 master copy


@pytest.mark.integration
@pytest.mark.parametrize("four_bit", [False, True], ids=["lora", "qlora"])
def test_lora_under_bf16_trains_fp32_adapters_on_a_frozen_bf16_base(tmp_path, four_bit):
    """PEFT upcasts LoRA adapters to fp32; TRL casts QLoRA's to bf16, and align holds them in fp32 again."""
    lora = {"r": 4, "load_in_4bit": four_bit}
    report = run_in_process(sft_plan(tmp_path, "bf16", steps=2, lora=lora), tmp_path / "out")

    assert report["trainable_dtypes"] == ["float32"]
    assert report["optimizer_state_dtypes"] == ["float32"]
    assert report["frozen_dtypes"] == (["bfloat16", "uint8"] if four_bit else ["bfloat16"])


@pytest.mark.integration
def test_a_merge_of_a_bf16_input_is_checked_in_fp32_and_published_in_bf16(tmp_path):
    from peft import LoraConfig, get_peft_model

    base = tmp_path / "base-bf16"
    load_causal_lm(resolve_model("tiny"), dtype=torch.bfloat16).save_pretrained(base)
    torch.manual_seed(0)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(load_causal_lm(str(base)), config).save_pretrained(tmp_path / "adapter")
    load_tokenizer(resolve_model("tiny")).save_pretrained(tmp_path / "adapter")  # as a stage saves it
    sft = {"kind": "sft", "data": {"train": "align:chatterbot/sft/train"}, "lora": {"r": 4}}
    merge = {"kind": "merge", "model": "${stages.sft.output}"}
    body = {"name": "m", "base_model": str(base), "stages": {"sft": sft, "merge": merge}}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(body))  # only the merge runs, on the adapter made here
    plan = build(load(tmp_path / "m.yaml"), CPU).stages["merge"]
    launch = launch_of(plan, StageInputs(ModelInput(str(base), (str(tmp_path / "adapter"),))))

    result = runner_for("merge").run(StageContext(plan=plan, output_dir=tmp_path / "out", launch=launch))

    assert plan.precision == "fp32" and result.metrics["merge_max_abs_logit_delta"] < 1e-4
    model = tmp_path / "out" / "model"
    with safe_open(str(model / "model.safetensors"), "pt") as weights:
        assert {weights.get_tensor(name).dtype for name in weights.keys()} == {torch.bfloat16}
    assert json.loads((model / "config.json").read_text())["dtype"] == "bfloat16"


def test_plan_prints_precision_as_it_runs_and_the_risk_of_pure_bf16(tmp_path, capsys):
    resolve_model("tiny")  # the plan reads its config once it is built
    mixed = sft_plan(tmp_path, "bf16").memory
    pure = sft_plan(tmp_path, "bf16-pure").memory
    psi = mixed.trainable_params

    assert (mixed.device.params, mixed.device.grads, mixed.device.optimizer) == (4 * psi, 4 * psi, 8 * psi)
    assert mixed.device.model_states == 16 * psi and mixed.device.master == 0
    assert pure.device.model_states == 8 * psi  # bf16 weights, grads and both moments
    assert main(["plan", str(write_sft_pipeline(tmp_path, "bf16"))]) == 0
    out = capsys.readouterr().out
    assert "precision=bf16 (mixed: fp32 weights and Adam state, bf16 compute)" in out
    assert "risk:" not in out
    assert main(["plan", str(write_sft_pipeline(tmp_path, "bf16-pure"))]) == 0
    out = capsys.readouterr().out
    assert "precision=bf16-pure (bf16 weights and Adam state, no fp32 master copy)" in out
    assert f"    risk: {PURE_RISK}" in out


def test_zero2_runs_mixed_bf16_with_its_own_fp32_master_and_refuses_bf16_pure(tmp_path):
    zero2 = sft_plan(tmp_path, "bf16", backend="zero2")
    assert zero2.trainable_dtype == "bf16"  # DeepSpeed casts the weights and steps its fp32 partition
    assert zero2.memory.device.master > 0
    with pytest.raises(ConfigError, match="zero2 always keeps an fp32 master copy"):
        sft_plan(tmp_path, "bf16-pure", backend="zero2")
    with pytest.raises(ConfigError, match=r"defaults\.precision: bf16-pure is for full-parameter training"):
        sft_plan(tmp_path, "bf16-pure", lora={"r": 4})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def sft_on_rank(rank: int, port: int, plan: StagePlan, output_dir: str) -> None:
    """One of 2 ranks running the stage's runner as a Ray Train worker does, on a gloo group of its own."""
    import torch.distributed as dist

    os.environ.update(
        RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    dist.init_process_group("gloo")
    try:
        launch = launch_of(plan, resolve_inputs(plan, {}))
        runner_for(plan.kind).run(
            StageContext(plan=plan, output_dir=Path(output_dir), rank=rank, launch=launch)
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
@pytest.mark.slow  # two 2-rank runs of 40 steps: `make test-slow`, with the other 2-rank backend suites
def test_fsdp_mixed_bf16_steps_fp32_shards_that_pure_bf16_cannot_move(tmp_path):
    load_data("align:chatterbot/sft/train", "sft", "data")  # built once, before two ranks race for it
    for precision, weights in (("bf16", "float32"), ("bf16-pure", "bfloat16")):
        folder = tmp_path / precision
        folder.mkdir()
        plan = sft_plan(folder, precision, backend="fsdp", workers=2)
        torch.multiprocessing.spawn(sft_on_rank, args=(free_port(), plan, str(folder / "out")), nprocs=2)
        logs = folder / "out" / "logs"
        for rank in (0, 1):
            report = json.loads((logs / f"placement-rank{rank}.json").read_text())
            assert report["dtensor_params"] > 0  # sharded, not DDP
            assert (report["trainable_dtypes"], report["optimizer_state_dtypes"]) == ([weights], [weights])
        drift = rmsnorm_drift(folder / "out" / "model")
        assert drift > MOVED if precision == "bf16" else drift == 0.0, (precision, drift)
