"""The builtin datasets (`align:...` refs): chatterbot conversations and preference pairs, and a toy
verifiable task for the RL stages, each built once into the cache from packages on disk (no hub)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import yaml

from align.cache import build_once, cache_root
from align.errors import DataError

BUILTIN_PREFIX = "align:"
SFT, PREFS, PROMPTS = ("messages",), ("prompt", "chosen", "rejected"), ("prompt", "answer")
BUILTIN_DATA: dict[str, tuple[str, tuple[str, ...]]] = {  # ref -> (file in the cache folder, its columns)
    "align:chatterbot/sft/train": ("sft-train.jsonl", SFT),
    "align:chatterbot/sft/test": ("sft-test.jsonl", SFT),
    "align:chatterbot/prefs/train": ("prefs-train.jsonl", PREFS),
    "align:chatterbot/prefs/test": ("prefs-test.jsonl", PREFS),
}
TOY_DATA: dict[str, tuple[str, tuple[str, ...]]] = {  # a verifiable task for the RL stages
    "align:toy/number-or-word/sft": ("number-or-word-sft.jsonl", SFT),
    "align:toy/number-or-word/train": ("number-or-word-train.jsonl", PROMPTS),
    "align:toy/number-or-word/test": ("number-or-word-test.jsonl", PROMPTS),
    "align:toy/number-or-word/prefs/train": ("number-or-word-prefs-train.jsonl", PREFS),
    "align:toy/number-or-word/prefs/test": ("number-or-word-prefs-test.jsonl", PREFS),
}


def chatterbot_pairs() -> list[tuple[str, str]]:
    """Distinct (utterance, reply) pairs: each turn of each conversation with the turn that answers it.

    The corpus repeats some pairs over 100 times (tech_support.yml) and has one conversation that is a
    bare string (trivia.yml); both are dropped, leaving about 1,180 of its 2,306 pairs.
    """
    import chatterbot_corpus

    corpus = Path(chatterbot_corpus.__file__).parent / "data" / "english"
    pairs: list[tuple[str, str]] = []
    for path in sorted(corpus.glob("*.yml")):
        for conversation in yaml.safe_load(path.read_text(encoding="utf-8"))["conversations"]:
            if not isinstance(conversation, list):
                continue
            turns = [str(turn).strip() for turn in conversation]
            pairs += [(said, reply) for said, reply in zip(turns, turns[1:], strict=False) if said and reply]
    return list(dict.fromkeys(pairs))


def build_chatterbot(out_dir: Path, *, seed: int = 0, test_fraction: float = 0.1) -> None:
    """Write SFT and preference splits as jsonl; the test split holds out whole prompts."""
    replies: dict[str, list[str]] = {}
    for prompt, reply in chatterbot_pairs():
        replies.setdefault(prompt, []).append(reply)
    prompts = list(replies)
    rng = random.Random(seed)
    rng.shuffle(prompts)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_test = max(1, round(len(prompts) * test_fraction))
    for split, split_prompts in (("train", prompts[n_test:]), ("test", prompts[:n_test])):
        split_replies = {prompt: replies[prompt] for prompt in split_prompts}
        write_jsonl(out_dir / f"sft-{split}.jsonl", sft_rows(split_replies))
        write_jsonl(out_dir / f"prefs-{split}.jsonl", preference_rows(split_replies, rng))


def sft_rows(replies: dict[str, list[str]]) -> list[dict]:
    return [
        {"messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]}
        for prompt, answers in replies.items()
        for reply in answers
    ]


NON_ANSWERS = (
    "I don't know.",
    "Whatever.",
    "No comment.",
    "Ask someone else.",
    "I can't help with that.",
    "Not sure.",
)


def preference_rows(replies: dict[str, list[str]], rng: random.Random) -> list[dict]:
    """Chosen is the real reply; rejected a dismissive non-answer.

    "A real answer beats a brush-off" is a preference a tiny model can learn and carry to held-out
    prompts (the brush-offs are shared), so held-out accuracy measures what DPO taught. Rejecting a
    reply to another prompt would test relevance, which a 0.2M-parameter model cannot learn.
    """
    rows = []
    for prompt, answers in replies.items():
        for reply in answers:
            if reply in NON_ANSWERS:
                continue
            rows.append(
                {
                    "prompt": [{"role": "user", "content": prompt}],
                    "chosen": [{"role": "assistant", "content": reply}],
                    "rejected": [{"role": "assistant", "content": rng.choice(NON_ANSWERS)}],
                }
            )
    return rows


def build_toy(out_dir: Path, *, seed: int = 0, test_size: int = 64, period_share: float = 0.3) -> None:
    """`Number or word? X` -> `number` or `word`, split by item; the SFT rows are the train items.

    A random-init tiny model learns it in a minute of SFT (digits are their own tokens), so RL starts
    from a policy that earns rewards. Only `period_share` of the SFT replies end with a period: a
    format reward that asks for one leaves RL something to teach.
    """
    rng = random.Random(seed)
    words = sorted({w for pair in chatterbot_pairs() for w in re.findall(r"\b[a-z]{3,8}\b", " ".join(pair))})
    items = [(w, "word") for w in rng.sample(words, 500)] + [
        (str(n), "number") for n in rng.sample(range(1000), 500)
    ]
    rng.shuffle(items)
    train, test = items[test_size:], items[:test_size]
    out_dir.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("test", test)):
        write_jsonl(
            out_dir / f"number-or-word-{split}.jsonl", [{"prompt": toy(x), "answer": a} for x, a in rows]
        )
        write_jsonl(out_dir / f"number-or-word-prefs-{split}.jsonl", [toy_pair(x, a, rng) for x, a in rows])
    sft = [
        toy(x) + [{"role": "assistant", "content": a + "." * (rng.random() < period_share)}] for x, a in train
    ]
    write_jsonl(out_dir / "number-or-word-sft.jsonl", [{"messages": messages} for messages in sft])


def toy_pair(item: str, answer: str, rng: random.Random) -> dict:
    """A preference pair that encodes both rules: the right answer ending with a period is chosen over a
    wrong answer, a missing period, or both, so a reward model trained on it scores what the rules do."""
    wrong = "word" if answer == "number" else "number"
    rejected = rng.choice([f"{wrong}.", answer, wrong])
    return {
        "prompt": toy(item),
        "chosen": [{"role": "assistant", "content": f"{answer}."}],
        "rejected": [{"role": "assistant", "content": rejected}],
    }


def toy(item: str) -> list[dict]:
    return [{"role": "user", "content": f"Number or word? {item}"}]


BUILDERS = {"chatterbot": build_chatterbot, "toy": build_toy}  # builtin family -> its cache folder's builder


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")


def builtin(ref: str) -> tuple[str, tuple[str, ...]]:
    """(file in its family's cache folder, columns) of a builtin ref."""
    builtins = {**BUILTIN_DATA, **TOY_DATA}
    if ref not in builtins:
        raise DataError(f"{ref} is not a builtin dataset; the builtins are: {', '.join(builtins)}")
    return builtins[ref]


def builtin_path(ref: str) -> Path:
    """The file behind a builtin ref, built on first use."""
    file_name = builtin(ref)[0]
    family = ref[len(BUILTIN_PREFIX) :].split("/")[0]
    return build_once(cache_root() / "data" / family, BUILDERS[family]) / file_name
