"""`make bench-gpu`: SFT of SmolLM2-135M in bf16 on one GPU, tokens/s and MFU, align against plain TRL.

Three runs on the same rows (the shipped chat rows and the built varied-length rows of bench/batching.py),
the same batch, `max_length` and steps, full parameters: plain TRL with its defaults on a GPU (bf16, padded
batches; bench/plain_trl_sft.py), align's runner with padded batches, and align's default (padding-free).
Tokens are the real ones TRL counts (`num_tokens`); MFU is 6 × parameters × tokens/s over the GPU's dense
bf16 peak (the attention term left out, as is usual at these lengths). Writes bench/results/sft-gpu.md
and .json. Needs a CUDA GPU; without one it says so and exits 2 (`--steps 2` on a CPU checks the script).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from batching import RESULTS, ROOT, throughput, varied_rows

PEAK_BF16_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0}
"""Dense bf16 tensor-core peaks (SXM parts), by the name the GPU reports."""
MODEL = "smollm2-135m"
RUNS = {
    "plain TRL (bf16, padded)": None,
    "align, padded": {"padding_free": False},
    "align (padding-free)": {},
}


def peak_tflops(name: str) -> float | None:
    return next((peak for key, peak in PEAK_BF16_TFLOPS.items() if key in name), None)


def plain_trl(
    folder: Path, model_dir: str, data: str, steps: int, batch: int, max_length: int, bf16: bool
) -> dict:
    script = ROOT / "bench" / "plain_trl_sft.py"
    command = [sys.executable, str(script), model_dir, data, str(folder), "--steps", str(steps)]
    command += ["--batch", str(batch), "--max-length", str(max_length), *(["--bf16"] if bf16 else [])]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return {"seconds": found["train_seconds"], "tokens": found["tokens"]}


def main() -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    args = parser.parse_args()
    gpu = torch.cuda.is_available()
    if not gpu and args.steps > 2:
        print("bench-gpu needs a CUDA GPU; none here (`--steps 2` runs a CPU check of the script)")
        return 2
    from align.data.corpora import builtin_path
    from align.models.loading import resolve_model

    model_dir = str(resolve_model(MODEL))
    work = Path(tempfile.mkdtemp(prefix="align-bench-gpu-"))
    chat = str(builtin_path("align:chatterbot/sft/train"))
    sets = {"chatterbot": (chat, 256), "varied": (varied_rows(work), 1024)}
    precision = "bf16" if gpu else "fp32"
    results = {}
    for name, (data, max_length) in sets.items():
        for run, trl in RUNS.items():
            folder = work / f"{name}-{len(results)}"
            if trl is None:
                found = plain_trl(folder, model_dir, data, args.steps, args.batch, max_length, gpu)
            else:
                trl = {**trl, "learning_rate": 2e-5}
                found = throughput(folder, data, args.steps, max_length, args.batch, trl, MODEL, precision)
            results[f"{name} | {run}"] = {**found, "tokens_per_s": found["tokens"] / found["seconds"]}
    return report(results, model_dir, args, gpu)


def report(results: dict, model_dir: str, args: argparse.Namespace, gpu: bool) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    parameters = sum(p.numel() for p in model.parameters())
    device = torch.cuda.get_device_name() if gpu else "CPU (script check only)"
    peak = peak_tflops(device)
    lines = [
        f"# SmolLM2-135M SFT on one GPU: tokens/s and MFU ({time.strftime('%Y-%m-%d %H:%M')})",
        "",
        f"{device}; {parameters / 1e6:.0f}M parameters, bf16 mixed precision, full parameters, batch "
        f"{args.batch}, {args.steps} steps per run; MFU = 6 × parameters × tokens/s over "
        f"{peak or '?'} TFLOPS. Written by `make bench-gpu` (bench/gpu_sft.py).",
        "",
        "| rows | run | train loop | tokens | tokens/s | vs plain TRL | MFU |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for key, found in results.items():
        rows, run = key.split(" | ")
        plain = results[f"{rows} | plain TRL (bf16, padded)"]["tokens_per_s"]
        mfu = f"{100 * 6 * parameters * found['tokens_per_s'] / (peak * 1e12):.1f}%" if peak else "-"
        lines.append(
            f"| {rows} | {run} | {found['seconds']:.1f} s | {found['tokens']:,} | "
            f"{found['tokens_per_s']:,.0f} | {found['tokens_per_s'] / plain:.2f}× | {mfu} |"
        )
    page = "\n".join(lines) + "\n"
    print(page)
    if gpu:  # a CPU check of the script leaves the results folder alone
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "sft-gpu.md").write_text(page)
        (RESULTS / "sft-gpu.json").write_text(
            json.dumps({"parameters": parameters, "runs": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
