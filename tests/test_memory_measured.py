"""The memory plan against what live objects hold: the bytes of a real model and optimizer after a step
(one process, and FSDP2 on 2 gloo ranks), NF4 packing as bitsandbytes stores it, and a QLoRA base as peft
prepares it. Each figure is measured, then compared with `estimate` exactly."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaForCausalLM

from align.measures.model_states import measured_model_state_bytes
from align.models.architectures import PRESETS, architecture_from_config
from align.models.memory import NF4_BYTES_PER_WEIGHT, StateBytes, Workload, estimate
from tests.test_memory import tiny_config


def test_a_qlora_base_prepared_for_kbit_training_holds_its_unpacked_weights_in_fp32(tmp_path) -> None:
    """align's PPO prepares its QLoRA base with peft (embeddings, norms, head upcast to fp32): the plan
    counts what the prepared model holds; for Llama-3-8B that is 2.1 GB more than TRL's trainers hold."""
    pytest.importorskip("bitsandbytes")
    from peft import prepare_model_for_kbit_training

    from align.models.loading import load_causal_lm

    config = tiny_config(tie_word_embeddings=False)
    LlamaForCausalLM(config).save_pretrained(tmp_path)
    model = prepare_model_for_kbit_training(
        load_causal_lm(str(tmp_path), dtype=torch.bfloat16, quantize_4bit=True),
        use_gradient_checkpointing=False,
    )
    packed = {name for name, module in model.named_modules() if type(module).__name__ == "Linear4bit"}
    held = sum(
        p.numel() * p.element_size()
        for name, p in model.named_parameters()
        if name.rsplit(".", 1)[0] not in packed
    )
    arch = architecture_from_config(config.to_dict())
    prepared = Workload(lora_rank=8, quantize_4bit=True, upcast_unpacked=True)
    planned = estimate(arch, prepared, backend="ddp", world_size=1).device.params
    adapters = estimate(arch, prepared, backend="ddp", world_size=1).trainable_params * 4
    nf4 = arch.linear_weight_count() * NF4_BYTES_PER_WEIGHT
    assert held == planned - adapters - nf4  # every unpacked weight, at 4 bytes

    llama3 = PRESETS["llama3-8b"]
    upcast = estimate(llama3, prepared, backend="ddp", world_size=1).device.params
    as_trl = estimate(llama3, Workload(lora_rank=8, quantize_4bit=True), backend="ddp", world_size=1)
    assert upcast - as_trl.device.params == 2_101_878_784  # 2 more bytes for each of 1.05B weights


def test_nf4_bytes_per_weight_match_bitsandbytes() -> None:
    bnb = pytest.importorskip("bitsandbytes")
    weight = bnb.nn.Params4bit(
        torch.randn(176, 64), requires_grad=False, quant_type="nf4", compress_statistics=False
    ).to("cpu")
    absmax = weight.quant_state.absmax
    packed = weight.numel() * weight.element_size() + absmax.numel() * absmax.element_size()

    assert packed == 176 * 64 * NF4_BYTES_PER_WEIGHT


def test_measured_fp32_adamw_step_equals_the_ddp_estimate() -> None:
    torch.manual_seed(0)
    config = tiny_config()
    model = LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    input_ids = torch.randint(0, config.vocab_size, (2, 8))
    model(input_ids=input_ids, labels=input_ids).loss.backward()
    optimizer.step()

    plan = estimate(
        architecture_from_config(config.to_dict()), Workload(dtype="fp32"), backend="ddp", world_size=1
    )
    psi = plan.trainable_params

    assert measured_model_state_bytes(model, optimizer) == {
        "params": 4 * psi,
        "grads": 4 * psi,
        "optimizer": 8 * psi,
        "master": 0,
        "total": 16 * psi,
    }
    assert plan.device == StateBytes(params=4 * psi, grads=4 * psi, optimizer=8 * psi)


def test_measured_bytes_count_each_storage_once_at_its_full_size() -> None:
    """Views of a padded flat buffer (ZeRO) cost the buffer; a shard cut as a view costs its whole tensor."""
    flat = torch.zeros(100)
    model = torch.nn.Module()
    model.first = torch.nn.Parameter(flat[:40])
    model.second = torch.nn.Parameter(flat[40:90])  # 10 elements of padding after it
    model.shard = torch.nn.Parameter(torch.zeros(8, 4)[4:])  # half of an 8 x 4 tensor that stays alive
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    measured = measured_model_state_bytes(model, optimizer)

    assert measured["params"] == (100 + 8 * 4) * 4
    assert measured["total"] == measured["params"]


def _fsdp2_worker(rank: int, world_size: int, port: int, results: dict) -> None:
    """One rank of raw FSDP2 on gloo: shard each decoder layer and the root, take one AdamW step."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        torch.manual_seed(0)
        mesh = init_device_mesh("cpu", (world_size,))
        model = LlamaForCausalLM(tiny_config())
        for layer in model.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        input_ids = torch.randint(0, 300, (2, 8))
        model(input_ids=input_ids, labels=input_ids).loss.backward()
        optimizer.step()
        results[rank] = measured_model_state_bytes(model, optimizer)
    finally:
        dist.destroy_process_group()


@pytest.mark.integration
def test_measured_fsdp2_local_shards_equal_the_fsdp_estimate() -> None:
    """Each of 2 ranks holds 16Ψ/2 in fp32, storages included.

    fully_shard copies each rank's shard of a parameter into a tensor of its own, and the gradient
    shards are views of one reduce-scatter buffer, counted once.
    """
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_fsdp2_worker, args=(2, port, results), nprocs=2)
        measured = dict(results)
    plan = estimate(
        architecture_from_config(tiny_config().to_dict()),
        Workload(dtype="fp32"),
        backend="fsdp",
        world_size=2,
    )

    assert [measured[rank]["total"] for rank in (0, 1)] == [plan.total, plan.total]
    assert measured[0]["params"] == plan.trainable_params * 4 // 2
