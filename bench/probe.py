"""Per-rank byte accounting of model states, run inside each Ray Train worker of the memory benchmark.

Why not `model.parameters()` plus `p.grad` plus the optimizer state: each backend keeps model states
where that misses them. DeepSpeed ZeRO-2 makes the model's parameters views of one flat buffer, keeps
gradients in its own partition buffers (p.grad is None) and steps an fp32 clone of the partition
(a master copy, even in fp32 training). FSDP2 parameters and gradients are DTensors whose local
shard is what the rank holds. DDP copies every gradient into its communication buckets, which live
in C++ and are visible only through DDP's own logging data.

So every tensor a backend holds is tagged with a category and counted once per storage (a view
costs nothing extra, a padded flat buffer costs all its bytes), at the moment model states peak:
right after the inner optimizer's step, when parameters, gradients, master copy and optimizer
states all exist. A sweep of every live tensor the garbage collector can see, and the process's
RSS, cross-check that nothing large went uncounted.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

CATEGORIES = ("params", "master", "optimizer", "grads", "buffers")
"""Most specific first: a storage tagged twice (a ZeRO view of the flat parameter buffer) takes the
first category it has."""
MODEL_STATES = ("params", "grads", "optimizer", "master")
WALK_DEPTH = 5


def current_rss() -> int:
    """This process's resident bytes now (Linux)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def peak_rss() -> int:
    """This process's peak resident bytes so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The part of a tensor this rank holds: a DTensor's local shard, else the tensor."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def storage_key(tensor: torch.Tensor) -> tuple[tuple[str, int], int] | None:
    """((device type, storage address), storage bytes), or None for meta or empty tensors."""
    local = local_tensor(tensor)
    if local.device.type == "meta":
        return None
    storage = local.untyped_storage()
    if storage.nbytes() == 0:
        return None
    return (local.device.type, storage.data_ptr()), storage.nbytes()


def count_storages(tagged: list[tuple[str, torch.Tensor]]) -> dict[tuple[str, int], tuple[str, int]]:
    """storage -> (category, bytes), each storage once, under its most specific category."""
    owners: dict[tuple[str, int], tuple[str, int]] = {}
    for category, tensor in tagged:
        found = storage_key(tensor)
        if found is None:
            continue
        key, nbytes = found
        held = owners.get(key)
        if held is None or CATEGORIES.index(category) < CATEGORIES.index(held[0]):
            owners[key] = (category, nbytes)
    return owners


def by_device(owners: dict[tuple[str, int], tuple[str, int]]) -> dict[str, dict[str, int]]:
    """Bytes per device type ("cpu", "cuda") per category."""
    totals: dict[str, dict[str, int]] = {}
    for (device, _), (category, nbytes) in owners.items():
        per_device = totals.setdefault(device, dict.fromkeys(CATEGORIES, 0))
        per_device[category] += nbytes
    return totals


def optimizer_chain(optimizer: Any) -> list[Any]:
    """accelerate's wrapper, then DeepSpeed's ZeRO optimizer if any, then the optimizer that steps."""
    chain = [optimizer]
    while getattr(chain[-1], "optimizer", None) is not None and chain[-1].optimizer is not chain[-1]:
        chain.append(chain[-1].optimizer)
    return chain


def deepspeed_holders(chain: list[Any]) -> list[Any]:
    """The wrappers in an optimizer chain that are DeepSpeed's own (its ZeRO optimizer)."""
    return [holder for holder in chain[:-1] if type(holder).__module__.startswith("deepspeed")]


def zero_category(attribute: str) -> str:
    """What a tensor held by DeepSpeed's ZeRO optimizer is, from the attribute that holds it.

    `ipg` buckets and staging buffers are communication buffers; `single_partition_of_fp32_groups`
    is the fp32 master partition; `grads_in_partition`, `averaged_gradients` are gradients; the
    `bit16_groups` are the (flattened) model weights.
    """
    if "ipg" in attribute or "buffer" in attribute:
        return "buffers"
    if "fp32" in attribute:
        return "master"
    if "grad" in attribute:
        return "grads"
    if "bit16" in attribute or attribute.startswith("params"):
        return "params"
    return "buffers"


def named_tensors(root: Any, depth: int = WALK_DEPTH) -> Iterator[tuple[str, torch.Tensor]]:
    """(top attribute name, tensor) for every tensor reachable from a DeepSpeed object's attributes.

    Only containers and DeepSpeed's own objects are entered, so the walk never wanders into the
    model, process groups or torch internals.
    """
    seen: set[int] = set()
    stack: list[tuple[Any, str, int]] = [(value, name, depth) for name, value in vars(root).items()]
    while stack:
        value, name, left = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            yield name, value
            continue
        if left == 0:
            continue
        if isinstance(value, dict):
            children = list(value.values())
        elif isinstance(value, list | tuple):
            children = list(value)
        elif type(value).__module__.startswith("deepspeed") and hasattr(value, "__dict__"):
            children = list(vars(value).values())
        else:
            continue
        stack.extend((child, name, left - 1) for child in children)


def ddp_bucket_bytes(model: torch.nn.Module) -> int:
    """Bytes of DDP's gradient buckets when they are a second copy of every gradient, else 0.

    With `gradient_as_bucket_view=False` (accelerate's and HF Trainer's default) DDP all-reduces
    flat bucket tensors and copies the result back into `p.grad`: both exist at the step.
    """
    from torch.nn.parallel import DistributedDataParallel

    with warnings.catch_warnings():  # isinstance on torch's deprecated aliases warns
        warnings.simplefilter("ignore")
        wrappers = [o for o in gc.get_objects() if isinstance(o, DistributedDataParallel)]
    wrapper = next((o for o in wrappers if o.module is model), None)
    if wrapper is None:
        return 0
    data = wrapper._get_ddp_logging_data()  # the only window on the C++ reducer's buckets
    if data.get("gradient_as_bucket_view"):
        return 0
    return sum(int(size) for size in str(data.get("bucket_sizes", "")).split(",") if size.strip())


class ModelStateProbe(TrainerCallback):
    """Counts this rank's model-state bytes after each optimizer step; writes them when training ends.

    The writes go to `logs/model-states-rank{R}.json` beside the stage's own placement reports.
    """

    def __init__(self, logs_dir: Path, baseline_rss: int) -> None:
        self.logs_dir = logs_dir
        self.baseline_rss = baseline_rss
        self.model: torch.nn.Module | None = None
        self.chain: list[Any] = []
        self.bucket_bytes = 0
        self.steps: list[dict[str, Any]] = []
        self.first_step: dict[str, Any] = {}
        self.step_seconds: list[float] = []
        self.step_started = 0.0

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        self.model = model
        self.chain = optimizer_chain(optimizer)
        self.chain[-1].register_step_post_hook(self.after_optimizer_step)

    def on_step_begin(self, args, state, control, **kwargs):
        self.step_started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_seconds.append(time.perf_counter() - self.step_started)

    def tagged_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """Every tensor the model and the optimizer stack hold, with its category."""
        params = list(self.model.parameters())
        model_ids = {id(p) for p in params}
        stepper = self.chain[-1]
        stepped = [p for group in stepper.param_groups for p in group["params"]]
        tagged = [("params", p) for p in params]
        tagged += [("master", p) for p in stepped if id(p) not in model_ids]
        tagged += [
            ("optimizer", value)
            for per_param in stepper.state.values()
            for value in per_param.values()
            if torch.is_tensor(value)
        ]
        tagged += [("grads", p.grad) for p in (*params, *stepped) if p.grad is not None]
        for holder in deepspeed_holders(self.chain):
            tagged += [(zero_category(name), tensor) for name, tensor in named_tensors(holder)]
        return tagged

    def after_optimizer_step(self, optimizer, args, kwargs) -> None:
        """Model states peak here: the step has made the optimizer states, the gradients still exist."""
        if not self.steps:
            self.bucket_bytes = ddp_bucket_bytes(self.model)
        owners = count_storages(self.tagged_tensors())
        record: dict[str, Any] = {"bytes": by_device(owners), "rss": current_rss()}
        if torch.cuda.is_available():
            record["cuda_allocated"] = torch.cuda.memory_allocated()
        if not self.steps:
            self.first_step = {**sweep_live_tensors(owners), "param_view_bytes": view_bytes(self.model)}
            for holder in deepspeed_holders(self.chain):
                self.first_step["zero_attributes"] = zero_attribute_bytes(holder)
        self.steps.append(record)

    def on_train_end(self, args, state, control, **kwargs):
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        rank = int(os.environ.get("RANK", "0"))
        peak = max(self.steps, key=lambda step: model_state_total(step["bytes"]), default={})
        facts = {
            "rank": rank,
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "optimizer_chain": [type(o).__name__ for o in self.chain],
            "at_peak": peak.get("bytes", {}),
            "model_states_by_step": [model_state_total(step["bytes"]) for step in self.steps],
            "ddp_bucket_bytes": self.bucket_bytes,
            "rss_baseline": self.baseline_rss,
            "rss_at_peak": peak.get("rss"),
            "peak_rss": peak_rss(),
            "step_seconds": self.step_seconds,
            **self.first_step,
        }
        if torch.cuda.is_available():
            facts.update(
                cuda_allocated_at_peak=peak.get("cuda_allocated"), cuda_peak=torch.cuda.max_memory_allocated()
            )
        (self.logs_dir / f"model-states-rank{rank}.json").write_text(json.dumps(facts, indent=2) + "\n")


def model_state_total(per_device: dict[str, dict[str, int]]) -> int:
    """Parameters, gradients, optimizer states and master copies, over all devices."""
    return sum(per_device[device][category] for device in per_device for category in MODEL_STATES)


def view_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters as the rank sees them (local shards), whatever storage they sit in.

    Less than the parameters' storage bytes when a shard is a view into a larger buffer that stays
    alive (a padded flat buffer, or the full tensor a shard was cut from).
    """
    return sum(local_tensor(p).numel() * local_tensor(p).element_size() for p in model.parameters())


def zero_attribute_bytes(zero: Any) -> dict[str, int]:
    """Bytes per attribute of DeepSpeed's ZeRO optimizer (each storage once): what DeepSpeed holds."""
    owners: dict[tuple[str, int], tuple[str, int]] = {}
    for name, tensor in named_tensors(zero):
        found = storage_key(tensor)
        if found is not None and found[0] not in owners:
            owners[found[0]] = (name, found[1])
    totals: dict[str, int] = {}
    for name, nbytes in owners.values():
        totals[name] = totals.get(name, 0) + nbytes
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def sweep_live_tensors(counted: dict[tuple[str, int], tuple[str, int]]) -> dict[str, Any]:
    """All tensors the garbage collector sees, each storage once, and what the accounting left out."""
    live: dict[tuple[str, int], tuple[int, str]] = {}
    with warnings.catch_warnings():  # isinstance on torch's deprecated aliases warns
        warnings.simplefilter("ignore")
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for tensor in tensors:
        found = storage_key(tensor)
        if found is not None:
            live.setdefault(found[0], (found[1], f"{tuple(tensor.shape)} {tensor.dtype}"))
    uncounted = sorted(((n, what) for key, (n, what) in live.items() if key not in counted), reverse=True)
    return {
        "live_tensor_bytes": sum(n for n, _ in live.values()),
        "uncounted_live_bytes": sum(n for n, _ in uncounted),
        "largest_uncounted": [f"{n} B {what}" for n, what in uncounted[:5]],
    }


class ProbedBackend:
    """The stage's real backend, with the probe added to its callbacks and nothing else changed."""

    def __init__(self, backend: Any, baseline_rss: int) -> None:
        self.backend = backend
        self.baseline_rss = baseline_rss

    def __getattr__(self, name: str) -> Any:
        return getattr(self.backend, name)

    def callbacks(self, plan: Any, logs_dir: Path) -> list[Any]:
        return [*self.backend.callbacks(plan, logs_dir), ModelStateProbe(logs_dir, self.baseline_rss)]


def train_loop(config: dict[str, Any]) -> None:
    """Ray Train's per-worker function: align's own stage runner under the planned backend, probed.

    The libraries every backend uses are imported before the RSS baseline, so RSS growth measures
    what the stage allocates, not what Python imports.
    """
    import deepspeed  # noqa: F401 - part of the baseline for every backend
    import trl  # noqa: F401

    from align.backends import BACKENDS
    from align.run.worker import quiet_libraries
    from align.stages import run_seeded
    from align.stages.context import StageContext

    quiet_libraries()
    plan = config["plan"]
    context = StageContext(
        plan=plan,
        output_dir=Path(config["output_dir"]),
        rank=int(os.environ.get("RANK", "0")),
        backend=ProbedBackend(BACKENDS[plan.backend], current_rss()),
    )
    run_seeded(context)
