"""`make bench`: does the memory plan match the model-state bytes each backend really holds?

One full-parameter SFT stage per backend (ddp, zero2, zero2 with optimizer offload, fsdp) on 2 ranks
trains a ~60M-parameter random Llama for a few steps, big enough that model states dwarf the runtime.
The stages come from an ordinary align pipeline file, planned by `align.planning.plan.build` and run by
align's own stage runner and backend modules on Ray Train workers, exactly as `align run` runs
them, plus one callback (`probe.py`) that counts what each rank holds. The CLI itself cannot take
that callback, hence this driver. Results: `bench/results/memory-{cpu,gpu}.{md,json}`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import probe
import tables
import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
RUNS = ROOT / "runs" / "bench"
PIPELINE = "bench-memory"
WORKERS = 2
SHAPE = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 8,
    "num_attention_heads": 12,
    "num_key_value_heads": 12,
}
ZERO2_BUCKET = 5_000_000
"""Small ZeRO buckets (5M elements) so that communication buffers stay small next to model states."""
STAGES = {
    "ddp": ("ddp", {}),
    "zero2": ("zero2", {"zero2": {"offload_optimizer": "none", "bucket_size": ZERO2_BUCKET}}),
    "zero2-offload": ("zero2", {"zero2": {"offload_optimizer": "cpu", "bucket_size": ZERO2_BUCKET}}),
    "fsdp": ("fsdp", {}),
}
"""Stage name -> (backend, stage settings); the stage name is also its `memory_by_backend` key."""
PLAN_KEYS = {"ddp": "ddp", "zero2": "zero2", "zero2-offload": "zero2+offload", "fsdp": "fsdp"}


def build_bench_model(out_dir: Path) -> None:
    """Random-init Llama (hidden 768, 8 layers, MLP 2048) with the tiny BPE tokenizer: about 60M params."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from align.models.tiny import train_tokenizer

    tokenizer = train_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **SHAPE,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def bench_model() -> Path:
    """The benchmark model, built once into align's cache (about 240 MB)."""
    from align.cache import build_once, cache_root

    return build_once(cache_root() / "bench" / "llama-60m", build_bench_model)


def pipeline_body(model_dir: Path, steps: int, precision: str, names: list[str]) -> dict[str, Any]:
    """An ordinary align pipeline: one SFT stage per named backend; `auto` is fp32 on CPU, bf16 on GPU."""
    trl = {
        "max_steps": steps,
        "per_device_train_batch_size": 2,
        "max_length": 64,
        "learning_rate": 1e-4,
        "logging_steps": 1,
        "eval_strategy": "no",
        "save_strategy": "no",
        "report_to": [],
    }
    data = {"train": "align:chatterbot/sft/train", "max_train_rows": 4 * WORKERS * steps}
    stages = {
        name: {"kind": "sft", "backend": backend, "data": data, "trl": trl, **settings}
        for name, (backend, settings) in STAGES.items()
        if name in names
    }
    defaults = {"output_root": str(RUNS), "workers": WORKERS, "precision": precision, "seed": 0}
    return {"name": PIPELINE, "base_model": str(model_dir), "defaults": defaults, "stages": stages}


def launch(stage: Any, folder: Path, gpu: bool) -> None:
    """One stage on `stage.workers` Ray Train workers, as align's controller launches it, probed."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)) // stage.workers)
    trainer = TorchTrainer(
        probe.train_loop,
        train_loop_config={"plan": stage, "output_dir": str(folder)},
        scaling_config=ScalingConfig(
            num_workers=stage.workers, use_gpu=gpu, resources_per_worker=None if gpu else {"CPU": cpus}
        ),
        torch_config=TorchConfig(backend="nccl" if gpu else "gloo"),
        run_config=RunConfig(name=f"{PIPELINE}-{stage.name}", storage_path=str(RUNS / ".ray")),
    )
    trainer.fit()


def run_stages(plan: Any, names: list[str], gpu: bool) -> dict[str, str]:
    """Run each named stage into a clean folder; a stage that fails is reported, not fatal."""
    import ray

    from align.run.inputs import resolve_inputs
    from align.run.launch import connect
    from align.run.records import stage_dir

    ray.cloudpickle.register_pickle_by_value(probe)  # the workers cannot import bench/
    connect(None)
    folders = {name: stage_dir(str(RUNS), PIPELINE, name) for name in plan.order}
    failures = {}
    for name in names:
        stage = dataclasses.replace(plan.stages[name], inputs=resolve_inputs(plan.stages[name], folders))
        shutil.rmtree(folders[name], ignore_errors=True)
        folders[name].mkdir(parents=True)
        print(f"[{name}] {stage.backend} on {stage.workers} ranks, {stage.precision}", flush=True)
        started = time.time()
        try:
            launch(stage, folders[name], gpu)
        except Exception as err:  # noqa: BLE001 - an unfinished backend must not stop the others
            failures[name] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"
            print(f"[{name}] FAILED: {failures[name]}", flush=True)
            continue
        print(f"[{name}] done in {time.time() - started:.0f}s", flush=True)
    return failures


def read_reports(folder: Path, prefix: str) -> list[dict[str, Any]]:
    """Each rank's `logs/{prefix}-rank{R}.json`, in rank order."""
    return [json.loads(p.read_text()) for p in sorted((folder / "logs").glob(f"{prefix}-rank*.json"))]


def step_seconds(rank0: dict[str, Any]) -> float | None:
    """Median wall time of rank 0's optimizer steps after the first (which pays one-off set-up)."""
    times = rank0.get("step_seconds", [])[1:]
    return statistics.median(times) if times else None


def runtime_per_step(folder: Path) -> float | None:
    """HF's `train_runtime / global steps` from the stage's metrics.jsonl (includes the first step)."""
    path = folder / "logs" / "metrics.jsonl"
    if not path.is_file():
        return None
    entries = [json.loads(line) for line in path.read_text().splitlines()]
    end = next((e for e in entries if "train_runtime" in e), None)
    return end["train_runtime"] / end["step"] if end and end.get("step") else None


def deepspeed_estimate(params: int, workers: int, offload: bool) -> int:
    """DeepSpeed's own ZeRO-2 model-state estimate per rank: device bytes, plus host bytes / ranks.

    `additional_buffer_factor=1.0` drops its 1.5x safety margin; it assumes 16-bit weights.
    """
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    host, device = estimate_zero2_model_states_mem_needs(
        params, num_gpus_per_node=workers, cpu_offload=offload, additional_buffer_factor=1.0
    )
    return device + (host // workers if offload else 0)


def planned(estimate: Any) -> dict[str, int]:
    """The plan's per-rank model states by category, device and host together."""
    return {
        category: getattr(estimate.device, category) + getattr(estimate.host, category)
        for category in probe.MODEL_STATES
    }


def measured(rank: dict[str, Any]) -> dict[str, int]:
    """A rank's bytes by category at its model-state peak, all devices together; DDP buckets as buffers."""
    totals = dict.fromkeys(probe.CATEGORIES, 0)
    for per_device in rank["at_peak"].values():
        for category, nbytes in per_device.items():
            totals[category] += nbytes
    totals["buffers"] += rank.get("ddp_bucket_bytes", 0)
    return totals


def stage_result(name: str, stage: Any, folder: Path, gpu: bool) -> dict[str, Any]:
    """Plan and measurement of one stage, per rank and for its largest rank."""
    ranks = read_reports(folder, "model-states")
    estimate = stage.memory_by_backend[PLAN_KEYS[name]]
    plan = planned(estimate)
    result: dict[str, Any] = {
        "backend": PLAN_KEYS[name],
        "planned": {**plan, "model_states": sum(plan.values())},
        "planned_device_model_states": estimate.device.model_states,
        "placement_reports": read_reports(folder, "placement"),
        "ranks": ranks,
        "runtime_per_step": runtime_per_step(folder),
    }
    if not ranks:
        return result
    per_rank = [measured(rank) for rank in ranks]
    largest = max(range(len(ranks)), key=lambda i: sum(per_rank[i][c] for c in probe.MODEL_STATES))
    held = per_rank[largest]
    top = ranks[largest]
    result["largest_rank"] = largest
    result["measured"] = {**held, "model_states": sum(held[c] for c in probe.MODEL_STATES)}
    result["ratio"] = result["measured"]["model_states"] / result["planned"]["model_states"]
    result["peak_rss"] = max(rank["peak_rss"] for rank in ranks)
    result["rss_growth"] = top["rss_at_peak"] - top["rss_baseline"]
    result["live_tensor_bytes"] = top.get("live_tensor_bytes", 0) + top.get("ddp_bucket_bytes", 0)
    result["step_seconds"] = step_seconds(ranks[0])
    if gpu:
        result["cuda_peak"] = max(rank.get("cuda_peak") or 0 for rank in ranks)
    if stage.backend == "zero2":
        params = estimate.trainable_params
        result["deepspeed_estimate"] = deepspeed_estimate(params, stage.workers, "offload" in name)
    return result


def run_metadata(plan: Any, params: int, seconds: float, gpu: bool) -> dict[str, Any]:
    """What produced the numbers: model, settings, hardware, versions, runtime."""
    from align.run.records import versions

    first = plan.stages[plan.order[0]]
    trl = first.stage.trl
    return {
        "model": {**SHAPE, "params": params},
        "workers": first.workers,
        "precision": first.precision,
        "steps": trl["max_steps"],
        "micro_batch": trl["per_device_train_batch_size"],
        "max_length": trl["max_length"],
        "zero2_bucket_size": ZERO2_BUCKET,
        "device": "gpu" if gpu else "cpu",
        "cpu_count": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "versions": {
            k: v for k, v in versions().items() if k in ("torch", "transformers", "deepspeed", "ray")
        },
        "runtime_seconds": round(seconds),
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per stage (default 6)")
    parser.add_argument("--only", nargs="*", choices=list(STAGES), help="run these stages only")
    parser.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16", "bf16-pure"],
        help="every stage's precision (default auto); other than auto, the results page is named after it",
    )
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    started = time.time()
    import torch

    from align.pipeline.file import load
    from align.planning.hardware import Hardware
    from align.planning.plan import build

    gpu = torch.cuda.is_available()
    if gpu and torch.cuda.device_count() < WORKERS:
        print(f"the GPU bench needs {WORKERS} GPUs (one per rank); run with CUDA_VISIBLE_DEVICES= for CPU")
        return 1
    RUNS.mkdir(parents=True, exist_ok=True)
    path = RUNS / f"{PIPELINE}.yaml"
    names = args.only or list(STAGES)
    body = pipeline_body(bench_model(), args.steps, args.precision, names)
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    plan = build(load(path), Hardware.detect())
    failures = run_stages(plan, names, gpu)
    results = {}
    for name in names:
        folder = RUNS / PIPELINE / name
        results[name] = stage_result(name, plan.stages[name], folder, gpu)
        shutil.rmtree(folder / "model", ignore_errors=True)  # the logs matter, not 240 MB of random weights
        if name in failures:
            results[name]["failed"] = failures[name]
    params = plan.stages[names[0]].memory_by_backend["ddp"].trainable_params
    meta = run_metadata(plan, params, time.time() - started, gpu)
    RESULTS.mkdir(parents=True, exist_ok=True)
    suffix = "" if args.precision == "auto" else f"-{args.precision}"
    stem = RESULTS / f"memory-{meta['device']}{suffix}"
    stem.with_suffix(".json").write_text(json.dumps({"run": meta, "stages": results}, indent=2) + "\n")
    stem.with_suffix(".md").write_text(tables.markdown(meta, results))
    print(stem.with_suffix(".md").read_text())
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
