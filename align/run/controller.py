"""The Ray driver: a thin controller that walks the plan and runs each stage as a Ray Train job.

It reads like single-process code: for each stage in order, skip it if its record matches,
else launch a TorchTrainer with the stage's worker count and publish its folder when it ends.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from align.errors import AlignError, StageFailed
from align.fingerprint import digest
from align.graph import downstream, reference_target, upstream
from align.models import resolve_model
from align.plan import ModelInput, Plan, StageInputs, StagePlan
from align.run import records
from align.run.worker import ERROR, RESULT, train_loop

Launcher = Callable[[Plan, StagePlan, Path], dict[str, Any]]
"""Runs one stage (its plan carries its resolved inputs) into a scratch folder; returns rank 0's result."""

FORWARDED_ENV = (
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "HF_HOME",
    "ALIGN_CACHE",
    "TORCH_EXTENSIONS_DIR",
    "PYTHONHASHSEED",
)


@dataclass(frozen=True)
class Outcome:
    """How one stage ended in this run: ran, or skipped because its record matched."""

    stage: str
    status: str  # "ran" | "skipped"
    folder: Path
    seconds: float
    metrics: dict[str, float]


def worker_env() -> dict[str, str]:
    """Environment the workers need from the driver (offline switches, caches), and nothing secret."""
    env = {name: os.environ[name] for name in FORWARDED_ENV if name in os.environ}
    # a reward function of the user's own (`allow_custom_code`) imports from where `align` was run
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")]))
    # Ray Train's print patch defeats dill's stdout capture, flooding the log with bytecode
    return {**env, "TOKENIZERS_PARALLELISM": "false", "RAY_TRAIN_ENABLE_PRINT_PATCH": "0"}


def connect(address: str | None) -> None:
    """Join the named cluster, or start an embedded local Ray: no dashboard, loopback only."""
    import ray

    if ray.is_initialized():
        return
    address = address or os.environ.get("RAY_ADDRESS")
    # Ray's own INFO/WARNING chatter (and the state-API warnings it makes with no dashboard) is noise here
    settings = {
        "runtime_env": {"env_vars": worker_env()},
        "log_to_driver": True,
        "logging_config": ray.LoggingConfig(log_level="ERROR"),
    }
    if address:
        ray.init(address=address, **settings)
    else:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1", **settings)


def disconnect() -> None:
    """Shut down this driver's Ray connection (an embedded Ray stops with it)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()


def model_input(value: str, field: str, folders: dict[str, Path]) -> ModelInput:
    """A model value resolved: a builtin's cached folder, a local folder's absolute path, a hub id, or an
    upstream stage's output read from its record (a base with its chain of adapters)."""
    target = reference_target(value)
    if target is None:
        return ModelInput(resolve_model(value, field))
    record = records.read_record(folders[target])
    if record is None or record.get("status") != "succeeded":
        raise AlignError(f"{field}: stage '{target}' has no finished output to read")
    output = record["output"]
    return ModelInput(output["base"], tuple(output["adapters"]))


def resolve_inputs(stage: StagePlan, folders: dict[str, Path]) -> StageInputs:
    """Every folder a stage reads, resolved here on the driver so that no stage imports `run/`."""
    model = model_input(stage.model_source, f"{stage.where}.model", folders)
    reward_models = {
        index: model_input(reward.model, f"{stage.where}.rewards[{index}].model", folders).base
        for index, reward in enumerate(getattr(stage.stage, "rewards", []))
        if reward.model is not None
    }
    return StageInputs(model, reward_models)


def fingerprint(stage: StagePlan, folders: dict[str, Path]) -> str:
    """A hash of the resolved stage config and of its inputs: models, upstream records, data bytes."""
    from align.data import data_identity

    upstream_prints = {name: records.read_record(folders[name])["fingerprint"] for name in stage.upstream}
    data = getattr(stage.stage, "data", None)
    splits = (("train", data.train), ("eval", data.eval)) if data else ()
    inputs = stage.inputs
    own_model = reference_target(stage.model_source) is None  # an upstream's is in its fingerprint
    return digest(
        {
            "stage": stage.stage.model_dump(mode="json"),
            "backend": stage.backend,
            "workers": stage.workers,
            "precision": stage.precision,
            "seed": stage.seed,
            "model": records.model_identity(inputs.model.base) if own_model else None,
            "reward_models": {i: records.model_identity(f) for i, f in inputs.reward_models.items()},
            "upstream": upstream_prints,
            "data": {
                split: data_identity(ref, f"{stage.where}.data.{split}") for split, ref in splits if ref
            },
        }
    )


def ray_launch(plan: Plan, stage: StagePlan, scratch: Path, address: str | None = None) -> dict[str, Any]:
    """Run the stage on `stage.workers` Ray Train workers; return rank 0's result. Ray is joined (or
    started) here, so a run whose stages are all up to date never starts it."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    connect(address)
    gpu = plan.hardware.accelerator
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)) // stage.workers)
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"plan": stage, "output_dir": str(scratch)},
        scaling_config=ScalingConfig(
            num_workers=stage.workers, use_gpu=gpu, resources_per_worker=None if gpu else {"CPU": cpus}
        ),
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        run_config=RunConfig(
            name=f"{plan.pipeline.name}-{stage.name}-{scratch.name[-8:]}",
            storage_path=str(scratch.parent / ".ray"),
        ),
    )
    try:
        trainer.fit()
    except BaseException as err:
        disconnect()  # let Ray's own failure logs drain first, so align's message is the last word
        if not isinstance(err, Exception):
            raise  # Ctrl-C: the caller keeps the stage aside
        if (scratch / ERROR).exists():
            raise AlignError(json.loads((scratch / ERROR).read_text())["message"]) from None
        raise StageFailed(f"stage '{stage.name}' failed: {err}") from None
    return json.loads((scratch / RESULT).read_text())


def output_of(result: dict[str, Any], inputs: ModelInput, folder: Path) -> dict[str, Any]:
    """What the next stage reads: a base with its chain of adapters, or a whole model folder."""
    path = str(folder / result["output"])
    if result["output"] == "adapter":
        return {"kind": "adapter", "path": path, "base": inputs.base, "adapters": [*inputs.adapters, path]}
    return {"kind": "model", "path": path, "base": path, "adapters": []}


def run_stage(plan: Plan, stage: StagePlan, stamp: str, folder: Path, launch: Launcher) -> dict[str, Any]:
    """Run one stage into a scratch folder and publish it with its record; keep it aside on failure."""
    inputs = stage.inputs.model
    record: dict[str, Any] = {
        "pipeline": plan.pipeline.name,
        "stage": stage.name,
        "kind": stage.kind,
        "fingerprint": stamp,
        "config": records.redact(stage.stage.model_dump(mode="json")),
        "resolved": {
            "backend": stage.backend,
            "backend_reason": stage.backend_reason,
            "workers": stage.workers,
            "precision": stage.precision,
            "seed": stage.seed,
            "model": inputs.base,
            "adapters": list(inputs.adapters),
        },
        "versions": records.versions(),
        "git_sha": records.git_sha(),
        "started": time.time(),
    }
    scratch = records.scratch_dir(folder)
    try:
        result = launch(plan, stage, scratch)
    except (AlignError, StageFailed, KeyboardInterrupt) as err:
        record.update(status="failed", ended=time.time(), error=str(err))
        kept = records.keep_failed(scratch, folder, record)
        raise type(err)(f"{err}\n(partial outputs kept in {kept})") from None
    (scratch / RESULT).unlink()
    for leftover in (path for path in scratch.iterdir() if path.is_dir() and not any(path.iterdir())):
        leftover.rmdir()  # e.g. checkpoints/ when the stage saved none
    record.update(
        status="succeeded",
        ended=time.time(),
        metrics=result["metrics"],
        output=output_of(result, inputs, folder),
    )
    records.publish(scratch, folder, record)
    return record


def selected_stages(plan: Plan, only: list[str], force: list[str]) -> tuple[set[str], set[str]]:
    """Stages to consider (the named ones and what they need) and stages to rerun regardless."""
    unknown = [name for name in [*only, *force] if name not in plan.stages]
    if unknown:
        raise AlignError(f"unknown stage {unknown[0]!r}; stages: {', '.join(plan.order)}")
    wanted = upstream(plan.edges, set(only)) if only else set(plan.order)
    return wanted, downstream(plan.edges, set(force))


def run_plan(
    plan: Plan,
    *,
    only: list[str] = (),
    force: list[str] = (),
    address: str | None = None,
    on_event: Callable[[str], None] = lambda _: None,
    launch: Launcher | None = None,
) -> list[Outcome]:
    """Run (or skip) each selected stage in dependency order; a changed stage reruns its dependents.

    `launch` runs a stage; by default on Ray Train (`ray_launch`)."""
    launch = launch or partial(ray_launch, address=address)
    wanted, forced = selected_stages(plan, list(only), list(force))
    root = plan.pipeline.defaults.output_root
    folders = {name: records.stage_dir(root, plan.pipeline.name, name) for name in plan.order}
    outcomes = []
    for name in (n for n in plan.order if n in wanted):
        stage = replace(plan.stages[name], inputs=resolve_inputs(plan.stages[name], folders))
        stamp = fingerprint(stage, folders)
        existing = records.read_record(folders[name])
        if (
            name not in forced
            and existing
            and existing.get("status") == "succeeded"
            and existing.get("fingerprint") == stamp
        ):
            on_event(f"[{name}] skipped: up to date ({folders[name] / records.RECORD})")
            outcomes.append(Outcome(name, "skipped", folders[name], 0.0, existing.get("metrics", {})))
            continue
        on_event(f"[{name}] running {stage.kind} on {stage.workers} worker(s), backend {stage.backend}")
        record = run_stage(plan, stage, stamp, folders[name], launch)
        seconds = record["ended"] - record["started"]
        on_event(f"[{name}] done in {seconds:.1f}s -> {folders[name]}")
        outcomes.append(Outcome(name, "ran", folders[name], seconds, record["metrics"]))
    return outcomes
