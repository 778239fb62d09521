"""FSDP2: parameters, gradients and optimizer states sharded across ranks, on CPU (gloo) and GPU (NCCL).

With LoRA the frozen base is what is sharded, 1/N per rank, which is the point when a base is too big to
replicate (Mixtral-8x7B in bf16 is 93 GB); the adapters, added by peft after the base was sharded at load,
stay plain tensors that transformers' Trainer keeps identical across ranks (broadcast once, gradients
averaged). QLoRA is refused: transformers' FSDP2 loading leaves bitsandbytes' NF4 weights whole.

Mechanism: transformers' own FSDP2. `model_kwargs` asks `from_pretrained` for
`DistributedConfig(fsdp_size=workers)`, so every decoder layer and the root become `fully_shard` units
whose parameters are DTensors, and the model reports `is_distributed_loading_by_transformers`. That flag
is what makes the Trainer skip its DDP wrap and device move, defer gradient reduction under accumulation,
and gather a full `model.safetensors` in `save_model()`. HF/accelerate's `fsdp=` is not used: on CPU it
silently becomes DDP. `prepare` then gives each shard its own memory, tunes the units through FSDP2's
public methods, and `verify` proves that each rank holds 1/N of the parameters, in elements and in the
bytes behind them (align/backends/fsdp_shards.py, the torch side).

Checkpoints: the Trainer will not save the optimizer of such a model (it insists on `save_only_model`),
so `ShardedCheckpoint` writes model, optimizer and scheduler as a torch distributed checkpoint (DCP), one
file per rank, into each HF checkpoint folder, and loads it back when training resumes from one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from align.config.stage_parts import lora_of, trl_of
from align.errors import Problem
from align.models.memory import Workload, estimate
from align.models.precision import compute_dtype as precision_compute_dtype

if TYPE_CHECKING:
    from align.backends.base import PlannedStage
    from align.config.spec import StageBase
    from align.models.architectures import Architecture

DCP_FOLDER = "fsdp_state"
"""The DCP folder inside each HF checkpoint. Never `optimizer*`: the Trainer takes such a folder for its
own optimizer file and would try to load it on resume."""


class FSDP:
    name = "fsdp"
    titles = {"fsdp": "FSDP"}
    policy_held = "parameters, grads and optimizer states sharded"
    frozen_sharded = True
    keeps_fp32_master = False  # fp32 shards, gathered in bf16 by FSDP2's MixedPrecisionPolicy

    def problems(self, stage: StageBase, where: str, workers: int, precision: str) -> list[Problem]:
        """What this backend would not shard, refused rather than run unsharded under the name fsdp."""
        trl, lora = trl_of(stage), lora_of(stage)
        problems = []
        if lora is not None and lora.load_in_4bit:
            problems.append(
                Problem(
                    f"{where}.lora.load_in_4bit",
                    "fsdp shards a LoRA stage's frozen base in 16 or 32 bits; NF4 weights (bitsandbytes "
                    "Params4bit) are not sharded by transformers' FSDP2 loading and would stay whole on each "
                    "rank. Use `backend: zero2` for QLoRA, or drop `load_in_4bit` to shard the base",
                )
            )
        if workers < 2:
            problems.append(Problem(f"{where}.workers", "fsdp shards across workers and needs 2 or more"))
        if compute_dtype(stage, precision) == "fp16":
            problems.append(
                Problem(
                    f"{where}.fsdp.mixed_precision",
                    "transformers' FSDP2 offers bf16 compute with fp32 gradient reduction, not fp16; "
                    "set `mixed_precision: bf16` or `fp32` (or the stage's `precision: bf16`)",
                )
            )
        if "save_only_model" in trl:
            problems.append(
                Problem(
                    f"{where}.trl.save_only_model",
                    "fsdp sets this: the Trainer saves the model, the backend saves the sharded optimizer",
                )
            )
        resume = trl.get("resume_from_checkpoint")
        if resume and not (Path(resume) / DCP_FOLDER / ".metadata").is_file():
            problems.append(
                Problem(
                    f"{where}.trl.resume_from_checkpoint",
                    f"{resume} has no {DCP_FOLDER}/ with the sharded model and optimizer states; resume "
                    "from a checkpoint that a stage under `backend: fsdp` wrote",
                )
            )
        return problems

    def offloads_optimizer(self, stage: StageBase) -> bool:
        return False

    def needs_process_group(self, workers: int) -> bool:
        """Its parameters are DTensors on a device mesh, which a process group carries even at one rank."""
        return True

    def estimates(self, arch: Architecture, work: Workload, workers: int, stage: StageBase) -> dict:
        offload = stage.fsdp.cpu_offload
        return {"fsdp": estimate(arch, work, backend="fsdp", world_size=workers, offload_params=offload)}

    def option(self, stage: StageBase) -> str:
        return "fsdp"

    def trainer_args(self, plan: PlannedStage) -> dict[str, Any]:
        """HF's own checkpoints keep the model only: its rank-0 optimizer file cannot hold sharded states."""
        return {"save_only_model": True}

    def model_kwargs(self, plan: PlannedStage) -> dict[str, Any]:
        """Shard at load time: each rank reads only its part of every parameter.

        A bf16 compute dtype sets transformers' FSDP2 `MixedPrecisionPolicy(param_dtype=bf16,
        reduce_dtype=fp32)` on every unit: under `precision: bf16` over the fp32 shards the policy loads in
        (the optimizer steps fp32 weights with fp32 moments), under `bf16-pure` over bf16 shards.
        Offload applies with an accelerator only: on a CPU run the shards already live in host memory, and
        FSDP2's offload policy would pin memory, which needs an accelerator.
        """
        from transformers import DistributedConfig

        config = DistributedConfig(
            fsdp_size=plan.workers,
            fsdp_cpu_offload=plan.stage.fsdp.cpu_offload and plan.accelerator,
            fsdp_mixed_precision=compute_dtype(plan.stage, plan.precision) == "bf16",
        )
        return {"distributed_config": config}

    def prepare(self, model: Any, plan: PlannedStage) -> Any:
        from align.backends.fsdp_shards import prepare as shard_and_tune

        return shard_and_tune(model, plan)

    def callbacks(self, plan: PlannedStage, logs_dir: Path) -> list[Any]:
        """The placement report, the report of every sharded model, and the DCP checkpoints."""
        from align.backends.fsdp_shards import ShardedCheckpoint, ShardedModelsReport
        from align.backends.sharding_report import ShardingReport

        return [ShardingReport(logs_dir), ShardedModelsReport(logs_dir), ShardedCheckpoint(DCP_FOLDER)]

    def verify(self, model: Any, plan: PlannedStage) -> None:
        from align.backends.fsdp_shards import verify as prove_sharded

        prove_sharded(model, plan)


def compute_dtype(stage: StageBase, precision: str) -> str:
    """The dtype FSDP computes in: the stage's `fsdp.mixed_precision`, where `auto` follows its precision."""
    requested = stage.fsdp.mixed_precision
    return precision_compute_dtype(precision) if requested == "auto" else requested
