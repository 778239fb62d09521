"""`make bench-services`: what a frozen model in a Ray actor of its own costs the PPO ranks that call it.

Two measurements on the tiny model (CPU, one rank) with a random-init one-label reward model:
- one call, median of `--calls`: the reference's per-token log-probs of a 4 x 24 token batch, and the
  reward model's scores of 4 texts, computed in this process against the same call to its actor (the
  difference is the round trip: pickling, Ray's transport, the actor's queue);
- a PPO stage of `--steps` rollouts with the reward model and the reference co-located, against both in
  actors: the record's `time_score_s` and `time_service_wait_s` per rollout, `--repeats` runs each,
  alternating, each a fresh `align run` with its own embedded Ray.
Writes bench/results/services-cpu.md. A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml
from alternate import alternating, table_rows

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
TRL = {"per_device_train_batch_size": 4, "num_mini_batches": 1, "num_ppo_epochs": 1, "learning_rate": 5e-3}
TRL |= {"max_completion_length": 8, "temperature": 1.0, "logging_steps": 1, "save_strategy": "no"}


def reward_model(folder: Path) -> Path:
    """A random-init reward model on the tiny model's trunk, fixed seed."""
    from align.models.loading import resolve_model
    from align.models.tiny import build_tiny_reward_model

    return build_tiny_reward_model(folder / "rm", Path(resolve_model("tiny")))


def pipeline(folder: Path, steps: int) -> Path:
    def ppo(actor: bool) -> dict:
        reward = {"model": str(folder / "rm"), **({"placement": "actor"} if actor else {})}
        stage = {
            "kind": "ppo",
            "data": {"train": "align:toy/number-or-word/train", "eval": "none"},
            "rewards": [reward],
            "trl": {**TRL, "max_steps": steps, "report_to": []},
        }
        return {**stage, "reference": {"placement": "actor"}} if actor else stage

    body = {
        "name": "svc",
        "base_model": "tiny",
        "defaults": {"output_root": str(folder / "runs"), "precision": "fp32", "seed": 0},
        "stages": {"colocated": ppo(False), "actors": ppo(True)},
    }
    path = folder / "svc.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def median_ms(call: Callable[[], object], calls: int) -> float:
    call()
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


def round_trips(path: Path, calls: int) -> dict[str, tuple[float, float]]:
    """{call: (ms in this process, ms through the actor)}."""
    from align.pipeline.file import load
    from align.planning.plan import build
    from align.run.inputs import resolve_inputs
    from align.run.launch import connect, disconnect
    from align.run.services import stage_services
    from align.stages.services import start_service

    plan = build(load(path)).stages["actors"]
    plan = dataclasses.replace(plan, inputs=resolve_inputs(plan, {}))
    torch.manual_seed(0)
    ids = torch.randint(3, 200, (4, 24))
    texts = (["What is 2 plus 3?"] * 4, ["five", "5", "It is five.", "seven"])
    torch.set_num_threads(1)  # as the actor runs on an embedded Ray (no CPU of its own)

    def each(held: dict) -> dict[str, Callable[[], object]]:
        return {
            "reference log-probs, 4 x 24 tokens": lambda: held["reference"].log_probs(ids, ids > 0, 16, 1.0),
            "reward model scores, 4 texts": lambda: held["rewards[0]"].score(*texts),
        }

    here = {s.role: start_service(plan, s, torch.device("cpu")) for s in plan.placement.services}
    local = {name: median_ms(call, calls) for name, call in each(here).items()}
    connect(None)
    try:
        with stage_services(plan, True, lambda _: None) as clients:
            remote = {name: median_ms(call, calls) for name, call in each(clients).items()}
    finally:
        disconnect()
    return {name: (local[name], remote[name]) for name in local}


def ppo_run(path: Path, stage: str, steps: int) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-m", "align.cli", "run", str(path), "--stage", stage, "--force", stage],
        env=ENV,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"align run failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    record = json.loads((path.parent / "runs" / "svc" / stage / "align-stage.json").read_text())
    metrics = record["metrics"]
    per_step = {key: metrics[f"time_{key}_s"] * 1000 / steps for key in ("score", "service_wait")}
    return {**per_step, "stage": record["ended"] - record["started"]}


def summary(values: list[float]) -> str:
    """Median and range: on a shared machine one slow run says more about its neighbours than about align."""
    spread = f" ({min(values):.1f}-{max(values):.1f})" if len(values) > 1 else ""
    return f"{statistics.median(values):.1f}{spread}"


def markdown(args: argparse.Namespace, calls: dict, runs: dict[str, list[dict[str, float]]]) -> str:
    lines = [
        "# A reward model and a reference in Ray actors of their own against co-located (CPU)",
        "",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at "
        "the end; tiny Llama (fp32), one rank; `make bench-services`.",
        "",
        f"One call, median of {args.calls} (ms):",
        "",
        "| call | in this process | through the actor | round trip |",
        "|---|---:|---:|---:|",
    ]
    lines += [f"| {name} | {a:.2f} | {b:.2f} | {b - a:.2f} |" for name, (a, b) in calls.items()]
    lines += [
        "",
        f"PPO, {args.steps} rollouts of 4 completions of 8 tokens, {args.repeats} runs each, alternating "
        "(median (range); ms per rollout, the stage in s):",
        "",
        "| placement | time_score_s per rollout | time_service_wait_s per rollout | stage |",
        "|---|---:|---:|---:|",
    ]
    lines += table_rows(runs, ("score", "service_wait", "stage"), summary)
    lines += [
        "",
        "`time_score_s` holds the rewards and the policy, critic and reference forwards of each rollout; "
        "`time_service_wait_s` the part of it spent waiting on the actors (two calls a rollout). The stage "
        "includes starting the actors (a fresh Ray worker importing torch and loading its model).",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="align-bench-services-") as tmp:
        reward_model(Path(tmp))
        path = pipeline(Path(tmp), args.steps)
        calls = round_trips(path, args.calls)
        variants = ["colocated", "actors"]
        runs = alternating(variants, args.repeats, lambda name: ppo_run(path, name, args.steps))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "services-cpu.md").write_text(markdown(args, calls, runs))
    print((RESULTS / "services-cpu.md").read_text())


if __name__ == "__main__":
    main()
