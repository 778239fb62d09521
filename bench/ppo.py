"""`make bench` (PPO part): time per PPO step under each backend on 2 ranks, as ratios in the same run, and
how PPO's, GRPO's and RLOO's train loops divide between generating, scoring and updating.

An ordinary pipeline file (`runs/bench/bench-ppo.yaml`) with four PPO stages on the ~60M-parameter
benchmark Llama (`bench/memory.py` builds it), run by `align run`: full parameters under ddp and fsdp,
LoRA (critic on its own adapter) under ddp and zero2 with CPU optimizer offload. Each stage records
`seconds_per_step` (the Trainer's train runtime over its optimizer steps: rollout, scoring and update,
no model loading), its first and last logged reward and KL, and the share of trainable parameters that
changed. GRPO and RLOO stages (ddp, full parameters, 4 completions per prompt) on the same prompts and
rewards record the same time split. Results: `bench/results/ppo-{cpu,gpu}.{md,json}`. Nothing asserts.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from memory import RESULTS, ROOT, RUNS, WORKERS, bench_model

PIPELINE = "bench-ppo"
STAGES = {
    "ddp_full": {"backend": "ddp"},
    "fsdp_full": {"backend": "fsdp"},
    "ddp_lora": {"backend": "ddp", "lora": {"r": 16}, "value": "adapter"},
    "zero2_offload_lora": {
        "backend": "zero2",
        "lora": {"r": 16},
        "value": "adapter",
        "zero2": {"offload_optimizer": "cpu"},
    },
}
# GRPO and RLOO (TRL's trainers) on the same prompts and rewards, for how their train loop divides
GROUP_STAGES = {
    "ddp_grpo": {"kind": "grpo", "backend": "ddp"},
    "ddp_rloo": {"kind": "rloo", "backend": "ddp"},
}
BASELINES = {"fsdp_full": "ddp_full", "zero2_offload_lora": "ddp_lora"}
STEPS = 8


def pipeline_body(model_dir: Path) -> dict[str, Any]:
    trl = {
        "max_steps": STEPS,
        "learning_rate": 1e-5,
        "per_device_train_batch_size": 4,
        "num_mini_batches": 2,
        "num_ppo_epochs": 1,
        "max_completion_length": 16,
        "temperature": 1.0,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": [],
    }
    toy = "align:toy/number-or-word"
    data = {"train": f"{toy}/train", "eval": f"{toy}/test", "max_eval_rows": 8}
    rewards = [{"function": "length", "args": {"target": 3}}, {"function": "format"}]
    group_trl = {key: trl[key] for key in trl if key not in ("num_mini_batches", "num_ppo_epochs")}
    group_trl |= {"per_device_train_batch_size": 8, "num_generations": 4, "beta": 0.04}
    stages = {
        name: {"kind": "ppo", "data": data, "rewards": rewards, "trl": trl, **settings}
        for name, settings in STAGES.items()
    }
    stages |= {
        name: {"data": data, "rewards": rewards, "trl": group_trl, **settings}
        for name, settings in GROUP_STAGES.items()
    }
    defaults = {"output_root": str(RUNS), "workers": WORKERS, "precision": "auto", "seed": 0}
    return {"name": PIPELINE, "base_model": str(model_dir), "defaults": defaults, "stages": stages}


def stage_metrics(name: str) -> dict[str, Any]:
    record = json.loads((RUNS / PIPELINE / name / "align-stage.json").read_text())
    keys = ("seconds_per_step", "train_reward_first", "train_reward_last", "train_kl_first", "train_kl_last")
    split = ("time_generate_s", "time_score_s", "time_update_s")
    found = {key: record["metrics"].get(key) for key in (*keys, *split, "trainable_changed")}
    return {"status": record["status"], **found}


def markdown(results: dict[str, dict[str, Any]], device: str) -> str:
    lines = [
        f"# PPO step time per backend ({device}, {WORKERS} ranks, 59.7M-parameter Llama, {STEPS} steps)",
        "",
        "Seconds per optimizer step (rollout of 8 prompts x 16 tokens per rank, scoring, update),",
        "the ratio to the ddp stage of the same kind in the same run, and how the train loop divides.",
        "",
        "| stage | s/step | vs baseline | generate / score / update | reward first -> last "
        "| KL first -> last | trainable changed |",
        "|---|---:|---:|---|---|---|---:|",
    ]
    for name, found in results.items():
        base = BASELINES.get(name)
        step = found["seconds_per_step"]
        ratio = f"{step / results[base]['seconds_per_step']:.2f}x {base}" if base else "1.00x"
        reward, kl = ends(found, "reward"), ends(found, "kl")
        changed = found["trainable_changed"]
        lines.append(
            f"| {name} | {step:.3f} | {ratio} | {time_split(found)} | {reward} | {kl} | {changed:.2f} |"
        )
    return "\n".join(lines) + "\n"


def ends(found: dict[str, Any], curve: str) -> str:
    first, last = found.get(f"train_{curve}_first"), found.get(f"train_{curve}_last")
    return "-" if first is None or last is None else f"{first:.3f} -> {last:.3f}"


def time_split(found: dict[str, Any]) -> str:
    """The share of the train loop spent generating rollouts, scoring them and updating."""
    seconds = [found.get(f"time_{phase}_s") for phase in ("generate", "score", "update")]
    if None in seconds:
        return "-"
    return " / ".join(f"{100 * part / sum(seconds):.0f}%" for part in seconds)


def main() -> int:
    import torch

    model_dir = bench_model()
    RUNS.mkdir(parents=True, exist_ok=True)
    path = RUNS / f"{PIPELINE}.yaml"
    path.write_text(yaml.safe_dump(pipeline_body(model_dir), sort_keys=False))
    shutil.rmtree(RUNS / PIPELINE, ignore_errors=True)  # every stage runs afresh
    done = subprocess.run([sys.executable, "-m", "align.cli", "run", str(path)], cwd=ROOT)
    if done.returncode != 0:
        return done.returncode
    results = {name: stage_metrics(name) for name in (*STAGES, *GROUP_STAGES)}
    device = "gpu" if torch.cuda.device_count() >= WORKERS else "cpu"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"ppo-{device}.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / f"ppo-{device}.md").write_text(markdown(results, device))
    print(markdown(results, device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
