"""`make bench-concurrency`: stages that read one parent, run one after the other against side by side.

The pipeline is a 2-step SFT parent (LoRA, tiny model) and two or three SFT children on its adapter. As
`serial` each child asks for every core (`resources: {cpus_per_worker: <cores>}`, align's default on one
machine before stages shared it), so each waits for the one before; as `default` the children keep align's
default resources, and the run starts them side by side, each with its part of the cores. Each variant runs
`--repeats` times, alternating, each in a fresh `align run` with its own embedded Ray. Reported: the run's
wall time, the children's span (first start to last end, from their records), and the sum of the children's
own times (a stage's wait for another's resources left out), with the load average before and after.
Writes bench/results/concurrency-cpu.md. A benchmark, not a test: nothing asserts.
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
from alternate import alternating, table_rows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
TRL = {"per_device_train_batch_size": 8, "max_length": 64, "learning_rate": 1e-3, "logging_steps": 10}
TRL |= {"save_strategy": "no", "report_to": []}
MODES = ("serial", "default")
TARGET = 0.6
"""Issue 30: default-resource children side by side take at most this fraction of the serial span."""


def stage(steps: int, **fields) -> dict:
    data = {"train": "align:chatterbot/sft/train", "eval": "none"}
    return {"kind": "sft", "data": data, "lora": {"r": 8}, "trl": {**TRL, "max_steps": steps}, **fields}


def child_names(children: int) -> list[str]:
    return [f"child{index}" for index in range(children)]


def pipeline(folder: Path, steps: int, children: int, mode: str) -> Path:
    every_core = {"resources": {"cpus_per_worker": os.cpu_count()}} if mode == "serial" else {}
    child = stage(steps, model="${stages.parent.output}", **every_core)
    body = {
        "name": "fork",
        "base_model": "tiny",
        "defaults": {"output_root": "runs", "workers": 1, "precision": "fp32", "seed": 0},
        "stages": {"parent": stage(2), **dict.fromkeys(child_names(children), child)},
    }
    path = folder / "fork.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def measure(steps: int, children: int, mode: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="align-bench-fork-") as tmp:
        path = pipeline(Path(tmp), steps, children, mode)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "align.cli", "run", str(path)],
            cwd=tmp,
            env=ENV,
            capture_output=True,
            text=True,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(f"align run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        records = [
            json.loads((Path(tmp) / "runs" / "fork" / name / "align-stage.json").read_text())
            for name in child_names(children)
        ]
    spans = [(record["started"], record["ended"]) for record in records]
    return {
        "wall": wall,
        "children_span": max(end for _, end in spans) - min(start for start, _ in spans),
        "children_own": sum(record["ended"] - record["started"] - record["waited_s"] for record in records),
        "cpus_per_child": records[0]["ranks"][0]["cpus"],
    }


def variant(mode: str, children: int) -> str:
    return f"{mode}, {children} children"


def summary(values: list[float]) -> str:
    if len(set(values)) == 1:  # one run, or CPUs per child
        return f"{values[0]:.4g}"
    return f"{statistics.mean(values):.1f} ± {statistics.stdev(values):.1f}"


def ratio(results: dict[str, list[dict[str, float]]], children: int) -> float:
    """The children's mean span side by side over their mean span one after the other."""
    default, serial = (results[variant(mode, children)] for mode in ("default", "serial"))
    return statistics.mean(r["children_span"] for r in default) / statistics.mean(
        r["children_span"] for r in serial
    )


def markdown(args: argparse.Namespace, results: dict[str, list[dict[str, float]]], load: list[str]) -> str:
    repeats = len(next(iter(results.values())))
    lines = [
        "# Stages of one parent: one after the other against side by side (CPU)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; tiny Llama, LoRA r8, {args.steps} steps per "
        f"child, batch 8; {repeats} runs per variant, alternating (mean ± sd, seconds). Load average (1, 5, "
        f"15 min) before: {load[0]}; after: {load[1]}. `make bench-concurrency`.",
        "",
        "| variant | CPUs per child | run wall | children's span | sum of children's own times "
        "(waits left out) |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += table_rows(results, ("cpus_per_child", "wall", "children_span", "children_own"), summary)
    lines.append("")
    for children in args.children:
        measured = ratio(results, children)
        verdict = "at most" if measured <= TARGET else "ABOVE"
        lines.append(
            f"- {children} children: span side by side / one after the other **{measured:.2f}x** "
            f"({verdict} the {TARGET}x issue 30 asks)."
        )
    lines += [
        "",
        "`serial`: each child asks for every core, so it waits for the one before and runs on every core "
        "(two threads per rank here); the second and third reuse the first one's warm worker group. "
        "`default`: no `resources:`; the run starts the children together, and on an embedded Ray each "
        "takes its part of the cores (`shared_cpus` in align/planning/resources.py; torch threads follow, "
        "one here), on a worker group of its own. A child's own time includes starting its worker group.",
    ]
    return "\n".join(lines) + "\n"


def load_average() -> str:
    return ", ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--children", type=int, nargs="+", default=[2, 3])
    args = parser.parse_args()
    variants = {variant(mode, n): (mode, n) for n in args.children for mode in MODES}
    load = [load_average()]
    results = alternating(
        list(variants), args.repeats, lambda name: measure(args.steps, variants[name][1], variants[name][0])
    )
    load.append(load_average())
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "concurrency-cpu.md").write_text(markdown(args, results, load))
    print((RESULTS / "concurrency-cpu.md").read_text())


if __name__ == "__main__":
    main()
