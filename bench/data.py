"""`make bench-data`: a large conversational SFT file through `align run` against plain TRL on the same
file (`load_dataset("json")` + SFTTrainer), cold (a fresh `datasets` cache) and warm (rerun, or
`align run --force`), at 200k and 2M generated rows: wall time and peak RSS of the process that trains.

Both sides train the tiny model for the same 20 steps with TRL's padded batches and no held-out
evaluation (`eval: none`), so what differs is the data path. Writes bench/results/data-cpu.md. A benchmark,
not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
STEPS = 20
WORDS = (
    "the a of to and in is it you that he was for on are with as his they be at one have this from or had by "
    "word but what some we can out other were all there when up use your how said an each she which do their "
    "time if will way about many then them write would like so these her long make thing see him two has look"
).split()
PLAIN_TRL = """
import json, resource, sys, time
start = time.perf_counter()
from datasets import load_dataset
from trl import SFTConfig, SFTTrainer
data = load_dataset("json", data_files=sys.argv[1], split="train")
args = SFTConfig(output_dir=sys.argv[2], max_steps={steps}, per_device_train_batch_size=8, report_to=[],
                 save_strategy="no", logging_steps=10, use_cpu=True, bf16=False, seed=0)
SFTTrainer(model=sys.argv[3], args=args, train_dataset=data).train()
rollup = dict(line.split(":", 1) for line in open("/proc/self/smaps_rollup").read().splitlines()[1:])
print(json.dumps({{"seconds": time.perf_counter() - start,
                  "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "anonymous": int(rollup["Anonymous"].split()[0]) * 1024}}))
"""


def write_rows(path: Path, count: int) -> None:
    """`count` two-turn conversations of random words (4-20 in the question, 4-40 in the answer)."""
    rng = random.Random(0)
    with path.open("w") as out:
        for _ in range(count):
            question = " ".join(rng.choices(WORDS, k=rng.randint(4, 20)))
            answer = " ".join(rng.choices(WORDS, k=rng.randint(4, 40)))
            turns = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            out.write(json.dumps({"messages": turns}) + "\n")


Measured = tuple[float, int, int]
"""Wall seconds, peak RSS and anonymous memory at the end (RSS without the pages of memory-mapped files)."""


def plain_trl(rows: Path, model: str, env: dict[str, str], scratch: Path) -> Measured:
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_TRL.format(steps=STEPS), str(rows), str(scratch / "trl-out"), model],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"plain TRL failed:\n{done.stderr[-3000:]}")
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    return measured["seconds"], measured["peak_rss"], measured["anonymous"]


def align_run(pipeline: Path, env: dict[str, str], *extra: str) -> Measured:
    started = time.perf_counter()
    command = [sys.executable, "-m", "align.cli", "run", str(pipeline), *extra]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"align run failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    placement = pipeline.parent / "runs" / "bench-data" / "sft" / "logs" / "placement-rank0.json"
    report = json.loads(placement.read_text())
    return seconds, report["peak_rss_bytes"], report["anonymous_bytes"]


def pipeline_file(folder: Path, rows: Path) -> Path:
    stage = {
        "kind": "sft",
        "data": {"train": str(rows), "eval": "none"},
        "trl": {
            "max_steps": STEPS,
            "per_device_train_batch_size": 8,
            "padding_free": False,
            "logging_steps": 10,
        },
    }
    body = {"name": "bench-data", "base_model": "tiny", "defaults": {"output_root": str(folder / "runs")}}
    path = folder / "bench-data.yaml"
    path.write_text(yaml.safe_dump({**body, "stages": {"sft": stage}}, sort_keys=False))
    return path


def measure(count: int, model: str, base_env: dict[str, str]) -> dict[str, Measured]:
    folder = Path(tempfile.mkdtemp(prefix=f"align-bench-data-{count}-"))
    rows = folder / "rows.jsonl"
    write_rows(rows, count)
    pipeline = pipeline_file(folder, rows)
    env_trl = {**base_env, "HF_DATASETS_CACHE": str(folder / "trl-cache")}
    env_align = {**base_env, "HF_DATASETS_CACHE": str(folder / "align-cache")}
    results = {
        "trl cold": plain_trl(rows, model, env_trl, folder),
        "trl warm": plain_trl(rows, model, env_trl, folder),
        "align cold": align_run(pipeline, env_align),
        "align warm": align_run(pipeline, env_align, "--force", "sft"),
    }
    size = rows.stat().st_size / 1e6
    print(
        f"{count:,} rows ({size:.0f} MB): "
        + ", ".join(f"{k} {s:.1f}s {r / 1e9:.2f}GB" for k, (s, r, _) in results.items())
    )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[200_000, 2_000_000])
    args = parser.parse_args()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    sys.path.insert(0, str(ROOT))
    from align.models.loading import resolve_model

    model = str(resolve_model("tiny"))
    table = {count: measure(count, model, env) for count in args.rows}
    lines = [
        "# A large SFT file: `align run` against plain TRL (`make bench-data`)",
        "",
        f"{os.cpu_count()} CPU cores; tiny model, {STEPS} steps, batch 8, padded batches, no held-out "
        "evaluation on both sides. Cold: a fresh `datasets` cache. Warm: plain TRL run again; `align run "
        "--force sft`. Wall time of the whole command (align's includes validating every row, and Ray's "
        "start and stop); peak RSS of the process that trains (align: its rank-0 worker), and its anonymous "
        "memory when training ends (what it allocated: RSS without memory-mapped file pages).",
        "",
        "| rows | plain TRL cold | align cold | ratio | plain TRL warm | align warm | difference "
        "| peak RSS TRL | peak RSS align cold / warm | anonymous TRL / align |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for count, got in table.items():
        (tc, trss, tanon), (ac, arss, aanon) = got["trl cold"], got["align cold"]
        (tw, _, _), (aw, wrss, _) = got["trl warm"], got["align warm"]
        lines.append(
            f"| {count:,} | {tc:.1f} s | {ac:.1f} s | {ac / tc:.2f}x | {tw:.1f} s | {aw:.1f} s "
            f"| {aw - tw:+.1f} s | {trss / 1e9:.2f} GB | {arss / 1e9:.2f} / {wrss / 1e9:.2f} GB "
            f"| {tanon / 1e9:.2f} / {aanon / 1e9:.2f} GB |"
        )
    if len(table) > 1:
        small, large = table[min(table)], table[max(table)]
        growth = {run: large[run][1] / small[run][1] for run in ("trl cold", "align cold", "align warm")}
        lines += [
            "",
            f"Peak RSS at {max(table):,} rows against {min(table):,}: align's worker "
            f"{growth['align cold']:.2f}x cold and {growth['align warm']:.2f}x warm; plain TRL "
            f"{growth['trl cold']:.2f}x. Anonymous memory "
            f"(align): {large['align cold'][2] / small['align cold'][2]:.2f}x. align's rank converts no file "
            "itself (a child process builds the Arrow copy, `align/data/building.py`) and unmaps the Arrow "
            "pages that opening a file and each training step touched (`align/data/mapped_pages.py`).",
        ]
    out = ROOT / "bench" / "results" / "data-cpu.md"
    out.write_text("\n".join(lines) + "\n")
    print(out.read_text())


if __name__ == "__main__":
    main()
