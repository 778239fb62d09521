"""`make bench-concurrency`: two stages that read one parent, run one after the other against side by side.

The pipeline is a 2-step SFT parent (LoRA, tiny model) and two SFT children on its adapter. As `serial`
the children keep align's default on one machine (a CPU stage takes every core, so the second waits for
the first); as `concurrent` each asks for one CPU (`resources: {cpus_per_worker: 1}`), so both fit this
machine at once. Each variant runs `--repeats` times, alternating, each in a fresh `align run` with its own
embedded Ray. Reported: the run's wall time, the children's span (first start to last end, from their
records), and the sum of the children's own times (a stage's wait for another's resources left out).
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


def stage(steps: int, **fields) -> dict:
    data = {"train": "align:chatterbot/sft/train", "eval": "none"}
    return {"kind": "sft", "data": data, "lora": {"r": 8}, "trl": {**TRL, "max_steps": steps}, **fields}


def pipeline(folder: Path, steps: int, concurrent: bool) -> Path:
    child = {
        "model": "${stages.parent.output}",
        **({"resources": {"cpus_per_worker": 1}} if concurrent else {}),
    }
    body = {
        "name": "fork",
        "base_model": "tiny",
        "defaults": {"output_root": "runs", "workers": 1, "precision": "fp32", "seed": 0},
        "stages": {"parent": stage(2), "left": stage(steps, **child), "right": stage(steps, **child)},
    }
    path = folder / "fork.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def measure(steps: int, concurrent: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="align-bench-fork-") as tmp:
        path = pipeline(Path(tmp), steps, concurrent)
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
            for name in ("left", "right")
        ]
    spans = [(record["started"], record["ended"]) for record in records]
    return {
        "wall": wall,
        "children_span": max(end for _, end in spans) - min(start for start, _ in spans),
        "children_own": sum(record["ended"] - record["started"] - record["waited_s"] for record in records),
    }


def summary(values: list[float]) -> str:
    spread = f" ± {statistics.stdev(values):.1f}" if len(values) > 1 else ""
    return f"{statistics.mean(values):.1f}{spread}"


def markdown(steps: int, results: dict[str, list[dict[str, float]]]) -> str:
    serial, concurrent = results["serial"], results["concurrent"]
    ratio = statistics.mean(r["children_span"] for r in concurrent) / statistics.mean(
        r["children_span"] for r in serial
    )
    lines = [
        "# Two stages of one parent: one after the other against side by side (CPU)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; tiny Llama, LoRA r8, {steps} steps per "
        f"child, batch 8; {len(serial)} runs per variant, alternating (mean ± sd, seconds). "
        "`make bench-concurrency`.",
        "",
        "| variant | run wall | children's span | sum of children's own times (waits left out) |",
        "|---|---:|---:|---:|",
    ]
    lines += table_rows(results, ("wall", "children_span", "children_own"), summary)
    lines += [
        "",
        f"Children's span, concurrent / serial: **{ratio:.2f}x**. `serial` is align's default on one "
        "machine (a CPU stage takes every core); `concurrent` gives each child one CPU, so both run at once, "
        "each on one thread (a serial child's rank runs two). A child's own time includes starting its "
        "worker group: the serial second child reuses the first one's.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    variants = ["serial", "concurrent"]
    results = alternating(variants, args.repeats, lambda name: measure(args.steps, name == "concurrent"))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "concurrency-cpu.md").write_text(markdown(args.steps, results))
    print((RESULTS / "concurrency-cpu.md").read_text())


if __name__ == "__main__":
    main()
