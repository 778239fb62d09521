"""What a rank really holds: model-state bytes counted on the live objects, to check the memory plan."""

from __future__ import annotations

import torch


def measured_model_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of the storages behind this rank's params, grads, optimizer states and master copies.

    Memory is held by storages, not by tensors: each storage counts once, at its full size, under the
    first of params, master, optimizer, grads that reaches it. So views of one flat buffer cost the
    buffer (padding included), and a shard cut as a view of a whole tensor costs the whole tensor.
    A DTensor (FSDP2) counts its local shard's storage. A master copy is any tensor the optimizer steps
    that is not a model parameter; its gradient counts as a gradient. 0-d tensors (Adam's `step`) are
    bookkeeping and skipped. Only what the model and the optimizer expose is seen: DeepSpeed's own
    gradient buffers (p.grad is None under ZeRO) and DDP's buckets are not; `bench/probe.py` finds those.
    bitsandbytes 4-bit weights count their packed storage, not their quantization constants.
    """
    params = list(model.parameters())
    param_ids = {id(p) for p in params}
    master = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in param_ids]
    states = [
        value
        for state in optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor) and value.dim() > 0
    ]
    grads = [p.grad for p in (*params, *master) if p.grad is not None]
    seen: set[tuple[str, int]] = set()
    measured = {
        category: storage_bytes(tensors, seen)
        for category, tensors in (
            ("params", params),
            ("master", master),
            ("optimizer", states),
            ("grads", grads),
        )
    }
    return {**measured, "total": sum(measured.values())}


def storage_bytes(tensors: list[torch.Tensor], seen: set[tuple[str, int]]) -> int:
    """Bytes of the storages behind `tensors` that are not in `seen` yet; adds them to `seen`."""
    total = 0
    for tensor in tensors:
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        storage = local.untyped_storage()
        key = (local.device.type, storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total
