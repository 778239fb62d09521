"""DeepSpeed ZeRO-2: weights replicated, gradients and optimizer states sharded across ranks.

The DeepSpeed config is generated from the stage's `zero2:` block (or read from the user's own JSON)
and handed to TRL as `deepspeed=<dict>`. Batch size, accumulation, clipping and the AdamW settings
are left "auto", so TrainingArguments stays the single source of truth and HF fills them in.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

# ZeRO-2 keeps whole weights on every rank, so models load, prepare and verify as under DDP; the engine
# is checked once it exists (`ZeroOptimizerCheck`): it does not exist before `train()`.
from align.backends.ddp import check_supported, model_kwargs, prepare, verify  # noqa: F401
from align.backends.report import ShardingReport
from align.errors import ConfigError, Problem
from align.plan import offloads_optimizer

AUTO_BATCH = {
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "train_batch_size": "auto",
    "gradient_clipping": "auto",
}
# ZeRO-Offload steps on the host with DeepSpeedCPUAdam, which DeepSpeed only builds from a config entry
ADAMW = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}}


def deepspeed_config(plan: Any) -> dict[str, Any]:
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
    if offloads_optimizer(plan.stage, "zero2"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": False}
        config["optimizer"] = ADAMW
    if plan.precision in ("bf16", "fp16"):
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


def trainer_args(plan: Any) -> dict[str, Any]:
    """HF Trainer builds the DeepSpeed engine itself from this dict."""
    return {"deepspeed": deepspeed_config(plan)}


def callbacks(plan: Any, logs_dir: Path) -> list[Any]:
    """Check the live optimizer is ZeRO's before any step, then record what each rank holds."""
    return [ZeroOptimizerCheck(steps_on_host(deepspeed_config(plan))), ShardingReport(logs_dir)]


def steps_on_host(config: dict[str, Any]) -> bool:
    """Whether DeepSpeed must step with its CPU optimizer: offloaded, and not waived by the user."""
    offload = config["zero_optimization"].get("offload_optimizer") or {}
    return offload.get("device", "none") != "none" and config.get("zero_force_ds_cpu_optimizer", True)


class ZeroOptimizerCheck(TrainerCallback):
    """Fails before the first step if DeepSpeed did not install the ZeRO optimizer the config asks for.

    A `deepspeed=` setting that is silently dropped (as FSDP settings are on CPU) would otherwise
    train unsharded and look fine.
    """

    def __init__(self, on_host: bool) -> None:
        self.on_host = on_host

    def on_train_begin(self, args, state, control, optimizer=None, **kwargs):
        from deepspeed.ops.adagrad import DeepSpeedCPUAdagrad
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        from deepspeed.ops.lion import DeepSpeedCPULion
        from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

        zero = getattr(optimizer, "optimizer", None)  # inside accelerate's DeepSpeedOptimizerWrapper
        if not isinstance(zero, DeepSpeedZeroOptimizer):
            raise RuntimeError(
                f"backend zero2: the trainer's optimizer is {type(zero or optimizer).__name__}, not "
                "DeepSpeedZeroOptimizer; DeepSpeed did not take over, so nothing would be sharded"
            )
        if self.on_host and not isinstance(
            zero.optimizer, DeepSpeedCPUAdam | DeepSpeedCPULion | DeepSpeedCPUAdagrad
        ):
            raise RuntimeError(
                f"backend zero2 offloads the optimizer, but ZeRO steps with {type(zero.optimizer).__name__}, "
                "not DeepSpeedCPUAdam, so the optimizer states are not on the host"
            )
