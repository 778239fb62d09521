"""Held-out scoring reads a row as TRL trains on it: chat-formatted when conversational, plain text
(prompt + reply + eos) in TRL's standard format. Scoring standard rows through the chat template measured
text the policy was never trained on, and showed DPO and KTO margins falling while they rose."""

from __future__ import annotations

import torch

from align.evaluation import completion_logprob, training_text
from align.models import load_causal_lm, load_tokenizer, resolve_model


def test_standard_rows_are_plain_text_and_conversational_rows_use_the_chat_template() -> None:
    tokenizer = load_tokenizer(resolve_model("tiny"))
    assert training_text(tokenizer, "Hi ", "Hello!") == "Hi Hello!" + tokenizer.eos_token
    turns = [{"role": "user", "content": "Hi"}], [{"role": "assistant", "content": "Hello!"}]
    assert training_text(tokenizer, *turns) == tokenizer.apply_chat_template(
        turns[0] + turns[1], tokenize=False
    )


@torch.no_grad()
def test_a_standard_reply_is_scored_on_the_tokens_that_follow_its_plain_prompt() -> None:
    folder = resolve_model("tiny")
    tokenizer, model = load_tokenizer(folder), load_causal_lm(folder).eval()
    prompt, reply = "What colour is the sky? ", "Blue."
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = torch.tensor(
        [tokenizer(prompt + reply + tokenizer.eos_token, add_special_tokens=False)["input_ids"]]
    )
    logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
    expected = logprobs.gather(-1, ids[0, 1:, None])[len(prompt_ids) - 1 :].sum()

    assert completion_logprob(model, tokenizer, prompt, reply, max_length=64) == float(expected)
    chat = completion_logprob(
        model, tokenizer, [{"role": "user", "content": prompt}], [{"role": "assistant", "content": reply}], 64
    )
    assert chat != float(expected)  # a different text: the case the old scoring got wrong
