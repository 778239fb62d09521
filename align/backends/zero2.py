"""DeepSpeed ZeRO-2: weights replicated, gradients and optimizer states sharded across ranks.

The DeepSpeed config is generated from the stage's `zero2:` block (or read from the user's own JSON)
and handed to TRL as `deepspeed=<dict>`. Batch size, accumulation, clipping and the AdamW settings
are left "auto", so TrainingArguments stays the single source of truth and HF fills them in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from align.backends.ddp import DDP
from align.config.stage_parts import lora_of
from align.errors import ConfigError, Problem
from align.models.memory import Workload, estimate
from align.models.precision import MIXED, PURE

if TYPE_CHECKING:
    from align.backends.base import PlannedStage
    from align.config.spec import StageBase
    from align.models.architectures import Architecture

AUTO_BATCH = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
}
# ZeRO-Offload steps on the host with DeepSpeedCPUAdam, which DeepSpeed only builds from a config entry
ADAMW = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}


class Zero2(DDP):
    """ZeRO-2 keeps whole weights on every rank, so models load, prepare and verify as under DDP; the
    engine is checked once it exists (`ZeroOptimizerCheck`): it does not exist before `train()`."""

    name = "zero2"
    titles = {"zero2": "ZeRO-2", "zero2+offload": "ZeRO-2 with CPU optimizer offload"}
    policy_held = "weights replicated; grads and optimizer states sharded"
    keeps_fp32_master = True  # DeepSpeed casts the weights to 16 bits and steps its own fp32 partition

    def problems(self, stage: StageBase, where: str, workers: int, precision: str) -> list[Problem]:
        """DeepSpeed always keeps an fp32 master, so it cannot run bf16-pure; a user's own DeepSpeed JSON is
        read now, not after Ray has started the stage."""
        if precision == PURE:
            return [
                Problem(
                    f"{where}.backend",
                    "zero2 always keeps an fp32 master copy (DeepSpeed's bf16 mode), so it cannot run "
                    "`precision: bf16-pure`; use `precision: bf16`, or `backend: fsdp` / `ddp` for pure bf16",
                )
            ]
        if stage.zero2.config is None:
            return []
        try:
            user_config(stage.zero2.config, f"{where}.zero2.config")
        except ConfigError as err:
            return err.problems
        return []

    def needs_process_group(self, workers: int) -> bool:
        """DeepSpeed's engine runs its collectives even on one rank."""
        return True

    def offloads_optimizer(self, stage: StageBase) -> bool:
        """When asked, and by default for LoRA/QLoRA. A user's JSON says for itself; one that cannot be
        read offloads nothing here, and `problems` refuses it wherever zero2 would run the stage."""
        if stage.zero2.config:
            try:
                return steps_on_host(user_config(stage.zero2.config, "zero2.config"))
            except ConfigError:
                return False
        setting = stage.zero2.offload_optimizer
        return setting == "cpu" or (setting == "auto" and lora_of(stage) is not None)

    def estimates(self, arch: Architecture, work: Workload, workers: int, stage: StageBase) -> dict:
        return {
            option: estimate(arch, work, backend="zero2", world_size=workers, offload_optimizer=offload)
            for option, offload in (("zero2", False), ("zero2+offload", True))
        }

    def option(self, stage: StageBase) -> str:
        return "zero2+offload" if self.offloads_optimizer(stage) else "zero2"

    def trainer_args(self, plan: PlannedStage) -> dict[str, Any]:
        """HF Trainer builds the DeepSpeed engine itself from this dict."""
        return {"deepspeed": deepspeed_config(plan)}

    def callbacks(self, plan: PlannedStage, logs_dir: Path) -> list[Any]:
        """Check the live optimizer is ZeRO's before any step, then record what each rank holds."""
        from align.backends.zero2_check import ZeroOptimizerCheck

        return [ZeroOptimizerCheck(plan.offload_optimizer), *super().callbacks(plan, logs_dir)]


def deepspeed_config(plan: PlannedStage) -> dict[str, Any]:
    """The DeepSpeed config for a stage: the user's JSON when `zero2.config` names one, else generated."""
    settings = plan.stage.zero2
    if settings.config:
        return user_config(settings.config, f"stages.{plan.name}.zero2.config")
    zero: dict[str, Any] = {
        "stage": 2,
        "overlap_comm": settings.overlap_comm,
        "contiguous_gradients": settings.contiguous_gradients,
        "reduce_bucket_size": settings.bucket_size,
        "allgather_bucket_size": settings.bucket_size,
    }
    config: dict[str, Any] = {**AUTO_BATCH, "zero_optimization": zero}
    if plan.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
        config["optimizer"] = ADAMW
    if plan.precision in MIXED:
        config[plan.precision] = {"enabled": True}
    return config


def user_config(path: str, where: str) -> dict[str, Any]:
    """A user's DeepSpeed JSON, refused here (with its YAML path) rather than deep inside DeepSpeed."""
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(
            [Problem(where, f"cannot read DeepSpeed config {str(Path(path).resolve())!r}: {err.strerror}")]
        ) from None
    except json.JSONDecodeError as err:
        raise ConfigError([Problem(where, f"{path!r} is not valid JSON: {err}")]) from None
    if (message := user_config_problem(config)) is not None:
        raise ConfigError([Problem(where, f"{path!r} {message}")])
    return config


def user_config_problem(config: Any) -> str | None:
    """What makes a DeepSpeed config unusable as ZeRO-2 under HF Trainer, if anything."""
    zero = config.get("zero_optimization") if isinstance(config, dict) else None
    stage = zero.get("stage") if isinstance(zero, dict) else None
    if stage != 2:
        return f"has zero_optimization.stage={stage!r}; backend zero2 needs stage 2"
    offload = (zero.get("offload_optimizer") or {}).get("device", "none")
    if offload != "none" and "optimizer" not in config and config.get("zero_force_ds_cpu_optimizer", True):
        return (
            "offloads the optimizer but has no `optimizer` entry, so DeepSpeed would refuse the torch "
            f'optimizer HF builds; add "optimizer": {json.dumps(ADAMW)}'
        )
    return None


def steps_on_host(config: dict[str, Any]) -> bool:
    """Whether DeepSpeed must step with its CPU optimizer: offloaded, and not waived by the user."""
    offload = config["zero_optimization"].get("offload_optimizer") or {}
    return offload.get("device", "none") != "none" and config.get("zero_force_ds_cpu_optimizer", True)
