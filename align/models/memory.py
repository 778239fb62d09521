"""The memory plan: per-rank bytes of each stage under each backend, by arithmetic alone.

Model states for Adam with Ψ trainable parameters, as each backend holds them (align/models/precision.py
says how each realises a precision):
- ddp and fsdp under mixed precision (bf16, fp16) and fp32 keep fp32 weights 4Ψ, fp32 gradients 4Ψ and
  fp32 Adam moments 8Ψ, and no separate master copy: the 16-bit weights exist only for the forward and
  backward (autocast's cache, FSDP2's all-gathered bf16 parameters), not as states. DDP holds 16Ψ per
  rank, for 13B 52 + 52 + 104 = 208 GB, the ZeRO paper's figure (Rajbhandari et al. 2020, which counts it
  as 16-bit params 2Ψ, grads 2Ψ, moments 8Ψ and an fp32 master 4Ψ); FSDP shards it, 16Ψ/N.
- `bf16-pure` holds weights, gradients and both moments in bf16: 2Ψ + 2Ψ + 4Ψ = 8Ψ (ddp), 8Ψ/N (fsdp).
DDP's gradient buckets, a further copy of every gradient unless `gradient_as_bucket_view` is set, are
communication buffers and not counted here.

ZeRO-2 has three figures (DeepSpeed casts the weights to the compute dtype, width 2 in bf16 or 4 in fp32):
- the paper: 2Ψ + 14Ψ/N, one gradient partition and the master copy sharded with the moments;
- DeepSpeed's `estimate_zero2_model_states_mem_needs`: 2Ψ + 18Ψ/N (260 GB for 13B on one GPU),
  which adds the fp32 copy of the gradient partition the optimizer steps;
- measured (`make bench`, fp32, N = 2): 4Ψ + 20Ψ/N, the same terms at fp32 widths, because
  DeepSpeed keeps its fp32 master partition even when the weights are already fp32.
Measurement sided with DeepSpeed, so the plan counts width·Ψ + (width + 4)Ψ/N + 8Ψ/N + 4Ψ/N.
ZeRO-Offload keeps width·Ψ on the device and 16Ψ/N on the host (fp32 gradient partition, moments,
master), also measured.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields, replace

from align.models.architectures import ALL_LINEAR, Architecture
from align.models.placement import Held, Placement

DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
BACKENDS = ("ddp", "zero2", "fsdp")
PLACEMENTS = (Placement.WITH_POLICY, *Held)
SHARDS_FROZEN = ("fsdp",)
"""The backends that shard a frozen copy beside the policy, as each declares (`Backend.frozen_sharded`)."""
USABLE_FRACTION = 0.9
"""Share of device memory a plan may fill: the CUDA context, allocator fragmentation and
communication buckets take the rest."""
NF4_BYTES_PER_WEIGHT = 9 / 16
"""bitsandbytes NF4 as transformers loads it (no double quantization, which would give 0.516):
4 bits per weight plus one fp32 absmax per 64-weight block, 0.5 + 4/64 bytes. Only decoder
linears are packed; embeddings, lm_head and norms stay at the compute dtype."""

_DECIMAL_UNITS = ("B", "KB", "MB", "GB", "TB")
_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
_UNITS = {"gb": 10**9, "gib": 2**30, "mb": 10**6, "mib": 2**20}
_MEMORY_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class FrozenModel:
    """A model used only for inference while another trains: a DPO reference, a PPO reward or value.

    placement: `with_policy` shards it under fsdp and replicates it otherwise (as TRL prepares a
    reference); `replicated` and `sharded` force either; `cpu` costs no device bytes. A model in an actor
    of its own is in no rank's memory: it is not a FrozenModel of the ranks.
    """

    role: str
    param_count: int
    dtype: str = "bf16"
    placement: Placement | Held = Placement.WITH_POLICY

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"frozen {self.role} dtype {self.dtype!r}: use one of {list(DTYPE_BYTES)}")
        if self.placement not in PLACEMENTS:
            raise ValueError(
                f"frozen {self.role} placement {self.placement!r}: use one of {[str(p) for p in PLACEMENTS]}"
            )
        held = Placement.WITH_POLICY if self.placement == Placement.WITH_POLICY else Held(self.placement)
        object.__setattr__(self, "placement", held)


@dataclass(frozen=True)
class Workload:
    """What a stage trains, independent of the backend that runs it.

    dtype is the compute dtype: of activations, a LoRA base and frozen models. Trained weights are fp32
    under mixed precision; `pure` (`bf16-pure`) holds them and Adam's moments in `dtype` too.
    upcast_unpacked: a QLoRA base whose weights not packed to NF4 (embeddings, norms, an untied head) are
    held in fp32, as peft's `prepare_model_for_kbit_training` leaves them (align's PPO calls it).
    micro_batch_size counts sequences per forward: a DPO pair is two.
    seq_len 0 leaves activations out of the plan.
    extra_trainable: parameters trained beside the policy's in its optimizer (a PPO critic's value head,
    or its own LoRA adapter and head); each holds the same model states as a policy parameter.
    trunk_passes: forwards through the decoder layers kept for backward (2 for a critic on its own adapter).
    """

    dtype: str = "bf16"
    pure: bool = False
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] | str = ALL_LINEAR  # resolved against the model when counted
    quantize_4bit: bool = False
    upcast_unpacked: bool = False
    frozen_models: tuple[FrozenModel, ...] = ()
    micro_batch_size: int = 1
    seq_len: int = 0
    gradient_checkpointing: bool = False
    extra_trainable: int = 0
    trunk_passes: int = 1

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"dtype {self.dtype!r}: use one of {list(DTYPE_BYTES)}")
        if self.pure and self.dtype == "fp32":
            raise ValueError("pure 16-bit training needs a 16-bit dtype, not fp32")
        if self.quantize_4bit and self.lora_rank is None:
            raise ValueError("4-bit quantized weights cannot be trained directly: set a LoRA rank (QLoRA)")
        if self.micro_batch_size < 1 or self.trunk_passes < 1 or min(self.seq_len, self.extra_trainable) < 0:
            raise ValueError(
                f"micro_batch_size {self.micro_batch_size}, trunk_passes {self.trunk_passes}: need >= 1; "
                f"seq_len {self.seq_len}, extra_trainable {self.extra_trainable}: need >= 0"
            )


@dataclass(frozen=True)
class StateBytes:
    """Per-rank bytes in one memory (device or host), by what they hold."""

    params: int = 0
    grads: int = 0
    optimizer: int = 0
    master: int = 0
    frozen: int = 0
    activations: int = 0

    @property
    def total(self) -> int:
        return sum(getattr(self, f.name) for f in fields(self))

    @property
    def model_states(self) -> int:
        """Parameters, gradients, optimizer states and master copy: the ZeRO paper's 16 bytes/param."""
        return self.params + self.grads + self.optimizer + self.master


_ROW_LABELS = {
    "params": "parameters",
    "grads": "gradients",
    "optimizer": "optimizer states",
    "master": "fp32 master copy",
    "frozen": "frozen models",
    "activations": "activations",
}


@dataclass(frozen=True)
class MemoryEstimate:
    """One stage under one backend: per-rank device bytes, and host bytes for what is offloaded."""

    backend: str
    world_size: int
    trainable_params: int
    device: StateBytes
    host: StateBytes
    frozen_by_role: tuple[tuple[str, int, int], ...] = ()  # (role, device, host) of each frozen model

    @property
    def total(self) -> int:
        """Per-rank device bytes: what must fit on the accelerator."""
        return self.device.total

    def rows(self) -> list[tuple[str, int, int]]:
        """(label, device bytes, host bytes) per category, each frozen model under theirs, then the totals."""
        rows = [
            (label, getattr(self.device, key), getattr(self.host, key)) for key, label in _ROW_LABELS.items()
        ]
        states = ("model states", self.device.model_states, self.host.model_states)
        frozen = [(f"  {role}", device, host) for role, device, host in self.frozen_by_role]
        return [*rows[:4], states, rows[4], *frozen, rows[5], ("total", self.device.total, self.host.total)]


def estimate(
    model: Architecture | int,
    workload: Workload,
    *,
    backend: str,
    world_size: int,
    offload_optimizer: bool = False,
    offload_params: bool = False,
) -> MemoryEstimate:
    """Per-rank bytes of `workload` under `backend` on `world_size` ranks.

    model is an Architecture, or a bare parameter count for full-parameter model states only.
    offload_optimizer under zero2 moves what ZeRO-Offload keeps on the host: the fp32 gradient
    partition (4Ψ/N), the moments and the master copy; under fsdp (ZeRO-3 style) the moments.
    offload_params (fsdp only) moves every model state of the policy to the host.
    """
    _check_backend(backend, world_size, offload_optimizer, offload_params)
    if not isinstance(model, Architecture) and (workload.lora_rank is not None or workload.seq_len):
        raise ValueError("LoRA counts and activations need the model's shape: pass an Architecture")
    trainable = _trainable_params(model, workload)
    base = _frozen_base_bytes(model, workload) if workload.lora_rank is not None else 0
    if backend == "zero2":
        device, host = _zero2(trainable, DTYPE_BYTES[workload.dtype], base, world_size, offload_optimizer)
    else:
        states = _model_states(trainable, workload.pure)
        device, host = _place_policy(states, base, backend, world_size, offload_optimizer, offload_params)
    frozen = tuple((m.role, *_frozen_model_bytes(m, backend, world_size)) for m in workload.frozen_models)
    activations = 0
    if isinstance(model, Architecture):
        activations = model.activation_bytes(
            workload.micro_batch_size,
            workload.seq_len,
            width=DTYPE_BYTES[workload.dtype],
            gradient_checkpointing=workload.gradient_checkpointing,
            trunk_passes=workload.trunk_passes,
        )
    return MemoryEstimate(
        backend=backend,
        world_size=world_size,
        trainable_params=trainable,
        device=replace(device, frozen=sum(row[1] for row in frozen), activations=activations),
        host=replace(host, frozen=sum(row[2] for row in frozen)),
        frozen_by_role=frozen,
    )


def parse_memory(value: str) -> int:
    """Bytes from "80GB", "80 GiB", "512MB" or "512MiB" (GB/MB decimal, GiB/MiB binary)."""
    match = _MEMORY_PATTERN.match(str(value))
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(
            f"device memory {value!r} not understood: write a positive number and a unit, one of "
            "'80GB', '80GiB', '512MB', '512MiB' (GB, MB: 10^9, 10^6 bytes; GiB, MiB: 2^30, 2^20 bytes)"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(num_bytes: int, *, binary: bool = False) -> str:
    """Human bytes: decimal units (GB) by default, as the headline figures are; GiB with binary."""
    base, units = (1024, _BINARY_UNITS) if binary else (1000, _DECIMAL_UNITS)
    value = float(num_bytes)
    for unit in units:
        if abs(value) < base or unit == units[-1]:
            break
        value /= base
    if unit == "B":
        return f"{num_bytes} B"
    decimals = 0 if abs(value) >= 100 else 1 if abs(value) >= 10 else 2
    return f"{value:.{decimals}f} {unit}"


def _check_backend(backend: str, world_size: int, offload_optimizer: bool, offload_params: bool) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r}: use one of {list(BACKENDS)}")
    if world_size < 1:
        raise ValueError(f"world_size {world_size}: need at least 1 rank")
    if backend == "ddp" and (offload_optimizer or offload_params):
        raise ValueError("ddp keeps every state on the device: offload needs zero2 or fsdp")
    if backend == "zero2" and offload_params:
        raise ValueError("ZeRO-2 cannot offload parameters: use fsdp with offload_params")


def _param_count(model: Architecture | int) -> int:
    return model.param_count() if isinstance(model, Architecture) else model


def _trainable_params(model: Architecture | int, workload: Workload) -> int:
    if workload.lora_rank is None:
        return _param_count(model) + workload.extra_trainable
    return model.lora_param_count(workload.lora_rank, workload.lora_targets) + workload.extra_trainable


def _model_states(trainable: int, pure: bool) -> StateBytes:
    """One unsharded replica as ddp and FSDP2 hold it: fp32 weights, gradients and moments (4 + 4 + 8 bytes)
    with no master copy, or all of them in bf16 when pure (2 + 2 + 4)."""
    width = 2 if pure else 4
    return StateBytes(width * trainable, width * trainable, optimizer=2 * width * trainable)


def _frozen_base_bytes(arch: Architecture, workload: Workload) -> int:
    """The LoRA base weights, frozen at the compute dtype or packed to NF4."""
    width = DTYPE_BYTES[workload.dtype]
    if not workload.quantize_4bit:
        return arch.param_count() * width
    packed = arch.linear_weight_count()
    unpacked_width = DTYPE_BYTES["fp32"] if workload.upcast_unpacked else width
    return math.ceil(packed * NF4_BYTES_PER_WEIGHT) + (arch.param_count() - packed) * unpacked_width


def _shard(num_bytes: int, world_size: int) -> int:
    """A rank's share, rounded up as the padded last shard is."""
    return -(-num_bytes // world_size)


def _place_policy(
    states: StateBytes, base: int, backend: str, n: int, offload_optimizer: bool, offload_params: bool
) -> tuple[StateBytes, StateBytes]:
    """(device, host) per rank of the policy's model states under ddp or fsdp; `base` is a LoRA model's
    frozen weights, which fsdp shards while the adapters' weights, gradients and moments stay replicated
    (transformers keeps them in step across ranks)."""
    if backend == "ddp":
        return replace(states, params=states.params + base), StateBytes()
    if base:  # LoRA under fsdp: the base sharded at load; adapters added after it stay whole on each rank
        sharded = replace(states, params=_shard(base, n) + states.params)
    else:
        sharded = StateBytes(_shard(states.params, n), _shard(states.grads, n), _shard(states.optimizer, n))
    if offload_params:
        return StateBytes(), sharded
    if offload_optimizer:
        return replace(sharded, optimizer=0), StateBytes(optimizer=sharded.optimizer)
    return sharded, StateBytes()


def _zero2(
    trainable: int, width: int, base: int, n: int, offload_optimizer: bool
) -> tuple[StateBytes, StateBytes]:
    """(device, host) per rank under ZeRO-2 as DeepSpeed runs it: weights replicated, the rest partitioned.

    DeepSpeed casts the weights to the compute dtype (`width` bytes) and steps an fp32 partition of them
    (master 4Ψ/N) whatever the training dtype; at the step it holds the reduced gradient partition
    (width·Ψ/N) beside the fp32 copy the optimizer steps (4Ψ/N). ZeRO-Offload reduces straight into that
    fp32 copy on the host, with the moments and the master, so only the weights stay on the device.
    """
    params = width * trainable + base
    fp32_partition = _shard(4 * trainable, n)
    optimizer = _shard(8 * trainable, n)
    if offload_optimizer:
        host = StateBytes(grads=fp32_partition, optimizer=optimizer, master=fp32_partition)
        return StateBytes(params=params), host
    grads = _shard(width * trainable, n) + fp32_partition
    return StateBytes(params, grads, optimizer, master=fp32_partition), StateBytes()


def _frozen_model_bytes(frozen: FrozenModel, backend: str, n: int) -> tuple[int, int]:
    """(device, host) bytes per rank of a model held for inference."""
    size = frozen.param_count * DTYPE_BYTES[frozen.dtype]
    held = frozen.placement
    if held == Placement.WITH_POLICY:
        held = Held.SHARDED if backend in SHARDS_FROZEN else Held.REPLICATED
    if held == Held.CPU:
        return 0, size
    return (_shard(size, n) if held == Held.SHARDED else size), 0


def describe_workload(model: Architecture | int, workload: Workload) -> str:
    total = count_words(_param_count(model))
    if workload.lora_rank is None:
        return f"full-parameter {total}"
    kind = "QLoRA" if workload.quantize_4bit else "LoRA"
    trainable = count_words(_trainable_params(model, workload))
    return f"{kind} r={workload.lora_rank} ({trainable} trainable) on {total}"


def count_words(n: int) -> str:
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{suffix}"
    return str(n)
