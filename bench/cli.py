"""`make bench-cli`: how long `align validate` and `align plan` take, warm and cold, beside two baselines
measured in the same run: a bare interpreter, and `import torch` (what a CLI that imports torch pays).

Cold: a fresh ALIGN_CACHE, so each `trl:` block is checked by TRL's own config class (imports TRL) and
each model is counted on the meta device (imports torch, transformers and peft). Warm: the same pipeline
again, its checks and counts cached. New model: warm checks, but the model counts dropped from the cache
(what the first plan of a model costs). Medians of `--repeat` runs; writes bench/results/cli-cpu.md. A
benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ALIGN = [sys.executable, "-m", "align.cli"]
PIPELINES = [
    "pipelines/tiny_sft_dpo_merge.yaml",
    "pipelines/tiny_sft_rm_ppo.yaml",
    "pipelines/dpo_llama3.yaml",
    "pipelines/sft_mixtral_lora.yaml",
]


def seconds(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
    return elapsed


def median(command: list[str], env: dict[str, str], repeat: int, fresh_cache: bool = False) -> float:
    times = []
    for _ in range(repeat):
        if fresh_cache:
            env = {**env, "ALIGN_CACHE": tempfile.mkdtemp(prefix="align-bench-cli-")}
        times.append(seconds(command, env))
    return statistics.median(times)


def new_model(command: list[str], env: dict[str, str], repeat: int) -> float:
    """Median time with the trl checks cached but no model counts (`$ALIGN_CACHE/model-counts` removed)."""
    times = []
    for _ in range(repeat):
        shutil.rmtree(Path(env["ALIGN_CACHE"]) / "model-counts", ignore_errors=True)
        times.append(seconds(command, env))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ALIGN_CACHE": tempfile.mkdtemp(prefix="align-bench-cli-")}
    python = median([sys.executable, "-c", "pass"], env, args.repeat)
    torch = median([sys.executable, "-c", "import torch"], env, args.repeat)
    rows = []
    for pipeline in PIPELINES:
        for command in ("validate", "plan"):
            cold = median([*ALIGN, command, pipeline], env, args.repeat, fresh_cache=True)
            seconds([*ALIGN, command, pipeline], env)  # fill the cache
            warm = median([*ALIGN, command, pipeline], env, args.repeat)
            fresh = new_model([*ALIGN, command, pipeline], env, args.repeat)
            rows.append((f"align {command} {pipeline}", warm, fresh, cold))
            print(f"{rows[-1][0]}: warm {warm:.2f}s, new model {fresh:.2f}s, cold {cold:.2f}s", flush=True)
    lines = [
        "# `align validate` / `align plan` wall time (`make bench-cli`)",
        "",
        f"{os.cpu_count()} CPU cores; medians of {args.repeat} runs. Baselines in the same run: a bare "
        f"interpreter {python:.2f} s, `import torch` {torch:.2f} s.",
        "Warm: the pipeline's `trl:` blocks were checked and its models counted before (cached by config "
        "and library versions). New model: the checks cached, the model counts not (the first plan of a "
        "model: torch imported, the model built on the meta device). Cold: a fresh cache, so TRL's config "
        "classes are imported to check the blocks too.",
        "",
        "| command | warm s | warm / bare python | new model s | cold s | cold / import torch |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| `{name}` | {warm:.2f} | {warm / python:.1f}x | {new:.2f} | {cold:.2f} | {cold / torch:.1f}x |"
            for name, warm, new, cold in rows
        ),
        "",
    ]
    out = ROOT / "bench" / "results" / "cli-cpu.md"
    out.write_text("\n".join(lines))
    print(out.read_text())


if __name__ == "__main__":
    main()
