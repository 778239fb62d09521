"""The held-out samples a stage records: which prompts, how they are shown, and that batching them (left
padding) gives each prompt the greedy completion it gets alone."""

from __future__ import annotations

import pytest
from datasets import Dataset

from align.stages.samples import greedy_completions, paired, sample_prompts, shown


def test_the_first_four_distinct_prompts_are_sampled() -> None:
    rows = Dataset.from_list([{"prompt": p, "chosen": "a", "rejected": "b"} for p in "aabcbdef"])
    assert sample_prompts(rows) == ["a", "b", "c", "d"]
    assert sample_prompts(rows.select(range(3))) == ["a", "b"]


def test_a_conversation_is_prompted_with_the_turns_before_its_last_reply_and_a_text_with_its_first_half():
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    assert sample_prompts(Dataset.from_list([{"messages": turns}])) == [turns[:1]]
    assert sample_prompts(Dataset.from_list([{"text": "one two three four five"}])) == ["one two"]
    assert shown(turns) == "user: Hi\nassistant: Hello!"
    assert paired(["p"], ["b"], ["a"]) == [{"prompt": "p", "before": "b", "after": "a"}]


@pytest.mark.integration
def test_batched_greedy_completions_equal_each_prompt_alone_and_leave_the_mode_alone() -> None:
    from align.models.loading import load_causal_lm, load_tokenizer, resolve_model

    tiny = resolve_model("tiny")
    model, tokenizer = load_causal_lm(tiny).train(), load_tokenizer(tiny)
    prompts = [[{"role": "user", "content": text}] for text in ("Hi", "Tell me a long story please", "Why?")]
    batched = greedy_completions(model, tokenizer, prompts, max_new_tokens=8)
    alone = [greedy_completions(model, tokenizer, [prompt], max_new_tokens=8)[0] for prompt in prompts]
    assert batched == alone and all(batched)
    assert model.training
    assert greedy_completions(model, tokenizer, []) == []
