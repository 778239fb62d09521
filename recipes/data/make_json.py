"""Rows for recipes/smollm2_json_sft_dpo.yaml: a sentence about a person, and "Reply with only a JSON object
with the keys "name" and "age"." The answer is one line, `{"name": "Lena", "age": 63}`.

SmolLM2-135M-Instruct wraps its JSON in a ```json fence and explains it after, and often takes the other
number in the sentence for the age ("Ivan is 66 years old and reads 10 books a month" -> 10), or another
name. The sentences are drawn from templates, people, places and a second number, seeded; the people of
the held-out prompts (test.jsonl) never appear in training.

    python recipes/data/make_json.py [--seed 0] [--out recipes/data/json]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

from align.data.corpora import write_jsonl

NAMES = (
    "Maria Tom Aisha Lucas Mei Omar Sofia Ivan Lena Kofi Priya Diego Hana Noah Zara Felix Amara Jonas Yuki "
    "Rosa Elif Mateo Nadia Arjun Chloe Tariq Ines Viktor Leila Bruno Anya Samuel Freya Hugo Imani Ravi Clara "
    "Emil Ayla Marco Sana Pablo Greta Kenji Lucia Dario Mira Oscar Tala Henrik Nora Luis Esme Kwame Vera "
    "Theo Alma Rafael Ida Farid Julia Anton Selma Jamal Elsa Pedro Ruth Milan Dina Andre Lotte Nikos Alba "
    "Sven Maya Karim"
).split()
HELD_OUT_NAMES = 20  # the people of the held-out prompts
PLACES = "Lisbon Oslo Cairo Lima Osaka Accra Dublin Quito Hanoi Tunis Porto Riga Perth Graz Nairobi".split()
OTHERS = (
    "reads {k} books a month",
    "lives at number {k}",
    "walks {k} minutes to work",
    "has {k} plants",
    "works {k} hours a week",
)
"""The second number of a sentence: as large as an age can be, so only the words say which is which."""
SENTENCES = (
    "{name} is {age} years old and {other}.",
    "{name}, aged {age}, {other} in {place}.",
    "{name} {other} and turned {age} last year.",
    "In {place}, {name} ({age}) {other}.",
    "At {age}, {name} {other} in {place}.",
)
ASK = 'Reply with only a JSON object with the keys "name" and "age".'
SIZES = {"test": 200, "sft": 400, "prefs": 400}
"""Held-out prompts for the eval stage; SFT rows; preference pairs (DPO holds 5% of them out itself)."""


def person(names: list[str], rng: random.Random) -> tuple[list[dict], str, int, int]:
    """A user turn about someone, and (their name, age, the sentence's other number)."""
    name, age, other = rng.choice(names), rng.randint(18, 90), rng.randint(5, 90)
    while other == age:
        other = rng.randint(5, 90)
    sentence = rng.choice(SENTENCES).format(
        name=name, age=age, place=rng.choice(PLACES), other=rng.choice(OTHERS).format(k=other)
    )
    return [{"role": "user", "content": f'"{sentence}" {ASK}'}], name, age, other


def answer(name: str, age: int) -> str:
    return json.dumps({"name": name, "age": age})


def rejected(name: str, age: int, other: int, names: list[str], rng: random.Random) -> str:
    """One of the faults the base and SFT models make: another person's name, the sentence's other number
    as the age, or the right object in a fence with prose after it."""
    fault = rng.random()
    if fault < 0.4:
        return answer(rng.choice([someone for someone in names if someone != name]), age)
    if fault < 0.8:
        return answer(name, other)
    fenced = json.dumps({"name": name, "age": age}, indent=2)
    return f"```json\n{fenced}\n```\n\nThis JSON object holds the name and the age."


def reply(text: str) -> list[dict]:
    return [{"role": "assistant", "content": text}]


def row(split: str, names: list[str], rng: random.Random) -> dict:
    prompt, name, age, other = person(names, rng)
    if split == "test":
        return {"prompt": prompt, "answer": answer(name, age)}
    if split == "sft":
        return {"prompt": prompt, "completion": reply(answer(name, age))}
    worse = rejected(name, age, other, names, rng)
    return {"prompt": prompt, "chosen": reply(answer(name, age)), "rejected": reply(worse)}


def question(row: dict) -> str:
    """What a held-out prompt must not share with a training one: the person it is about."""
    return next(name for name in NAMES if re.search(rf"\b{name}\b", row["prompt"][-1]["content"]))


def build(out: Path, seed: int) -> None:
    """Write test.jsonl (prompt, answer), sft.jsonl (prompt, completion) and prefs.jsonl (prompt, chosen,
    rejected), the held-out people's rows apart from the others'."""
    rng = random.Random(seed)
    names = list(NAMES)
    rng.shuffle(names)
    people = {"test": names[:HELD_OUT_NAMES], "sft": names[HELD_OUT_NAMES:], "prefs": names[HELD_OUT_NAMES:]}
    out.mkdir(parents=True, exist_ok=True)
    for split, size in SIZES.items():
        write_jsonl(out / f"{split}.jsonl", [row(split, people[split], rng) for _ in range(size)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "json")
    args = parser.parse_args()
    build(args.out, args.seed)


if __name__ == "__main__":
    main()
