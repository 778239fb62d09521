"""`make bench-overhead`: what `align run` costs beyond the training itself, against a plain TRL script.

One SFT stage (tiny model, 1 worker, fp32, the builtin chatterbot rows) runs as `align run` and as
bench/plain_trl_sft.py with the same SFTConfig settings, alternating, at 10 steps and at a size whose
train loop takes about a minute (sized from the plain run's step time). Each run reports wall time and its
train loop (TRL's `train_runtime`); the rest is fixed cost. Also timed: a second stage in the same
pipeline, a rerun where every stage is up to date, and `align validate`/`plan`. Writes
bench/results/overhead-cpu.md and .json. A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BATCH, MAX_LENGTH = 8, 64
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def timed(command: list[str], cwd: Path) -> tuple[float, str]:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=cwd, env=ENV, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return elapsed, done.stdout


def sft_stage(data: str, steps: int, model: str | None = None, padded: bool = True) -> dict:
    """The stage; `padded` batches as plain TRL does by default (align's own default is padding-free)."""
    trl = {
        "max_steps": steps,
        "per_device_train_batch_size": BATCH,
        "max_length": MAX_LENGTH,
        "learning_rate": 1e-3,
        "logging_steps": 10,
        "save_strategy": "no",
        "report_to": [],
        **({"padding_free": False} if padded else {}),
    }
    return {"kind": "sft", "data": {"train": data}, "trl": trl, **({"model": model} if model else {})}


def pipeline(folder: Path, data: str, steps: int, stages: int, padded: bool = True) -> Path:
    body = {"name": "overhead", "base_model": "tiny"}
    body["defaults"] = {"output_root": "runs", "workers": 1, "precision": "fp32", "seed": 0}
    body["stages"] = {"first": sft_stage(data, steps, padded=padded)}
    if stages == 2:
        body["stages"]["second"] = sft_stage(data, steps, model="${stages.first.output}", padded=padded)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "overhead.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def train_seconds(stage_folder: Path) -> float:
    logged = [json.loads(line) for line in (stage_folder / "logs" / "metrics.jsonl").read_text().splitlines()]
    return next(entry["train_runtime"] for entry in logged if "train_runtime" in entry)


def align_run(data: str, steps: int, stages: int = 1, padded: bool = True) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="align-bench-overhead-"))
    path = pipeline(folder, data, steps, stages, padded)
    wall, _ = timed([sys.executable, "-m", "align.cli", "run", str(path)], folder)
    names = ["first", "second"][:stages]
    loops = [train_seconds(folder / "runs" / "overhead" / name) for name in names]
    last = json.loads((folder / "runs" / "overhead" / names[-1] / "align-stage.json").read_text())
    rerun, _ = timed([sys.executable, "-m", "align.cli", "run", str(path)], folder)
    return {
        "wall": wall,
        "train": sum(loops),
        "last_train": loops[-1],
        "last_stage": last["ended"] - last["started"],  # from launch to its record, as the driver saw it
        "rerun": rerun,
        "path": str(path),
    }


RAY_ALONE = """
import os, time, ray
started = time.perf_counter()
ray.init(num_cpus=os.cpu_count(), include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
ray.get(ray.remote(lambda: None).remote())
up = time.perf_counter()
ray.shutdown()
print(up - started, time.perf_counter() - up)
"""


def ray_alone() -> dict[str, float]:
    """Ray's own start (and one task) and stop in a bare script, as align starts it: the part of align's
    fixed cost that is Ray itself."""
    _, out = timed([sys.executable, "-c", RAY_ALONE], ROOT)
    start, stop = map(float, out.split()[-2:])
    return {"start": start, "stop": stop}


def plain_run(model: str, data: str, steps: int) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix="align-bench-plain-"))
    script = str(ROOT / "bench" / "plain_trl_sft.py")
    command = [sys.executable, script, model, data, str(folder / "out"), "--steps", str(steps)]
    wall, out = timed([*command, "--batch", str(BATCH), "--max-length", str(MAX_LENGTH)], folder)
    return {"wall": wall, "train": json.loads(out.strip().splitlines()[-1])["train_seconds"]}


def median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="alternating runs of each side per size")
    parser.add_argument("--loop-seconds", type=float, default=60.0, help="the large size's train loop")
    args = parser.parse_args()
    from align.data.corpora import builtin_path
    from align.models.loading import resolve_model

    model, data = resolve_model("tiny"), str(builtin_path("align:chatterbot/sft/train"))
    started = time.time()
    small = {"align": [], "plain": []}
    for _ in range(args.repeat):
        small["align"].append(align_run(data, 10))
        small["plain"].append(plain_run(model, data, 10))
    per_step = median(small["plain"], "train") / 10
    large_steps = max(100, round(args.loop_seconds / per_step / 100) * 100)
    large = {"align": [], "plain": []}
    for _ in range(args.repeat):
        large["align"].append(align_run(data, large_steps))
        large["plain"].append(plain_run(model, data, large_steps))
    two = align_run(data, 10, stages=2)
    defaults = align_run(data, large_steps, padded=False)
    ray_alone_runs = [ray_alone() for _ in range(args.repeat)]
    path = small["align"][0]["path"]
    validate = statistics.median(
        timed([sys.executable, "-m", "align.cli", "validate", path], ROOT)[0] for _ in range(3)
    )
    plan = statistics.median(
        timed([sys.executable, "-m", "align.cli", "plan", path], ROOT)[0] for _ in range(3)
    )
    results = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "large_steps": large_steps,
        "small": small,
        "large": large,
        "two_stages": two,
        "align_defaults": defaults,
        "ray_alone": ray_alone_runs,
        "validate": validate,
        "plan": plan,
        "seconds": time.time() - started,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "overhead-cpu.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "overhead-cpu.md").write_text(report(results))
    print(report(results))


def report(results: dict) -> str:
    rows = []
    for size, steps in (("small", 10), ("large", results["large_steps"])):
        align, plain = results[size]["align"], results[size]["plain"]
        a_wall, p_wall = median(align, "wall"), median(plain, "wall")
        a_fixed, p_fixed = a_wall - median(align, "train"), p_wall - median(plain, "train")
        rows.append(
            f"| {steps} | {a_wall:.1f} s | {median(align, 'train'):.1f} s | {p_wall:.1f} s | "
            f"{median(plain, 'train'):.1f} s | {a_fixed - p_fixed:+.1f} s | {a_wall / p_wall:.2f}× |"
        )
    first = median(results["small"]["align"], "wall") - median(results["small"]["align"], "train")
    two = results["two_stages"]
    further = two["last_stage"] - two["last_train"]
    skip = median(results["small"]["align"], "rerun")
    default, plain_large = results["align_defaults"], median(results["large"]["plain"], "wall")
    ray_start, ray_stop = median(results["ray_alone"], "start"), median(results["ray_alone"], "stop")
    repeat = len(results["small"]["align"])
    return "\n".join(
        [
            f"# align run vs plain TRL: fixed cost per run ({results['date']})",
            "",
            f"{results['machine']}. One SFT stage: the tiny Llama, 1 worker, fp32, batch {BATCH}, max_length "
            f"{MAX_LENGTH}, chatterbot rows; `align run` (Ray, the plan, held-out slice and samples, record) "
            f"against bench/plain_trl_sft.py (same SFTConfig, padded batches, TRL's default; align's own "
            f"default, padding-free, is below the table). Medians of {repeat} alternating runs. "
            f"Written by `make bench-overhead` (bench/overhead.py) in "
            f"{results['seconds'] / 60:.0f} min.",
            "",
            "| steps | align wall | align train loop | plain TRL wall | plain train loop "
            "| align's extra fixed cost | wall ratio |",
            "|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            f"- align's fixed cost outside the train loop, one stage: {first:.1f} s; each further stage: "
            f"{further:.1f} s (the second stage of a 2-stage pipeline, launch to record, less its "
            "train loop).",
            f"- With align's default batching (padding-free) at {results['large_steps']} steps: "
            f"{default['wall']:.1f} s wall, train loop {default['train']:.1f} s: "
            f"{default['wall'] / plain_large:.2f}× plain TRL's wall.",
            f"- Of that, Ray itself (a bare script, median of {repeat}): start {ray_start:.1f} s, stop "
            f"{ray_stop:.1f} s.",
            f"- A rerun where every stage is up to date: {skip:.2f} s.",
            f"- `align validate`: {results['validate']:.2f} s; `align plan`: {results['plan']:.2f} s (warm).",
            "",
        ]
    )


if __name__ == "__main__":
    main()
