"""Stage runners, one module per kind: each has `run(StageContext) -> StageResult`."""

from __future__ import annotations

from types import ModuleType


def runner_for(kind: str) -> ModuleType:
    """The runner module of a stage kind, imported only in the worker that needs it."""
    from align.stages import dpo, grpo, merge, ppo, reward, sft

    runners: dict[str, ModuleType] = {
        "sft": sft,
        "dpo": dpo,
        "reward": reward,
        "grpo": grpo,
        "rloo": grpo,
        "ppo": ppo,
        "merge": merge,
    }
    return runners[kind]
