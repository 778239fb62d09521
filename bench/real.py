"""`make bench-real`: align's SFT, DPO and GRPO stages on the real SmolLM2-135M-Instruct against the same runs
as plain TRL scripts (bench/plain_trl.py), alternated, each at least twice.

Each kind runs one align stage (`align run` of a one-stage pipeline: 1 worker, fp32, LoRA r16 all-linear) and
the plain script with the same `trl:` settings and LoRA. Reported per kind: the steady step (the median wall
time of the steps after the first: align records it as `seconds_per_step_steady`, the script times the same
steps with a callback), the whole run's wall time, each as align/plain; and what align adds, itemized from
its stage record (`time_*_s`: preparing, the held-out measures, samples, saving) and the driver's wall time
(Ray, the plan, the record). A 100-step stage's wall time is projected from the fixed costs and the steady
steps. Writes bench/results/real-cpu.md and .json. A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from alternate import alternating
from overhead import timed

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
LORA = {"r": 16, "alpha": 32, "target_modules": "all-linear"}
COMMON = {"per_device_train_batch_size": 8, "gradient_checkpointing": False, "logging_steps": 1}
KINDS = {
    "sft": (
        "recipes/data/json/sft.jsonl",
        {**COMMON, "learning_rate": 2.0e-4, "max_length": 96, "padding_free": False},
    ),
    "dpo": (
        "recipes/data/json/prefs.jsonl",
        {**COMMON, "learning_rate": 1.0e-4, "max_length": 96, "beta": 0.1},
    ),
    "grpo": (
        "recipes/data/addition/train.jsonl",
        {
            **COMMON,
            "learning_rate": 2.0e-4,
            "num_generations": 8,
            "max_completion_length": 32,
            "temperature": 0.7,
        },
    ),
}
PROJECTED_STEPS = 100
HELD_OUT = 32  # rows align measures before and after, as the recipes' stages do
ALIGN_PARTS = ("prepare", "measure_before", "samples_before", "measure_after", "samples_after", "save")


def split(kind: str) -> tuple[Path, Path]:
    """The kind's rows as a training file and a held-out file of the last HELD_OUT rows, written once: both
    sides train on the same file, so with one seed they draw the same batches, step for step."""
    folder = Path(tempfile.gettempdir()) / "align-bench-real-data" / kind
    train, held_out = folder / "train.jsonl", folder / "held_out.jsonl"
    if not train.exists():
        rows = (ROOT / KINDS[kind][0]).read_text().splitlines(keepends=True)
        folder.mkdir(parents=True, exist_ok=True)
        held_out.write_text("".join(rows[-HELD_OUT:]))
        train.write_text("".join(rows[:-HELD_OUT]))
    return train, held_out


def align_run(kind: str, steps: int) -> dict[str, float]:
    """One `align run` of a one-stage pipeline; its wall time and the stage record's figures."""
    train, held_out = split(kind)
    stage = {
        "kind": kind,
        "data": {"train": str(train), "eval": str(held_out)},
        "lora": LORA,
        "trl": {**KINDS[kind][1], "max_steps": steps},
    }
    stage["trl"]["save_strategy"] = "no"
    if kind == "grpo":
        stage["rewards"] = [{"function": "final_number"}]
    body = {"name": f"real-{kind}", "base_model": "smollm2-135m", "defaults": {"workers": 1, "seed": 0}}
    folder = Path(tempfile.mkdtemp(prefix=f"align-bench-real-{kind}-"))
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump({**body, "stages": {kind: stage}}, sort_keys=False))
    wall, _ = timed([sys.executable, "-m", "align.cli", "run", str(path)], folder)
    metrics = json.loads((folder / "runs" / f"real-{kind}" / kind / "align-stage.json").read_text())[
        "metrics"
    ]
    parts = {part: metrics.get(f"time_{part}_s", 0.0) for part in ALIGN_PARTS}
    return {
        "wall": wall,
        "train": metrics["time_train_s"],
        "step": metrics["seconds_per_step_steady"],
        **parts,
        "outside_stage": wall - metrics["time_train_s"] - sum(parts.values()),
    }


def plain_run(kind: str, steps: int, model: str) -> dict[str, float]:
    folder = Path(tempfile.mkdtemp(prefix=f"align-bench-plain-{kind}-"))
    settings = {**KINDS[kind][1], "max_steps": steps, "save_strategy": "no"}
    command = [sys.executable, str(ROOT / "bench" / "plain_trl.py"), kind, model, str(split(kind)[0])]
    command += [str(folder / "out"), "--trl", json.dumps(settings), "--lora", json.dumps(LORA)]
    wall, out = timed(command, folder)
    found = json.loads(out.strip().splitlines()[-1])
    steady = statistics.median(found["step_seconds"]) if len(found["step_seconds"]) >= 2 else float("nan")
    return {"wall": wall, "train": found["train"], "step": steady, "save": found["save"]}


def median(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(run[key] for run in runs)


def spread(values: list[float]) -> str:
    """The median of the runs, with their range."""
    return f"{statistics.median(values):.2f} s ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="alternating runs of each side per kind")
    parser.add_argument("--kinds", nargs="+", default=list(KINDS), choices=list(KINDS))
    parser.add_argument("--steps", type=json.loads, default={"sft": 12, "dpo": 8, "grpo": 5})
    args = parser.parse_args()
    from align.models.loading import resolve_model

    model = str(resolve_model("smollm2-135m"))
    started = time.time()
    results: dict = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "load_before": os.getloadavg()[0],
        "kinds": {},
    }
    for kind in args.kinds:
        steps = args.steps[kind]

        def measure(side: str, kind: str = kind, steps: int = steps) -> dict[str, float]:
            return align_run(kind, steps) if side == "align" else plain_run(kind, steps, model)

        results["kinds"][kind] = {"steps": steps, **alternating(["align", "plain"], args.repeat, measure)}
    results["load_after"] = os.getloadavg()[0]
    results["minutes"] = (time.time() - started) / 60
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "real-cpu.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "real-cpu.md").write_text(report(results))
    print(report(results))


def report(results: dict) -> str:
    rows, parts = [], []
    for kind, found in results["kinds"].items():
        align, plain, steps = found["align"], found["plain"], found["steps"]
        a_step, p_step = median(align, "step"), median(plain, "step")
        a_fixed = median(align, "wall") - steps * a_step
        p_fixed = median(plain, "wall") - steps * p_step
        projected = (a_fixed + PROJECTED_STEPS * a_step) / (p_fixed + PROJECTED_STEPS * p_step)
        rows.append(
            f"| {kind} | {steps} | {spread([r['step'] for r in align])} "
            f"| {spread([r['step'] for r in plain])} "
            f"| {a_step / p_step:.2f}x | {median(align, 'wall'):.0f} s | {median(plain, 'wall'):.0f} s "
            f"| {median(align, 'wall') / median(plain, 'wall'):.2f}x | {projected:.2f}x |"
        )
        items = " | ".join(f"{median(align, part):.1f} s" for part in (*ALIGN_PARTS, "outside_stage"))
        parts.append(f"| {kind} | {items} | {median(plain, 'wall') - median(plain, 'train'):.1f} s |")
    repeat = len(next(iter(results["kinds"].values()))["align"])
    return "\n".join(
        [
            f"# align against plain TRL on SmolLM2-135M-Instruct ({results['date']})",
            "",
            f"{results['machine']}; load average {results['load_before']:.1f} before, "
            f"{results['load_after']:.1f} after. One stage per kind, 1 worker, fp32, LoRA r16 alpha 32 "
            "all-linear, batch 8, no gradient checkpointing (SFT and DPO at max_length 96; GRPO 8 "
            "generations of 32 tokens, `final_number` reward), as `align run` and as bench/plain_trl.py "
            f"with the same settings, alternated, {repeat} runs each; medians with the range. "
            f"Written by `make bench-real` (bench/real.py) in {results['minutes']:.0f} min.",
            "",
            "| kind | steps | align step | plain TRL step | step ratio | align wall | plain wall "
            "| wall ratio "
            f"| {PROJECTED_STEPS}-step wall ratio (projected) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "What align adds around TRL's train loop, from its stage record (`time_*_s`) and the driver's "
            "wall time; the plain script's whole time outside its train loop (imports, loading, trainer, "
            "save) is the last column:",
            "",
            "| kind | prepare (data, model, trainer) | held-out before | samples before | held-out after "
            "| samples after | save and record | outside the stage (Python, Ray, plan, workers) "
            "| plain TRL outside its loop |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
            *parts,
            "",
        ]
    )


if __name__ == "__main__":
    main()
