"""Per-rank evidence of what a backend really did: optimizer class, local vs total elements, dtypes.

Every backend writes `logs/placement-rank{R}.json` once the first optimizer step has run, so a
claim such as "ZeRO-2 shards the optimizer states" or "FSDP shards the parameters" is checked on
the live objects, not assumed. Its peak memory figures are updated when training ends, so they are the
whole run's. Tests, `make bench` and `align report` read these files.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback


def local_numel(tensor: torch.Tensor) -> int:
    """Elements this rank holds: a DTensor's local shard, else the whole tensor."""
    return tensor.to_local().numel() if hasattr(tensor, "to_local") else tensor.numel()


def global_numel(tensor: torch.Tensor) -> int:
    """Elements of the full (unsharded) tensor; DeepSpeed's partitioned tensors keep `ds_numel`."""
    return getattr(tensor, "ds_numel", None) or tensor.numel()


def inner_optimizer(optimizer: Any) -> Any:
    """The optimizer that steps: accelerate and DeepSpeed wrap the real one."""
    inner = getattr(optimizer, "optimizer", optimizer)
    return getattr(inner, "optimizer", inner)


def state_tensors(optimizer: Any) -> list[torch.Tensor]:
    """Every tensor the optimizer keeps per parameter (Adam moments and the like)."""
    return [
        value
        for state in inner_optimizer(optimizer).state.values()
        for value in state.values()
        if torch.is_tensor(value) and value.dim() > 0
    ]


def optimizer_state_numel(optimizer: Any) -> int:
    """Elements of every tensor the optimizer keeps per parameter."""
    return sum(local_numel(value) for value in state_tensors(optimizer))


def dtypes(tensors: Any) -> list[str]:
    """The distinct dtypes of `tensors`, sorted, as `float32`, `bfloat16`: fp32 Adam moments are mixed
    precision's, bf16 ones pure bf16's."""
    return sorted({str(tensor.dtype).removeprefix("torch.") for tensor in tensors})


def optimizer_class(optimizer: Any) -> str:
    """The innermost optimizer's class name: what actually steps (e.g. DeepSpeedCPUAdam)."""
    return type(inner_optimizer(optimizer)).__name__


def sharding_facts(model: torch.nn.Module, optimizer: Any) -> dict[str, Any]:
    """What this rank holds right now."""
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    return {
        "rank": int(os.environ.get("RANK", "0")),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "optimizer": optimizer_class(optimizer),
        "wrapper": type(getattr(optimizer, "optimizer", optimizer)).__name__,
        "param_elements_local": sum(local_numel(p) for p in params),
        "param_elements_total": sum(global_numel(p) for p in params),
        "trainable_elements_total": sum(global_numel(p) for p in trainable),
        "optimizer_state_elements_local": optimizer_state_numel(optimizer),
        "optimizer_state_dtypes": dtypes(state_tensors(optimizer)),
        "trainable_dtypes": dtypes(trainable),
        "frozen_dtypes": dtypes(p for p in params if not p.requires_grad),
        "dtensor_params": sum(hasattr(p, "to_local") for p in params),
        **how_it_computes(),
        **peaks(),
    }


def how_it_computes() -> dict[str, Any]:
    """What sets this rank's speed beside the model: whether Accelerate saw a distributed run (it then wraps
    the model in DDP, even for one rank), torch's threads, and the process's niceness (Ray's default 15
    yields every core to anything else). A rank alone should match a plain TRL script: `NO`, its CPUs, 0."""
    from accelerate.state import PartialState

    return {
        "distributed": PartialState().distributed_type.value,
        "torch_threads": torch.get_num_threads(),
        "niceness": os.nice(0),
    }


def peaks() -> dict[str, int | None]:
    """This process's peak resident memory (Linux reports KiB), its anonymous memory now (what it allocated,
    without the pages of memory-mapped files such as the Arrow datasets, which the kernel takes back under
    pressure; None off Linux), and the peak bytes torch allocated on its accelerator (None on CPU)."""
    import resource

    return {
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "anonymous_bytes": anonymous_bytes(),
        "peak_device_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
    }


def anonymous_bytes() -> int | None:
    try:
        rollup = Path("/proc/self/smaps_rollup").read_text().splitlines()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in rollup[1:] if ":" in line)
    return int(fields["Anonymous"].split()[0]) * 1024 if "Anonymous" in fields else None


class ShardingReport(TrainerCallback):
    """Writes this rank's sharding facts after the first optimizer step, when every state exists, and its
    peaks again when training ends."""

    def __init__(self, logs_dir: Path) -> None:
        self.logs_dir = logs_dir
        self.path: Path | None = None  # this rank's file, once written

    def on_step_end(self, args, state, control, model=None, optimizer=None, **kwargs):
        if self.path or model is None or optimizer is None:
            return
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        facts = sharding_facts(model, optimizer)
        self.path = self.logs_dir / f"placement-rank{facts['rank']}.json"
        self.path.write_text(json.dumps(facts, indent=2) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        if self.path:
            facts = {**json.loads(self.path.read_text()), **peaks()}
            self.path.write_text(json.dumps(facts, indent=2) + "\n")
