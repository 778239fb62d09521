"""The end of `make demo`: the held-out "Number or word?" items answered by the base model, the SFT model
and the DPO-merged model, each loaded with plain `transformers` (proof the outputs are usable), greedy.

Prints a few items side by side, then, over all 64 held-out items, how often each model gave the right
word and how often its reply was exactly right (`number.` / `word.`, the period being what DPO taught).
"""

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging

from align.data.corpora import builtin_path
from align.models.loading import resolve_model

HELD_OUT = "align:toy/number-or-word/test"
SHOWN = 6


def answers(model_dir: str, prompts: list[list[dict]]) -> list[str]:
    """Greedy replies, batched with left padding so every prompt ends where generation starts."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    texts = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in prompts]
    batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        output = model.generate(
            **batch, max_new_tokens=6, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    new = output[:, batch["input_ids"].shape[1] :]
    return [reply.strip() for reply in tokenizer.batch_decode(new, skip_special_tokens=True)]


def shown(reply: str) -> str:
    """A reply quoted (so a trailing period or space shows), cut to fit its column."""
    return repr(reply[:18]) if reply else "(nothing)"


def share(hits: list[bool]) -> str:
    return f"{sum(hits)}/{len(hits)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("run_folder", type=Path, help="the demo's run folder, e.g. runs/number-or-word")
    args = parser.parse_args()
    logging.disable_progress_bar()  # three tiny models: no loading bars between the answers
    rows = [json.loads(line) for line in builtin_path(HELD_OUT).read_text().splitlines()]
    prompts, truth = [row["prompt"] for row in rows], [row["answer"] for row in rows]
    models = {
        "base (random init)": resolve_model("tiny"),
        "after SFT": str(args.run_folder / "sft" / "model"),
        "after DPO, merged": str(args.run_folder / "merge" / "model"),
    }
    replies = {name: answers(folder, prompts) for name, folder in models.items()}
    items = [prompt[-1]["content"] for prompt in prompts]
    width = max(len(item) for item in items[:SHOWN]) + 2
    print(f"\nheld-out items the models never trained on ({SHOWN} of {len(rows)}):")
    print(f"  {'question':<{width}}" + "".join(f"{name:<22}" for name in models))
    for index in range(SHOWN):
        cells = "".join(f"{shown(replies[name][index]):<22}" for name in models)
        print(f"  {items[index]:<{width}}{cells}")
    print(f"\nover all {len(rows)} held-out items:")
    for name in models:
        said = replies[name]
        right_word = [reply.rstrip(".") == answer for reply, answer in zip(said, truth, strict=True)]
        exact = [reply == f"{answer}." for reply, answer in zip(said, truth, strict=True)]
        print(f"  {name:<20} right word {share(right_word):>6}   right word and period {share(exact):>6}")


if __name__ == "__main__":
    main()
