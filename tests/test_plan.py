"""`align plan`: backend choice with its reason, model placement, and memory per rank, with no weights."""

import pytest
import trl

from align.cli import main
from align.config.spec import SFTStage
from align.models.architectures import PRESETS
from align.models.loading import resolve_model
from align.models.memory import Workload, describe_workload, format_bytes, parse_memory
from align.pipeline.file import load
from align.planning.hardware import Hardware
from align.planning.placement import (
    REFERENCE_ADAPTERS_DISABLED,
    REFERENCE_COPY,
    REFERENCE_NONE,
    REWARD_MODELS_REPLICATED,
    REWARD_MODELS_SHARDED,
    VALUE_ADAPTER,
    VALUE_HEAD,
)
from align.planning.plan import build, choose_backend

GB = 10**9


def plan_output(capsys, path: str, *args: str) -> str:
    assert main(["plan", path, *args]) == 0
    return capsys.readouterr().out


def plan_of(path: str, memory: str, *overrides: str):
    return build(
        load(path, list(overrides)),
        Hardware(accelerator=True, device_memory=int(memory) * GB, bf16=True),
    )


def test_13b_shows_the_textbook_total_as_mixed_precision_holds_it(capsys):
    stage = plan_of("tests/plans/llama2_13b_full.yaml", "80").stages["sft"]
    ddp = stage.memory_by_backend["ddp"].device
    # fp32 weights autocast to bf16: no separate master copy under DDP, ZeRO-2's is DeepSpeed's partition
    assert round(ddp.params / GB) == 52 and round(ddp.grads / GB) == 52 and round(ddp.optimizer / GB) == 104
    assert ddp.master == 0
    assert round(ddp.model_states / GB) == 208  # 16 bytes per parameter, as in the ZeRO paper
    zero2 = stage.memory_by_backend["zero2"].device.model_states
    fsdp = stage.memory_by_backend["fsdp"].device.model_states
    psi = 13_015_864_320
    # DeepSpeed's own estimate, not the paper's 2Ψ + 14Ψ/N: at the step it holds the fp32 copy of the
    # gradient partition (4Ψ/N) beside the 16-bit one; `make bench` measured it (align/models/memory.py).
    assert zero2 == pytest.approx(2 * psi + 18 * psi / 8, rel=1e-6)
    assert fsdp == pytest.approx(16 * psi / 8, rel=1e-6)
    assert stage.memory_by_backend["zero2"].device.master == pytest.approx(4 * psi / 8, rel=1e-6)
    out = plan_output(capsys, "tests/plans/llama2_13b_full.yaml", "--device-memory", "80GB")
    for figure in ("52.1 GB", "104 GB", "208 GB"):
        assert figure in out
    assert "precision=bf16 (mixed: fp32 weights and Adam state, bf16 compute)" in out


def test_auto_picks_zero2_with_offload_for_8b_qlora():
    plan = plan_of("pipelines/dpo_llama3.yaml", "24")
    for name in ("sft", "dpo"):
        stage = plan.stages[name]
        assert stage.backend == "zero2"
        assert "QLoRA" in stage.backend_reason and "offload" in stage.backend_reason
        assert stage.memory is stage.memory_by_backend["zero2+offload"]
        assert stage.memory.device.optimizer == 0 and stage.memory.host.optimizer > 0


def test_auto_picks_fsdp_for_70b_full_parameters_on_8x80gb():
    stage = plan_of("pipelines/sft_llama3_70b.yaml", "80").stages["sft"]
    assert stage.backend == "fsdp"
    assert "ZeRO-2 needs" in stage.backend_reason and "FSDP needs" in stage.backend_reason
    assert stage.memory.total < 72 * GB  # parameters offloaded to the host, as the file asks


def test_lora_dpo_reference_is_the_base_with_adapters_disabled(capsys):
    resolve_model("tiny")  # once built, the plan reads its config.json
    out = plan_output(capsys, "pipelines/tiny_sft_dpo_merge.yaml")
    assert "reference: the policy's base with adapters disabled (no copy)" in out
    dpo = plan_of("pipelines/tiny_sft_dpo_merge.yaml", "80").stages["dpo"]
    assert dpo.memory_by_backend["ddp"].device.frozen == 0


def test_full_parameter_dpo_reference_is_a_copy_sharded_under_fsdp():
    # on 141 GB devices (H200) the copy fits beside ZeRO-2's 59 GB; on 80 GB ones it is precomputed instead
    for backend, placement in (("zero2", "replicated"), ("fsdp", "sharded like the policy")):
        plan = plan_of("tests/plans/llama2_13b_dpo_full.yaml", "141", f"defaults.backend={backend}")
        stage = plan.stages["dpo"]
        assert placement in stage.placement.description["reference"]
        frozen = stage.memory_by_backend[backend].device.frozen
        assert frozen == pytest.approx(2 * 13_015_864_320 / (8 if backend == "fsdp" else 1), rel=1e-6)


def test_a_bad_device_memory_is_a_user_error(capsys):
    assert main(["plan", "pipelines/tiny_sft_dpo_merge.yaml", "--device-memory", "lots"]) == 2
    assert "device memory 'lots'" in capsys.readouterr().err


def test_a_full_parameter_reference_that_does_not_fit_is_precomputed_instead():
    ample = plan_of("tests/plans/llama3_8b_dpo_full.yaml", "1000").stages["dpo"]
    assert ample.placement.reference == "frozen-copy"
    frozen = ample.memory.device.frozen
    assert frozen == pytest.approx(2 * 8_030_261_248, rel=1e-6)  # a bf16 copy on every ZeRO-2 rank
    tight_gb = int((ample.memory.total - frozen / 2) / 0.9 / GB)  # the policy fits, policy + copy does not
    tight = plan_of("tests/plans/llama3_8b_dpo_full.yaml", str(tight_gb)).stages["dpo"]
    assert tight.placement.reference == "precomputed"
    assert "precomputed" in tight.placement.description["reference"]
    assert tight.memory.device.frozen == 0 and tight.memory.total == ample.memory.total - frozen


LLAMA3_8B = PRESETS["llama3-8b"]
PSI_8B = 8_030_261_248
REWARD_8B = PSI_8B - 128_256 * 4096 + 4096  # the lm_head gives way to a hidden -> 1 score head


def test_ppo_lora_reference_is_the_base_and_a_value_adapter_doubles_the_trainable_parameters():
    adapter = plan_of("pipelines/ppo_llama3.yaml", "80").stages["ppo"]
    head = plan_of("pipelines/ppo_llama3.yaml", "80", "stages.ppo.value=head").stages["ppo"]
    lora = LLAMA3_8B.lora_param_count(16, "all-linear")
    value_head = 4096 + 1
    assert adapter.placement.reference == head.placement.reference == REFERENCE_ADAPTERS_DISABLED
    assert (adapter.placement.value, head.placement.value) == (VALUE_ADAPTER, VALUE_HEAD)
    assert adapter.memory.trainable_params == 2 * lora + value_head
    assert head.memory.trainable_params == lora + value_head
    # one optimizer holds both adapters: ZeRO-Offload's fp32 moments on the host grow by 8 bytes each
    assert adapter.memory.host.optimizer - head.memory.host.optimizer == 8 * lora // 8
    # the critic's own pass through the 32 checkpointed layers: 4 x (512 + 512) tokens of 4096 bf16
    extra_pass = 32 * 4 * (512 + 512) * 4096 * 2
    assert adapter.memory.device.activations - head.memory.device.activations == extra_pass
    # no reference copy under LoRA: the frozen bytes are the reward model's alone, on every rank
    assert adapter.memory.device.frozen == 2 * REWARD_8B
    assert adapter.placement.reward_models == REWARD_MODELS_REPLICATED


def test_a_qlora_ppo_plans_its_upcast_base_and_a_qlora_sft_does_not():
    """align's PPO prepares its 4-bit base with peft (unpacked weights in fp32); TRL's SFT keeps bf16."""
    qlora = (
        "stages.sft.lora.load_in_4bit=true",
        "stages.ppo.lora.load_in_4bit=true",
        "stages.ppo.value=head",
        "defaults.backend=ddp",  # adapters in fp32 beside the base, as a single GPU holds them
    )
    stages = plan_of("pipelines/ppo_llama3.yaml", "80", *qlora).stages
    unpacked = LLAMA3_8B.param_count() - LLAMA3_8B.linear_weight_count()
    base = {
        name: stages[name].memory.device.params - 4 * stages[name].memory.trainable_params
        for name in ("sft", "ppo")
    }
    assert base["ppo"] - base["sft"] == 2 * unpacked == 2_101_878_784  # fp32 where SFT holds bf16


def test_full_parameter_ppo_shards_its_reference_and_reward_model_under_fsdp():
    plans = {
        backend: plan_of("tests/plans/llama3_8b_ppo_full.yaml", "80", f"defaults.backend={backend}")
        for backend in ("ddp", "fsdp")
    }
    ddp, fsdp = plans["ddp"].stages["ppo"], plans["fsdp"].stages["ppo"]
    assert ddp.placement.reference == fsdp.placement.reference == REFERENCE_COPY
    assert (ddp.placement.reward_models, fsdp.placement.reward_models) == (
        REWARD_MODELS_REPLICATED,
        REWARD_MODELS_SHARDED,
    )
    assert dict((role, device) for role, device, _ in ddp.memory.frozen_by_role) == {
        "reference": 2 * PSI_8B,
        "rewards[1]": 2 * REWARD_8B,  # rewards[0] is a function: no model memory
    }
    assert fsdp.memory.device.frozen == pytest.approx(2 * (PSI_8B + REWARD_8B) / 8, abs=2)
    assert ddp.memory.trainable_params == PSI_8B + 4096 + 1  # the value head trains with the policy


def test_grpo_counts_a_reference_copy_only_with_a_kl_term():
    default = plan_of("tests/plans/llama3_8b_grpo_full.yaml", "80").stages["grpo"]
    kl = plan_of("tests/plans/llama3_8b_grpo_full.yaml", "80", "stages.grpo.trl.beta=0.04").stages["grpo"]
    rloo = plan_of("tests/plans/llama3_8b_grpo_full.yaml", "80", "stages.grpo.kind=rloo").stages["grpo"]
    assert trl.GRPOConfig.beta == 0 < trl.RLOOConfig.beta  # TRL's defaults, which the plan follows
    assert default.placement.reference == REFERENCE_NONE
    assert kl.placement.reference == rloo.placement.reference == REFERENCE_COPY
    # the reward model is a hub id without a preset: taken to be the policy's trunk as a classifier
    assert default.memory.device.frozen == 2 * REWARD_8B
    assert kl.memory.device.frozen == rloo.memory.device.frozen == 2 * REWARD_8B + 2 * PSI_8B


def test_grpo_keeps_its_reward_model_whole_on_every_rank_even_under_fsdp():
    """TRL scores rewards on each rank alone, so only the KL reference is sharded with the policy."""
    overrides = ("defaults.backend=fsdp", "stages.grpo.trl.beta=0.04")
    fsdp = plan_of("tests/plans/llama3_8b_grpo_full.yaml", "80", *overrides).stages["grpo"]
    assert fsdp.placement.reward_models == REWARD_MODELS_REPLICATED
    assert "frozen reward model, replicated on every rank" in fsdp.placement.description["rewards"]
    assert fsdp.memory.device.frozen == pytest.approx(2 * REWARD_8B + 2 * PSI_8B / 8, abs=2)


def test_plan_shows_the_ppo_roles_and_their_bytes(capsys):
    out = plan_output(capsys, "pipelines/ppo_llama3.yaml", "--device-memory", "80GB")
    ppo = out[out.index("kind=ppo") :]
    assert "reference: the policy's base with adapters disabled (no copy)" in ppo
    assert "rewards: rewards[0] ${stages.rm.output}: frozen reward model, replicated on every rank" in ppo
    assert "value: its own LoRA adapter" in ppo
    row = next(line for line in ppo.splitlines() if line.strip().startswith("rewards[0]"))
    assert row.split()[1:3] == format_bytes(2 * REWARD_8B).split()


# ---- `backend: auto`, one stage at a time: offered backends priced as they would run ------------------


def auto_choice(model, workload: Workload, *, world_size: int, device_memory: int) -> tuple[str, str]:
    """The plan's `auto` choice for a stage that trains `workload` (LoRA when it has a rank)."""
    lora = {"r": workload.lora_rank, "load_in_4bit": workload.quantize_4bit} if workload.lora_rank else None
    stage = SFTStage(kind="sft", data={"train": "unused.jsonl"}, lora=lora)

    def price(backend):
        return backend.estimates(model, workload, world_size, stage)[backend.option(stage)]

    hardware = Hardware(accelerator=True, device_memory=device_memory, bf16=True)
    what = describe_workload(model, workload)
    return choose_backend(stage, "stages.sft", world_size, "bf16", hardware, price, what)


def test_auto_picks_zero2_for_8b_qlora() -> None:
    workload = Workload(lora_rank=16, quantize_4bit=True, seq_len=2048, gradient_checkpointing=True)

    backend, reason = auto_choice(
        PRESETS["llama3-8b"], workload, world_size=1, device_memory=parse_memory("24GB")
    )

    assert backend == "zero2"
    assert reason == (
        "QLoRA r=16 (41.9M trainable) on 8.03B: ZeRO-2 with CPU optimizer offload needs "
        "9.56 GB/rank <= 21.6 GB usable (90% of 24.0 GB)"
    )


def test_auto_picks_fsdp_for_70b_full_on_8x80gb_and_says_it_does_not_fit() -> None:
    backend, reason = auto_choice(
        PRESETS["llama3-70b"], Workload(), world_size=8, device_memory=parse_memory("80GB")
    )

    assert backend == "fsdp"
    assert reason.startswith("full-parameter 70.6B on 8 ranks does not fit: ZeRO-2 needs 300 GB/rank; ")
    assert "FSDP needs 141 GB/rank, 69.1 GB over 72.0 GB usable" in reason


@pytest.mark.parametrize(
    ("model", "world_size", "expected", "needs"),
    [
        ("llama3-70b", 64, "fsdp", "FSDP needs 17.6 GB/rank"),
        ("llama2-13b", 8, "fsdp", "ZeRO-2 fits (55.3 GB/rank) but copies all 26.0 GB of weights"),
        ("llama3-8b", 8, "zero2", "ZeRO-2 needs 34.1 GB/rank"),
    ],
)
def test_auto_full_parameter(model: str, world_size: int, expected: str, needs: str) -> None:
    backend, reason = auto_choice(
        PRESETS[model], Workload(), world_size=world_size, device_memory=parse_memory("80GB")
    )

    assert (backend, needs in reason) == (expected, True), reason


def test_auto_uses_ddp_on_one_rank_when_it_fits() -> None:
    assert auto_choice(100_000_000, Workload(), world_size=1, device_memory=parse_memory("80GB")) == (
        "ddp",
        "full-parameter 100M on 1 rank: DDP needs 1.60 GB/rank <= 72.0 GB usable (90% of 80.0 GB)",
    )


def test_a_builtin_not_built_at_plan_time_is_priced_at_launch_under_the_planned_backend(
    tmp_path, monkeypatch
):
    """A fresh machine plans the demo before its tiny model exists: no memory plan then. By launch the
    model is built, and the record gets the bytes a plan made now would show, for the backend chosen then."""
    from align.planning import launch
    from align.planning.plan import ModelInput, StageInputs
    from align.run.disk import disk_need

    def priced_at_launch(pipeline, stage):  # the stage launched on its planned model
        return launch.priced(pipeline, launch.launch_of(stage, StageInputs(ModelInput(stage.model_source))))

    monkeypatch.setenv("ALIGN_CACHE", str(tmp_path))
    cpu = Hardware(accelerator=False, device_memory=80 * GB)
    before = build(load("pipelines/tiny_sft_dpo_merge.yaml"), cpu)
    assert all(stage.memory is None for stage in before.stages.values())
    resolve_model("tiny")
    after = build(load("pipelines/tiny_sft_dpo_merge.yaml"), cpu)
    for name in ("sft", "dpo"):
        stage = priced_at_launch(before.pipeline, before.stages[name])
        priced = stage.memory
        assert before.stages[name].backend == after.stages[name].backend
        assert priced is not None and priced.rows() == after.stages[name].memory.rows()
        assert disk_need(stage) is not None  # the disk check before training has bytes to count too
    assert priced_at_launch(before.pipeline, before.stages["merge"]).memory is None  # a merge trains nothing
