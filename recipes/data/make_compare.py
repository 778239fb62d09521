"""Rows for recipes/smollm2_compare_sft_dpo.yaml: "Which is larger, 67 or 74? Reply with only the number."

SmolLM2-135M-Instruct answers these in a sentence ("74 is a larger number than 67.") and often picks the
wrong number, above all when asked for the smaller one, so a rule scores both faults: the reply is exactly
the right number. Every unordered pair of two-digit numbers is drawn once, seeded; the held-out pairs
(test.jsonl) are never asked in training, in either order or either question.

    python recipes/data/make_compare.py [--seed 0] [--out recipes/data/compare]
"""

from __future__ import annotations

import argparse
import random
from itertools import combinations
from pathlib import Path

from align.data.corpora import write_jsonl

QUESTION = "Which is {word}, {first} or {second}? Reply with only the number."
WORDS = ("larger", "smaller")
SIZES = {"test": 200, "sft": 400, "prefs": 400}
"""Held-out prompts for the eval stage; SFT rows; preference pairs (DPO holds 5% of them out itself)."""


def question(pair: tuple[int, int], rng: random.Random) -> tuple[list[dict], int, int]:
    """A user turn asking for the larger or smaller of `pair` in a random order, its answer, the other."""
    first, second = rng.sample(pair, 2)
    word = rng.choice(WORDS)
    right = max(pair) if word == "larger" else min(pair)
    content = QUESTION.format(word=word, first=first, second=second)
    return [{"role": "user", "content": content}], right, sum(pair) - right


def reply(number: int) -> list[dict]:
    return [{"role": "assistant", "content": str(number)}]


def build(out: Path, seed: int) -> None:
    """Write test.jsonl (prompt, answer), sft.jsonl (prompt, completion) and prefs.jsonl (prompt, chosen,
    rejected: the other number) from disjoint slices of the shuffled pairs."""
    rng = random.Random(seed)
    pairs = list(combinations(range(10, 100), 2))
    rng.shuffle(pairs)
    slices, start = {}, 0
    for split, size in SIZES.items():
        slices[split], start = pairs[start : start + size], start + size
    rows: dict[str, list[dict]] = {split: [] for split in SIZES}
    for split, chosen in slices.items():
        for pair in chosen:
            prompt, right, wrong = question(pair, rng)
            if split == "test":
                rows[split].append({"prompt": prompt, "answer": str(right)})
            elif split == "sft":
                rows[split].append({"prompt": prompt, "completion": reply(right)})
            else:
                rows[split].append({"prompt": prompt, "chosen": reply(right), "rejected": reply(wrong)})
    out.mkdir(parents=True, exist_ok=True)
    for split, found in rows.items():
        write_jsonl(out / f"{split}.jsonl", found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "compare")
    args = parser.parse_args()
    build(args.out, args.seed)


if __name__ == "__main__":
    main()
