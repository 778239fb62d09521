"""`align plan`: backend choice with its reason, model placement, and memory per rank, with no weights."""

import pytest

from align import spec
from align.cli import main
from align.models import resolve_model
from align.plan import Hardware, build

GB = 10**9


def plan_output(capsys, path: str, *args: str) -> str:
    assert main(["plan", path, *args]) == 0
    return capsys.readouterr().out


def plan_of(path: str, memory: str, *overrides: str):
    return build(
        spec.load(path, list(overrides)),
        Hardware(accelerator=True, device_memory=int(memory) * GB, bf16=True),
    )


def test_13b_shows_the_textbook_figures_and_the_master_copy(capsys):
    stage = plan_of("tests/plans/llama2_13b_full.yaml", "80").stages["sft"]
    ddp = stage.memory_by_backend["ddp"].device
    assert round(ddp.params / GB) == 26 and round(ddp.grads / GB) == 26 and round(ddp.optimizer / GB) == 104
    assert round(ddp.master / GB) == 52
    assert round(ddp.model_states / GB) == 208  # 16 bytes per parameter, as in the ZeRO paper
    zero2 = stage.memory_by_backend["zero2"].device.model_states
    fsdp = stage.memory_by_backend["fsdp"].device.model_states
    psi = 13_015_864_320
    # DeepSpeed's own estimate, not the paper's 2Ψ + 14Ψ/N: at the step it holds the fp32 copy of the
    # gradient partition (4Ψ/N) beside the 16-bit one; `make bench` measured it (align/memory.py).
    assert zero2 == pytest.approx(2 * psi + 18 * psi / 8, rel=1e-6)
    assert fsdp == pytest.approx(16 * psi / 8, rel=1e-6)
    out = plan_output(capsys, "tests/plans/llama2_13b_full.yaml", "--device-memory", "80GB")
    for figure in ("26.0 GB", "104 GB", "52.1 GB", "208 GB"):
        assert figure in out


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
    for backend, placement in (("zero2", "replicated"), ("fsdp", "sharded like the policy")):
        plan = plan_of("tests/plans/llama2_13b_dpo_full.yaml", "80", f"defaults.backend={backend}")
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
