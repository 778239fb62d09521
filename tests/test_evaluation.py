"""Held-out scoring reads a row as TRL trains on it: chat-formatted when conversational, plain text
(prompt + reply + eos) in TRL's standard format. Scoring standard rows through the chat template measured
text the policy was never trained on, and showed DPO and KTO margins falling while they rose."""

from __future__ import annotations

import torch

from align.measures.heldout import completion_logprob, preference_scores, training_text
from align.models.loading import load_causal_lm, load_tokenizer, resolve_model
from align.stages.context import explicit_prompt


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


@torch.no_grad()
def test_implicit_prompt_pairs_are_split_as_trl_splits_them_and_score_like_explicit_ones() -> None:
    """`chosen`/`rejected` holding the prompt (TRL's implicit-prompt format), as conversations and as text:
    once split, scoring matches the explicit row; unsplit, scoring crashed on an empty conversation."""
    from datasets import Dataset

    folder = resolve_model("tiny")
    tokenizer, model = load_tokenizer(folder), load_causal_lm(folder).eval()
    user = [{"role": "user", "content": "Are you sad?"}]
    chosen, rejected = (
        [{"role": "assistant", "content": "No, happy."}],
        [{"role": "assistant", "content": "Go."}],
    )
    explicit = {"prompt": user, "chosen": chosen, "rejected": rejected}
    conversational = {"chosen": user + chosen, "rejected": user + rejected}
    text = {"chosen": "Are you sad? No, happy.", "rejected": "Are you sad? Go."}
    [split] = explicit_prompt(Dataset.from_list([conversational]))
    assert split == explicit
    assert preference_scores(model, tokenizer, [split]) == preference_scores(model, tokenizer, [explicit])
    [split_text] = explicit_prompt(Dataset.from_list([text]))
    assert split_text["prompt"] + split_text["chosen"] == text["chosen"] and split_text["prompt"].startswith(
        "Are"
    )
    assert explicit_prompt(Dataset.from_list([explicit]))[0] == explicit  # explicit rows stay as they are


@torch.no_grad()
def test_batched_scoring_equals_scoring_one_row_at_a_time() -> None:
    """Rows of different lengths share a right-padded forward; the padding changes no row's score."""
    from align.measures.heldout import completion_logprobs

    folder = resolve_model("tiny")
    tokenizer, model = load_tokenizer(folder), load_causal_lm(folder).eval()
    pairs = [
        ("Hi ", "Hello!"),
        ("What colour is the sky on a clear day? ", "Blue, mostly."),
        (
            [{"role": "user", "content": "Are you sad?"}],
            [{"role": "assistant", "content": "No, I am happy."}],
        ),
    ]
    one_by_one = [completion_logprob(model, tokenizer, prompt, reply, 64) for prompt, reply in pairs]
    batched = completion_logprobs(model, tokenizer, pairs, 64, batch_size=3)
    torch.testing.assert_close(torch.tensor(batched), torch.tensor(one_by_one), rtol=1e-5, atol=1e-4)


def test_dpo_implicit_rewards_tie_at_the_start_and_follow_the_policy_after() -> None:
    """One pass of the policy per phase serves DPO's implicit reward: before training the policy is the
    reference (every pair ties, counted half); after, beta x the move of each reply's log-prob."""
    from align.measures.heldout import PairLogprobs
    from align.stages.dpo import implicit_rewards

    start = PairLogprobs(chosen=[-4.0, -6.0], rejected=[-5.0, -3.0])
    assert implicit_rewards(start, start, beta=0.1) == {
        "dpo_reward_chosen": 0.0,
        "dpo_reward_rejected": 0.0,
        "dpo_reward_margin": 0.0,
        "dpo_reward_accuracy": 0.5,
        "dpo_reward_ties": 1.0,
    }
    trained = PairLogprobs(chosen=[-2.0, -6.0], rejected=[-7.0, -1.0])  # apart; the wrong way
    found = implicit_rewards(trained, start, beta=0.1)
    assert abs(found["dpo_reward_chosen"] - 0.1) < 1e-9
    assert abs(found["dpo_reward_rejected"] - (0.1 * (-2.0) + 0.1 * 2.0) / 2) < 1e-9
    assert abs(found["dpo_reward_margin"] - ((0.2 + 0.2) + (0.0 - 0.2)) / 2) < 1e-9
    assert found["dpo_reward_accuracy"] == 0.5 and "dpo_reward_ties" not in found
    assert trained.scores() == {"preference_accuracy": 0.5, "preference_margin": ((-2 + 7) + (-6 + 1)) / 2}
