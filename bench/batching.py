"""`make bench` (SFT batching part): tokens/s of align's padding-free SFT against TRL's default padded
batches, and TRL's packing beside them, on the shipped chat rows and on rows of widely varied lengths.

Each run is align's own SFT runner in this process (no Ray: the train loop only), full parameters, fp32,
seed 0, the same rows, batch and `max_length`; tokens/s is the real (unpadded) tokens TRL counts
(`num_tokens`) over the train loop's time (`train_runtime`). Padded and padding-free runs see the same rows
in the same steps (their losses are equal: tests/test_batching.py); packing fills each row to `max_length`
with pieces of several rows, so its steps hold more tokens. Results: bench/results/batching-cpu.{md,json}
(`--model smollm2-135m`: batching-cpu-smollm2-135m.{md,json}).
Nothing asserts: it measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODES = {"padded (TRL's default)": {"padding_free": False}, "padding-free (align's default)": {}}
PACKED = {"packed (trl.packing)": {"packing": True}}
WORDS = "the a cat dog sat ran on under over mat tree house river quickly slowly red blue green".split()


def varied_rows(folder: Path, count: int = 2000) -> str:
    """Prompt-completion rows whose lengths spread as chat turns do: log-uniform from 4 to 400 words."""
    rng = random.Random(0)

    def words() -> str:
        return " ".join(rng.choices(WORDS, k=round(4 * 100 ** rng.random())))

    path = folder / "varied.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": words(), "completion": " " + words()}) + "\n" for _ in range(count))
    )
    return str(path)


def throughput(
    folder: Path,
    data: str,
    steps: int,
    max_length: int,
    batch: int,
    trl: dict,
    model: str = "tiny",
    precision: str = "fp32",
) -> dict:
    """One SFT run's train loop (align's runner, full parameters): seconds, tokens trained, tokens/s, first
    and last loss."""
    from align.pipeline.file import load
    from align.planning.hardware import Hardware
    from align.planning.plan import build
    from align.run.inputs import resolve_inputs
    from align.stages import run_seeded
    from align.stages.context import StageContext

    trl = {
        "max_steps": steps,
        "per_device_train_batch_size": batch,
        "max_length": max_length,
        "learning_rate": 1e-3,
        "logging_steps": 5 if steps % 5 == 0 else 1,  # the last step is logged: its tokens count
        "save_strategy": "no",
        "report_to": "none",
        **trl,
    }
    body = {
        "name": "bench-batching",
        "base_model": model,
        "defaults": {"output_root": str(folder), "precision": precision, "seed": 0, "workers": 1},
        "stages": {"sft": {"kind": "sft", "data": {"train": data, "eval": "none"}, "trl": trl}},
    }
    folder.mkdir(parents=True)
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(body))
    plan = build(load(folder / "pipeline.yaml"), Hardware.detect(None)).stages["sft"]
    plan = dataclasses.replace(plan, inputs=resolve_inputs(plan, {}))
    run_seeded(StageContext(plan=plan, output_dir=folder / "out"))
    logged = [
        json.loads(line) for line in (folder / "out" / "logs" / "metrics.jsonl").read_text().splitlines()
    ]
    seconds = next(entry["train_runtime"] for entry in logged if "train_runtime" in entry)
    tokens = max(entry.get("num_tokens", 0) for entry in logged)
    losses = [entry["loss"] for entry in logged if "loss" in entry]
    return {
        "seconds": seconds,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "loss": [losses[0], losses[-1]],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--model", default="tiny", help="a builtin model; smollm2-135m is a real 135M Llama")
    args = parser.parse_args()
    from align.data.corpora import builtin_path

    work = Path(tempfile.mkdtemp(prefix="align-bench-batching-"))
    sets = {
        "chatterbot (shipped chat rows)": (str(builtin_path("align:chatterbot/sft/train")), 64, 8),
        "varied lengths (built: 4-400 words)": (varied_rows(work), 512, 8),
    }
    started, results = time.time(), {}
    for name, (data, max_length, batch) in sets.items():
        results[name] = {"max_length": max_length, "batch": batch, "runs": {}}
        for index, (mode, trl) in enumerate({**MODES, **PACKED}.items()):
            folder = work / f"{len(results)}-{index}"
            results[name]["runs"][mode] = throughput(
                folder, data, args.steps, max_length, batch, trl, args.model
            )
    summary = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "steps": args.steps,
        "model": args.model,
        "sets": results,
        "seconds": time.time() - started,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    name = "batching-cpu" if args.model == "tiny" else f"batching-cpu-{args.model}"
    (RESULTS / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")
    (RESULTS / f"{name}.md").write_text(report(summary))
    print(report(summary))


def report(summary: dict) -> str:
    lines = [
        f"# SFT batching: tokens/s against TRL's default padded batches ({summary['date']})",
        "",
        f"{summary['machine']}. align's SFT runner in one process, model `{summary.get('model', 'tiny')}`, "
        f"full parameters, fp32, {summary['steps']} steps per run, the train loop only; tokens are the real "
        "(unpadded) ones. "
        f"Written by `make bench` (bench/batching.py) in {summary['seconds'] / 60:.0f} min.",
        "",
        "| rows | batching | batch × max_length | train loop | tokens | tokens/s | vs padded "
        "| loss first → last |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, entry in summary["sets"].items():
        baseline = entry["runs"]["padded (TRL's default)"]["tokens_per_s"]
        for mode, run in entry["runs"].items():
            lines.append(
                f"| {name} | {mode} | {entry['batch']} × {entry['max_length']} | {run['seconds']:.1f} s | "
                f"{run['tokens']:,} | {run['tokens_per_s']:,.0f} | {run['tokens_per_s'] / baseline:.2f}× | "
                f"{run['loss'][0]:.3f} → {run['loss'][1]:.3f} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
