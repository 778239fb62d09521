"""The memory plan's arithmetic: ZeRO headline figures, parameter counts checked against real models.
What live models and optimizers measure against the plan is in tests/test_memory_measured.py."""

from __future__ import annotations

import pytest
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

from align.models.architectures import PRESETS, architecture_for, architecture_from_config
from align.models.memory import (
    FrozenModel,
    StateBytes,
    Workload,
    estimate,
    format_bytes,
    parse_memory,
)

PSI = 13_000_000_000  # the ZeRO paper's 13B example
GB = 10**9
MIXED = Workload(dtype="bf16")
PURE = Workload(dtype="bf16", pure=True)


def tiny_config(**overrides) -> LlamaConfig:
    """GQA (4 query heads, 2 kv heads) so k/v shapes differ from q."""
    shape = dict(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=300,
    )
    return LlamaConfig(**{**shape, **overrides})


def test_13b_ddp_holds_16_bytes_per_param() -> None:
    """Mixed bf16 under DDP: fp32 weights autocast to bf16, fp32 grads and moments, no separate master."""
    plan = estimate(PSI, MIXED, backend="ddp", world_size=8)

    assert plan.device == StateBytes(params=52 * GB, grads=52 * GB, optimizer=104 * GB)
    assert plan.total == 208 * GB
    assert plan.host.total == 0


def test_pure_bf16_holds_8_bytes_per_param_under_ddp_and_fsdp() -> None:
    """bf16 weights, grads and both Adam moments: half of mixed precision's model states."""
    assert estimate(PSI, PURE, backend="ddp", world_size=8).device == StateBytes(
        params=26 * GB, grads=26 * GB, optimizer=52 * GB
    )
    assert estimate(PSI, PURE, backend="fsdp", world_size=8).total == 8 * PSI // 8
    with pytest.raises(ValueError, match="16-bit dtype"):
        Workload(dtype="fp32", pure=True)


def test_13b_zero2_shards_all_but_the_16bit_params_as_deepspeed_counts() -> None:
    """2Ψ + 18Ψ/N, DeepSpeed's own estimate: the paper's 2Ψ + 14Ψ/N misses the fp32 gradient partition."""
    plan = estimate(PSI, MIXED, backend="zero2", world_size=8)

    assert plan.device == StateBytes(
        params=2 * PSI, grads=(2 + 4) * PSI // 8, optimizer=8 * PSI // 8, master=4 * PSI // 8
    )
    assert plan.total == 2 * PSI + 18 * PSI // 8 == 55_250_000_000


def test_13b_zero2_on_one_gpu_is_deepspeeds_260gb() -> None:
    """`estimate_zero2_model_states_mem_needs(13e9, num_gpus_per_node=1)`: 20 bytes/param."""
    assert estimate(PSI, MIXED, backend="zero2", world_size=1).total == 260 * GB


def test_zero2_in_fp32_still_keeps_deepspeeds_fp32_partition() -> None:
    """Measured by `make bench` (fp32, N = 2): 4Ψ + 20Ψ/N, 14 bytes/param, master partition included."""
    plan = estimate(PSI, Workload(dtype="fp32"), backend="zero2", world_size=2)

    assert plan.device == StateBytes(
        params=4 * PSI, grads=(4 + 4) * PSI // 2, optimizer=8 * PSI // 2, master=4 * PSI // 2
    )
    assert plan.total == 14 * PSI


def test_13b_fsdp_shards_everything() -> None:
    plan = estimate(PSI, MIXED, backend="fsdp", world_size=8)

    assert plan.total == 16 * PSI // 8 == 26 * GB


def test_zero2_offload_keeps_only_16bit_params_on_device() -> None:
    plan = estimate(PSI, MIXED, backend="zero2", world_size=8, offload_optimizer=True)

    assert plan.device == StateBytes(params=2 * PSI)
    assert plan.host == StateBytes(grads=4 * PSI // 8, optimizer=8 * PSI // 8, master=4 * PSI // 8)


def test_zero2_offload_in_fp32_keeps_the_master_partition_on_the_host() -> None:
    """Measured by `make bench` (fp32, N = 2): 4Ψ on the device, 16Ψ/N on the host."""
    plan = estimate(PSI, Workload(dtype="fp32"), backend="zero2", world_size=2, offload_optimizer=True)

    assert plan.device == StateBytes(params=4 * PSI)
    assert plan.host == StateBytes(grads=4 * PSI // 2, optimizer=8 * PSI // 2, master=4 * PSI // 2)


def test_fsdp_offload() -> None:
    params_offloaded = estimate(PSI, MIXED, backend="fsdp", world_size=8, offload_params=True)
    optimizer_offloaded = estimate(PSI, MIXED, backend="fsdp", world_size=8, offload_optimizer=True)

    assert params_offloaded.total == 0
    assert params_offloaded.host.total == 16 * PSI // 8
    assert optimizer_offloaded.device == StateBytes(params=4 * PSI // 8, grads=4 * PSI // 8)
    assert optimizer_offloaded.host == StateBytes(optimizer=8 * PSI // 8)


def test_fp32_has_no_master_copy_under_ddp_and_fsdp() -> None:
    fp32 = Workload(dtype="fp32")

    assert estimate(PSI, fp32, backend="ddp", world_size=1).device == StateBytes(
        params=4 * PSI, grads=4 * PSI, optimizer=8 * PSI
    )
    assert estimate(PSI, fp32, backend="fsdp", world_size=2).device == StateBytes(
        params=2 * PSI, grads=2 * PSI, optimizer=4 * PSI
    )


@pytest.mark.parametrize(
    ("backend", "offload", "message"),
    [
        ("ddp", {"offload_optimizer": True}, "ddp keeps every state"),
        ("zero2", {"offload_params": True}, "ZeRO-2 cannot offload parameters"),
        ("zero3", {}, "backend 'zero3'"),
    ],
)
def test_impossible_backend_settings_are_refused(backend: str, offload: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        estimate(PSI, MIXED, backend=backend, world_size=2, **offload)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"tie_word_embeddings": True}, {"attention_bias": True, "mlp_bias": True}, {"head_dim": 32}],
    ids=["untied", "tied", "biases", "wide-heads"],
)
def test_param_count_equals_a_real_llama(overrides: dict) -> None:
    config = tiny_config(**overrides)
    model = LlamaForCausalLM(config)

    assert architecture_from_config(config.to_dict()).param_count() == sum(
        p.numel() for p in model.parameters()
    )


@pytest.mark.parametrize(
    "targets", ["all-linear", ("q_proj", "v_proj"), ("k_proj", "o_proj", "down_proj")], ids=str
)
def test_lora_count_equals_peft(targets: str | tuple[str, ...]) -> None:
    config = tiny_config()
    peft_targets = targets if isinstance(targets, str) else list(targets)
    model = get_peft_model(LlamaForCausalLM(config), LoraConfig(r=8, target_modules=peft_targets))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)

    assert architecture_from_config(config.to_dict()).lora_param_count(8, targets) == trainable


def test_lora_targets_outside_the_decoder_linears_are_refused() -> None:
    with pytest.raises(ValueError, match="lm_head"):
        PRESETS["llama3-8b"].lora_param_count(8, ("q_proj", "lm_head"))


def test_presets_have_the_published_sizes() -> None:
    assert PRESETS["llama3-8b"].param_count() == 8_030_261_248
    assert PRESETS["llama3-70b"].param_count() == 70_553_706_496
    assert PRESETS["llama2-13b"].param_count() == 13_015_864_320
    assert PRESETS["llama3-8b"].lora_param_count(16) == 41_943_040


def test_architecture_for_hub_ids_local_dirs_and_unknowns(tmp_path) -> None:
    tiny_config().to_json_file(tmp_path / "config.json")

    assert architecture_for("meta-llama/Meta-Llama-3-8B") is PRESETS["llama3-8b"]
    assert architecture_for("Meta-Llama/Llama-3.3-70B-Instruct") is PRESETS["llama3-70b"]
    assert architecture_for(str(tmp_path)).hidden_size == 64
    assert architecture_for("someone/unknown-model") is None


def test_config_without_a_family_names_what_is_missing() -> None:
    with pytest.raises(ValueError, match="model_type"):
        architecture_from_config(
            {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 8, "vocab_size": 9}
        )


def test_qlora_packs_decoder_linears_to_nf4() -> None:
    arch = PRESETS["llama3-8b"]
    plan = estimate(arch, Workload(lora_rank=16, quantize_4bit=True), backend="ddp", world_size=1)

    # 6.98B linear weights at 9/16 byte, embeddings + lm_head + norms at 2 bytes, fp32 adapters at 4 bytes.
    assert arch.linear_weight_count() == 6_979_321_856
    assert plan.device.params == 3_925_868_544 + 2_101_878_784 + 4 * 41_943_040
    assert plan.trainable_params == 41_943_040


def test_a_frozen_copy_is_replicated_under_zero2_sharded_under_fsdp_and_free_on_the_host() -> None:
    full = Workload(frozen_models=(FrozenModel("reference", PSI, "bf16"),))
    on_cpu = Workload(frozen_models=(FrozenModel("reward", PSI, placement="cpu"),))

    assert estimate(PSI, full, backend="zero2", world_size=8).device.frozen == 2 * PSI
    assert estimate(PSI, full, backend="fsdp", world_size=8).device.frozen == 2 * PSI // 8
    cpu_plan = estimate(PSI, on_cpu, backend="fsdp", world_size=8)
    assert (cpu_plan.device.frozen, cpu_plan.host.frozen) == (0, 2 * PSI)


def test_activations_follow_the_documented_formula() -> None:
    arch = architecture_from_config(tiny_config().to_dict())
    s, b, h, layers, vocab = 16, 2, 64, 2, 300
    logits = s * b * vocab * (2 + 4 + 4)
    stored = Workload(micro_batch_size=b, seq_len=s)
    checkpointed = Workload(micro_batch_size=b, seq_len=s, gradient_checkpointing=True)

    stored_bytes = estimate(arch, stored, backend="ddp", world_size=1).device.activations
    checkpointed_bytes = estimate(arch, checkpointed, backend="ddp", world_size=1).device.activations

    assert stored_bytes == layers * 34 * s * b * h + logits == 235_264
    assert checkpointed_bytes == layers * 2 * s * b * h + 34 * s * b * h + logits == 173_824


def test_a_critic_adapter_trains_beside_the_policy_and_runs_the_trunk_again() -> None:
    """A PPO value adapter: its parameters carry the policy's 16 bytes each, and its own pass through
    the layers is kept for backward; the logits come from the policy's pass alone."""
    arch = architecture_from_config(tiny_config().to_dict())
    s, b, h, layers, vocab = 16, 2, 64, 2, 300
    lora = arch.lora_param_count(8)
    critic = Workload(lora_rank=8, micro_batch_size=b, seq_len=s, extra_trainable=lora, trunk_passes=2)

    plan = estimate(arch, critic, backend="ddp", world_size=1)

    assert plan.trainable_params == 2 * lora
    assert plan.device.optimizer == 8 * 2 * lora
    assert plan.device.activations == 2 * layers * 34 * s * b * h + s * b * vocab * (2 + 4 + 4)
    with pytest.raises(ValueError, match="trunk_passes"):
        Workload(trunk_passes=0)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_reward_model_count_equals_a_real_one_label_classifier(tied: bool) -> None:
    config = tiny_config(tie_word_embeddings=tied, num_labels=1)
    model = LlamaForSequenceClassification(config)

    assert architecture_from_config(config.to_dict()).reward_model_param_count() == sum(
        p.numel() for p in model.parameters()
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [("80GB", 80 * GB), ("80 GiB", 80 * 2**30), ("512MiB", 512 * 2**20), ("1.5gb", 1_500_000_000)],
)
def test_parse_memory(text: str, expected: int) -> None:
    assert parse_memory(text) == expected


@pytest.mark.parametrize("text", ["80", "80 gigs", "0GB", "-1GB", ""])
def test_parse_memory_names_the_value_and_the_accepted_forms(text: str) -> None:
    with pytest.raises(ValueError, match=rf"device memory {text!r} not understood.*'80GB', '80GiB'"):
        parse_memory(text)


def test_format_bytes() -> None:
    assert format_bytes(208 * GB) == "208 GB"
    assert format_bytes(208 * GB, binary=True) == "194 GiB"
    assert format_bytes(48_750_000_000) == "48.8 GB"
    assert format_bytes(512) == "512 B"


def test_workload_refuses_4bit_without_lora() -> None:
    with pytest.raises(ValueError, match="set a LoRA rank"):
        Workload(quantize_4bit=True)
