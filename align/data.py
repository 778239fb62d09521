"""Datasets for stages, in TRL's standard or conversational formats.

A ref is a builtin (`align:chatterbot/sft/train`), a .jsonl/.json/.parquet file, or a folder written
by `datasets`' `save_to_disk` (`folder@split` for a DatasetDict). `check_data` reads only a first row
or a schema, so `align validate` stays cheap; `load_data` needs no network and no `datasets` cache.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import chatterbot_corpus
import pyarrow
import pyarrow.parquet as pq
import yaml
from datasets import Dataset, load_from_disk

from align.cache import build_once, cache_root, exists, is_dir, user_path
from align.errors import DataError

BUILTIN_PREFIX = "align:"
HUB_PREFIX = "hf:"  # hf:org/name@split: a hub dataset, loaded where a hub is reachable
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
STAGE_COLUMNS: dict[str, list[tuple[str, ...]]] = {
    "sft": [("messages",), ("text",), ("prompt", "completion")],
    "dpo": [("prompt", "chosen", "rejected"), ("chosen", "rejected")],
    "reward": [("prompt", "chosen", "rejected"), ("chosen", "rejected")],
    "prompts": [("prompt",)],
}
FORMATS = (
    "give a .jsonl, .json or .parquet file, a `datasets` save_to_disk folder (folder@split for a "
    f"DatasetDict), or a builtin: {', '.join([*BUILTIN_DATA, *TOY_DATA])}"
)


def chatterbot_pairs() -> list[tuple[str, str]]:
    """Distinct (utterance, reply) pairs: each turn of each conversation with the turn that answers it.

    The corpus repeats some pairs over 100 times (tech_support.yml) and has one conversation that is a
    bare string (trivia.yml); both are dropped, leaving about 1,180 of its 2,306 pairs.
    """
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


def resolve_data(ref: str, field: str) -> Path:
    """The absolute file or folder behind `ref` (ranks may run elsewhere); builtins are built on first use."""
    try:
        return locate(ref)
    except DataError as error:
        raise DataError(f"{field}: {error}") from None


def locate(ref: str) -> Path:
    if ref.startswith(BUILTIN_PREFIX):
        file_name = builtin(ref)[0]
        family = ref[len(BUILTIN_PREFIX) :].split("/")[0]
        return build_once(cache_root() / "data" / family, BUILDERS[family]) / file_name
    path, split = user_path(ref), None
    if not exists(path) and "@" in ref:
        head, _, split = ref.rpartition("@")
        path = user_path(head)
    if not exists(path):
        raise DataError(f"{ref} does not exist; {FORMATS}")
    if is_dir(path):
        return dataset_folder(path, split, ref)
    if split is not None:
        raise DataError(f"{ref}: a @split suffix only applies to a `datasets` DatasetDict folder")
    if path.suffix not in (".jsonl", ".json", ".parquet"):
        raise DataError(f"{ref} is not a format align reads; {FORMATS}")
    return path.resolve()


def builtin(ref: str) -> tuple[str, tuple[str, ...]]:
    builtins = {**BUILTIN_DATA, **TOY_DATA}
    if ref not in builtins:
        raise DataError(f"{ref} is not a builtin dataset; the builtins are: {', '.join(builtins)}")
    return builtins[ref]


def dataset_folder(path: Path, split: str | None, ref: str) -> Path:
    """A `datasets` Dataset folder; for a DatasetDict, the folder of the split the ref names."""
    splits_file = path / "dataset_dict.json"
    if splits_file.is_file():
        try:
            splits = list(json.loads(splits_file.read_text(encoding="utf-8"))["splits"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise DataError(f"{ref}: dataset_dict.json cannot be read: {error}") from None
        if split is None:
            raise DataError(
                f"{ref} holds several splits ({', '.join(splits)}): name one, as {ref}@{splits[0]}"
            )
        if split not in splits:
            raise DataError(f"{ref} has no split {split!r}; it has: {', '.join(splits)}")
        path = path / split
    elif split is not None:
        raise DataError(f"{ref}: a @split suffix only applies to a DatasetDict folder, and {path} is not one")
    if not (path / "state.json").is_file():
        raise DataError(
            f"{ref} is a folder that `datasets` save_to_disk did not write (no state.json); {FORMATS}"
        )
    return path.resolve()


def check_data(ref: str, kind: str, field: str) -> str | None:
    """What is wrong with `ref` for a `kind` stage, or None; reads only a first row or a schema.

    `field` is taken for symmetry with `load_data` but unused: the caller puts the YAML path in front.
    """
    if ref.startswith(HUB_PREFIX):
        return None if ref[len(HUB_PREFIX) :].strip() else f"{ref}: name the dataset, as hf:org/name@split"
    try:
        columns = list(builtin(ref)[1]) if ref.startswith(BUILTIN_PREFIX) else read_columns(locate(ref), ref)
    except DataError as error:
        return str(error)
    return column_problem(ref, columns, kind)


def read_columns(path: Path, ref: str) -> list[str]:
    try:
        if is_dir(path):
            return list(json.loads((path / "dataset_info.json").read_text(encoding="utf-8"))["features"])
        if path.suffix == ".parquet":
            return pq.read_schema(path).names
        with open_text(path, ref) as file:
            first = next(json_rows(file, ref), None)
    except (OSError, ValueError, KeyError, pyarrow.ArrowException) as error:
        raise DataError(f"{ref} cannot be read: {error}") from None
    if first is None:
        raise DataError(f"{ref} has no rows")
    return list(first)


def load_data(ref: str, kind: str, field: str) -> Dataset:
    """The dataset behind `ref`, checked to have the columns a `kind` stage needs."""
    path = None if ref.startswith(HUB_PREFIX) else resolve_data(ref, field)
    try:
        dataset = hub_dataset(ref) if path is None else read_dataset(path, ref)
    except DataError as error:
        raise DataError(f"{field}: {error}") from None
    problem = column_problem(ref, dataset.column_names, kind)
    if problem is None and len(dataset) == 0:
        problem = f"{ref} has no rows"
    if problem is not None:
        raise DataError(f"{field}: {problem}")
    return dataset


def hub_dataset(ref: str) -> Dataset:
    """A hub dataset (`hf:org/name@split`, split `train` by default); its columns are checked on load."""
    from datasets import load_dataset

    name, _, split = ref[len(HUB_PREFIX) :].partition("@")
    try:
        return load_dataset(name, split=split or "train")
    except Exception as error:  # noqa: BLE001 - offline, unknown name, unknown split: all user-facing
        raise DataError(f"{ref} cannot be loaded from the hub: {error}") from None


def data_identity(ref: str, field: str) -> str:
    """What says a dataset changed: its bytes' hash, or for a hub dataset its name (hubs version it)."""
    from align.run.records import file_digest

    return ref if ref.startswith(HUB_PREFIX) else file_digest(resolve_data(ref, field))


def read_dataset(path: Path, ref: str) -> Dataset:
    try:
        if is_dir(path):
            return load_from_disk(str(path))
        if path.suffix == ".parquet":
            return Dataset(pq.read_table(path))
        with open_text(path, ref) as file:
            return Dataset.from_list(list(json_rows(file, ref)))
    except (OSError, pyarrow.ArrowException) as error:
        raise DataError(f"{ref} cannot be read: {error}") from None


def open_text(path: Path, ref: str) -> IO[str]:
    try:
        return path.open(encoding="utf-8")
    except OSError as error:
        raise DataError(f"{ref} cannot be read: {error.strerror}") from None


def json_rows(file: IO[str], ref: str) -> Iterator[dict]:
    """Rows of JSON lines, or of one JSON array; errors name the line so the user can fix it."""
    try:
        if file.read(4096).lstrip().startswith("["):
            file.seek(0)
            yield from array_rows(file, ref)
            return
        file.seek(0)
        for number, line in enumerate(file, 1):
            if line.strip():
                yield json_object(line, ref, number)
    except UnicodeDecodeError:
        raise DataError(f"{ref} is not UTF-8 text") from None


def array_rows(file: IO[str], ref: str) -> Iterator[dict]:
    try:
        rows = json.load(file)
    except json.JSONDecodeError as error:
        raise DataError(f"{ref} line {error.lineno} is not valid JSON ({error.msg})") from None
    for index, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{ref} item {index} is a JSON {type(row).__name__}; each row must be an object")
        yield row


def json_object(line: str, ref: str, number: int) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as error:
        raise DataError(
            f"{ref} line {number} is not valid JSON ({error.msg}); each line must hold one JSON object"
        ) from None
    if not isinstance(row, dict):
        raise DataError(f"{ref} line {number} is a JSON {type(row).__name__}; each line must be an object")
    return row


def column_problem(ref: str, columns: list[str], kind: str) -> str | None:
    """None if `columns` satisfy one of the column sets a `kind` stage accepts, else what is missing."""
    alternatives = STAGE_COLUMNS[kind]
    if any(set(needed) <= set(columns) for needed in alternatives):
        return None
    # the set the user most likely meant: fewest columns missing, then most present
    closest = min(
        alternatives, key=lambda needed: (len(set(needed) - set(columns)), -len(set(needed) & set(columns)))
    )
    missing = [column for column in closest if column not in columns]
    article = "an" if kind == "sft" else "a"
    return (
        f"{ref} lacks column{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))} that {article} "
        f"{kind} stage needs (it has: {', '.join(columns)}); "
        f"expected one of: {', '.join('+'.join(needed) for needed in alternatives)}"
    )
