"""`align chat` answers as the eval stage does: both ask with exactly their own generation settings, never
with what a checkpoint's generation_config.json would fill in (a hub model's repetition_penalty, say)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from align.config.eval_settings import GenerationSpec
from align.models.loading import load_tokenizer, resolve_model
from align.report.chat import ChatTarget, load_chat_model, reply
from align.stages.eval_answers import answers

MESSAGES = [{"role": "user", "content": "Number or word? cheese"}]
TOKENS = 12


def test_chat_answers_as_the_eval_stage_despite_the_checkpoints_generation_config(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(resolve_model("tiny"), folder)
    config = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**config, "no_repeat_ngram_size": 1}))
    model, tokenizer = load_chat_model(ChatTarget(str(folder), (), str(folder), "the tiny model"))
    chatted = "".join(reply(model, tokenizer, MESSAGES, TOKENS, 0.0))

    left = load_tokenizer(str(folder))
    left.padding_side = "left"
    asked = answers(model, left, [MESSAGES], GenerationSpec(max_new_tokens=TOKENS), 0)
    assert chatted == asked[0]

    model.generation_config.no_repeat_ngram_size = 1  # what the checkpoint asked for changes the answer
    assert "".join(reply(model, tokenizer, MESSAGES, TOKENS, 0.0)) != chatted
