"""`python bench/distill_transfer.py`: what a distill stage's teacher in a Ray actor of its own would cost,
against the teacher beside the student on the rank (align's placement).

TRL's DistillationTrainer needs the teacher's whole next-token distribution at every completion token of
every rollout: co-located, it projects the teacher's last hidden states through its LM head in chunks and
never builds the logits. From an actor, something per token must cross Ray's object store to the rank:
- the logits, vocabulary-wide (what a reference actor's per-token log-prob is, times the vocabulary);
- or the teacher's last hidden states (hidden-wide), which the rank would project through a copy of the
  teacher's LM head: smaller, but the head stays on every rank.
Measured on one rollout of `--batch` prompts of `--prompt` tokens and `--completion` generated tokens, by the
builtin SmolLM2-135M (49,152-token vocabulary) in fp32 on CPU, median of `--calls`:
- on the rank: the teacher's backbone forward (what co-location costs per rollout);
- through an actor: the same forward in the actor plus the transfer of the logits, or of the hidden states;
- the transfer alone: an actor returning a tensor of that size it already holds.
Writes bench/results/distill-transfer-cpu.md (about 5 min on 2 cores). A benchmark: nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def median_s(call: Callable[[], object], calls: int) -> float:
    call()  # warm: the first call pays for allocation and the actor's start
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


class Teacher:
    """The teacher as a Ray actor would hold it: it answers with logits or last hidden states."""

    def __init__(self, folder: str, threads: int) -> None:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    @torch.no_grad()
    def hidden(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        return self.model.model(input_ids=ids).last_hidden_state[:, -keep:].contiguous()

    @torch.no_grad()
    def logits(self, ids: torch.Tensor, keep: int) -> torch.Tensor:
        return self.model.lm_head(self.hidden(ids, keep))

    def held(self, shape: tuple[int, ...]) -> torch.Tensor:
        """A tensor of `shape` made once and kept, so that returning it measures the transfer alone."""
        if getattr(self, "_held", None) is None or self._held.shape != shape:
            self._held = torch.randn(shape)
        return self._held


def measure(args: argparse.Namespace) -> dict[str, float]:
    import ray

    from align.models.loading import resolve_model

    folder = resolve_model(args.model)
    threads = max(1, (os.cpu_count() or 2) // 2)
    torch.set_num_threads(threads)
    local = Teacher(folder, threads)
    vocab, hidden = local.model.config.vocab_size, local.model.config.hidden_size
    torch.manual_seed(0)
    ids = torch.randint(3, vocab, (args.batch, args.prompt + args.completion))
    keep = args.completion
    figures = {
        "vocab": vocab,
        "hidden": hidden,
        "logits_mb": args.batch * keep * vocab * 4 / 1e6,
        "hidden_mb": args.batch * keep * hidden * 4 / 1e6,
    }
    figures["local_backbone_s"] = median_s(lambda: local.hidden(ids, keep), args.calls)
    figures["local_logits_s"] = median_s(lambda: local.logits(ids, keep), args.calls)
    local = None  # its memory back before the actor loads its own copy
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        actor = ray.remote(num_cpus=1)(Teacher).remote(folder, threads)
        figures["actor_logits_s"] = median_s(lambda: ray.get(actor.logits.remote(ids, keep)), args.calls)
        figures["actor_hidden_s"] = median_s(lambda: ray.get(actor.hidden.remote(ids, keep)), args.calls)
        for name, width in (("logits", vocab), ("hidden", hidden)):
            shape = (args.batch, keep, width)
            figures[f"transfer_{name}_s"] = median_s(
                lambda s=shape: ray.get(actor.held.remote(s)), args.calls
            )
    finally:
        ray.shutdown()
    return figures


def markdown(args: argparse.Namespace, f: dict[str, float]) -> str:
    rollout = f"{args.batch} x ({args.prompt} + {args.completion}) tokens"
    return "\n".join(
        [
            "# A distill stage's teacher in a Ray actor against co-located (CPU)",
            "",
            f"Machine: {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
            f"at the end; teacher {args.model} (vocabulary {f['vocab']:,}, hidden {f['hidden']}), fp32; one "
            f"rollout of {rollout}; median of {args.calls} calls; `python bench/distill_transfer.py`.",
            "",
            "| per rollout | MB to the rank | seconds |",
            "|---|---|---|",
            f"| co-located: teacher backbone forward (TRL projects it in chunks) | 0 | "
            f"{f['local_backbone_s']:.3f} |",
            f"| co-located: forward with full logits | 0 | {f['local_logits_s']:.3f} |",
            f"| actor: forward + logits back | {f['logits_mb']:.0f} | {f['actor_logits_s']:.3f} |",
            f"| actor: forward + last hidden states back | {f['hidden_mb']:.1f} | "
            f"{f['actor_hidden_s']:.3f} |",
            f"| actor: logits transfer alone | {f['logits_mb']:.0f} | {f['transfer_logits_s']:.3f} |",
            f"| actor: hidden-state transfer alone | {f['hidden_mb']:.1f} | {f['transfer_hidden_s']:.3f} |",
            "",
            f"The logits cost {f['logits_mb']:.0f} MB and {f['transfer_logits_s']:.2f} s per rollout to "
            f"move alone, {f['logits_mb'] / f['hidden_mb']:.0f}x the hidden states. On this CPU the "
            "teacher's forward is slower still; on a GPU it takes milliseconds, and the move through host "
            "memory would be most of the rollout. align refuses `teacher: {placement: actor}` at validate "
            "with this figure (align/pipeline/teacher_checks.py): a teacher too big for one rank is sharded "
            "under fsdp. An actor that sends hidden states, projected on the rank through a copy of the "
            "teacher's LM head, is the form that would pay.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--completion", type=int, default=256)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args()
    figures = measure(args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    text = markdown(args, figures)
    (RESULTS / "distill-transfer-cpu.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
