"""Prompts for recipes/smollm2_addition_grpo.yaml: "What is 13 + 28? Reply with only the number.", with the
sum as the row's `answer`, which the shipped `final_number` reward compares with a completion's last number.

The numbers run from 1 to 49, where the base model is right about a third of the time: sampled, its
answers to one prompt differ, so GRPO's groups have rewards to compare. Every unordered pair is drawn at
most once, seeded; the held-out pairs (test.jsonl) are never asked in training, in either order.

    python recipes/data/make_addition.py [--seed 0] [--out recipes/data/addition]
"""

from __future__ import annotations

import argparse
import random
import re
from itertools import combinations_with_replacement
from pathlib import Path

from align.data.corpora import write_jsonl

QUESTION = "What is {first} + {second}? Reply with only the number."
NUMBERS = range(1, 50)
HELD_OUT = 200
"""Held-out prompts for the eval stage; the other 1,025 pairs are the training prompts (the GRPO stage
holds a few of them out itself)."""


def row(pair: tuple[int, int], rng: random.Random) -> dict:
    first, second = rng.sample(pair, 2)
    content = QUESTION.format(first=first, second=second)
    return {"prompt": [{"role": "user", "content": content}], "answer": str(first + second)}


def question(row: dict) -> tuple[int, ...]:
    """What a held-out prompt must not share with a training one: its numbers, in either order."""
    return tuple(sorted(int(n) for n in re.findall(r"\d+", row["prompt"][-1]["content"])))


def build(out: Path, seed: int) -> None:
    """Write test.jsonl and train.jsonl (prompt, answer) from disjoint slices of the shuffled pairs."""
    rng = random.Random(seed)
    pairs = list(combinations_with_replacement(NUMBERS, 2))
    rng.shuffle(pairs)
    out.mkdir(parents=True, exist_ok=True)
    for split, chosen in (("test", pairs[:HELD_OUT]), ("train", pairs[HELD_OUT:])):
        write_jsonl(out / f"{split}.jsonl", [row(pair, rng) for pair in chosen])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "addition")
    args = parser.parse_args()
    build(args.out, args.seed)


if __name__ == "__main__":
    main()
