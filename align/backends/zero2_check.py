"""The check that DeepSpeed really took over the optimizer, run once the engine exists (torch-side)."""

from __future__ import annotations

from transformers import TrainerCallback


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
