"""Unit tests of align's PPO parts against independent expectations: the token math (GAE, rewards, clipped
losses, whitening, adaptive KL), stop-token cutting, the LoRA adapter switch and policy-plus-critic module
on the tiny builtin model, the rollout sampler and PPOConfig's checks. 2-rank runs: tests/test_ppo.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from align.models.loading import load_causal_lm, load_tokenizer, resolve_model
from align.trainers.policy_value import (
    PolicyAndValue,
    add_value_adapter,
    causal_logits,
    lora_layers,
    position_ids,
)
from align.trainers.ppo import RolloutSampler
from align.trainers.ppo_config import PPOConfig
from align.trainers.ppo_math import (
    adaptive_kl_coef,
    generalized_advantages,
    last_token_index,
    masked_mean,
    masked_whiten,
    per_token_rewards,
    ppo_losses,
    token_log_probs,
)
from align.trainers.sampling import Completions, cut_at_stop, decode, generate


def ragged_mask(lengths: list[int], width: int) -> torch.Tensor:
    return (torch.arange(width) < torch.tensor(lengths).unsqueeze(1)).double()


def reference_gae(rewards: list[float], values: list[float], gamma: float, lam: float) -> list[float]:
    """GAE over one episode's real tokens, written out step by step."""
    advantages, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(rewards) else 0.0
        running = rewards[t] + gamma * next_value - values[t] + gamma * lam * running
        advantages[t] = running
    return advantages


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 0.95), (0.9, 0.8), (1.0, 1.0)])
def test_gae_matches_a_per_episode_loop_and_ignores_padding(gamma: float, lam: float) -> None:
    torch.manual_seed(0)
    lengths, width = [7, 1, 4, 3], 7
    mask = ragged_mask(lengths, width)  # rewards and values past it are garbage that must not leak
    rewards, values = torch.randn(4, width, dtype=torch.float64), torch.randn(4, width, dtype=torch.float64)
    advantages, returns = generalized_advantages(rewards, values, mask, gamma, lam)
    for row, length in enumerate(lengths):
        expected = reference_gae(rewards[row, :length].tolist(), values[row, :length].tolist(), gamma, lam)
        assert_close(advantages[row, :length], torch.tensor(expected, dtype=torch.float64))
    assert_close(returns, (advantages + values) * mask)
    assert (advantages[mask == 0] == 0).all() and (returns[mask == 0] == 0).all()


def test_gae_without_discount_or_values_is_the_reward_to_go() -> None:
    rewards = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 5.0, 9.0, 9.0]])
    mask = ragged_mask([3, 2], 4).float()
    advantages, returns = generalized_advantages(rewards, torch.zeros_like(rewards), mask, 1.0, 1.0)
    expected = torch.tensor([[6.0, 5.0, 3.0, 0.0], [9.0, 5.0, 0.0, 0.0]])
    assert_close(advantages, expected)
    assert_close(returns, expected)


def test_per_token_rewards_put_the_score_at_the_last_real_token() -> None:
    torch.manual_seed(0)
    lengths, width, kl_coef = [5, 2, 1], 5, 0.3
    mask = ragged_mask(lengths, width).float()
    kl, scores = torch.randn(3, width), torch.tensor([1.5, -2.0, 7.0])
    rewards = per_token_rewards(scores, kl, mask, kl_coef)
    expected = torch.zeros(3, width)
    for row, length in enumerate(lengths):
        expected[row, :length] = -kl_coef * kl[row, :length]
        expected[row, length - 1] += scores[row]
    assert_close(rewards, expected)
    assert_close(last_token_index(mask), torch.tensor([4, 1, 0]))


def test_token_log_probs_are_the_tempered_softmax_at_each_token() -> None:
    torch.manual_seed(0)
    logits, tokens = torch.randn(2, 3, 11), torch.randint(0, 11, (2, 3))
    probs = torch.softmax(logits / 0.7, dim=-1)
    expected = [[probs[row, t, tokens[row, t]].log().item() for t in range(3)] for row in range(2)]
    assert_close(token_log_probs(logits, tokens, temperature=0.7), torch.tensor(expected))


def test_unchanged_policy_loss_is_minus_the_mean_advantage() -> None:
    torch.manual_seed(0)
    mask = ragged_mask([4, 2], 4).float()
    log_probs, advantages, values = torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 4)
    losses = ppo_losses(
        log_probs=log_probs, old_log_probs=log_probs.clone(), advantages=advantages, values=values,
        old_values=values.clone(), returns=values + 1.0, mask=mask, cliprange=0.2, cliprange_value=0.2,
        vf_coef=0.1,
    )  # fmt: skip
    assert_close(losses.policy, -masked_mean(advantages, mask))
    assert_close(losses.value, torch.tensor(0.5))  # every real token is 1 away from its return
    assert_close(losses.total, losses.policy + 0.1 * losses.value)
    assert losses.clip_fraction == 0 and losses.value_clip_fraction == 0 and losses.approx_kl == 0


def test_policy_loss_stops_the_gradient_only_where_the_ratio_is_clipped() -> None:
    # per token: (ratio, advantage); the last token is padding
    ratios = torch.tensor([[1.5, 1.1, 0.5, 0.9, 0.5, 3.0]])
    advantages = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    log_probs = ratios.log().requires_grad_(True)
    zeros = torch.zeros_like(mask)
    losses = ppo_losses(
        log_probs=log_probs, old_log_probs=zeros, advantages=advantages, values=zeros, old_values=zeros,
        returns=zeros, mask=mask, cliprange=0.2, cliprange_value=0.2, vf_coef=0.1,
    )  # fmt: skip
    losses.policy.backward()
    # 1.5 (A>0) and 0.5 (A<0) lie past the range in the direction that helps: clipped, no gradient.
    # 0.5 with A>0 would lose: the pessimistic bound keeps the unclipped term and its gradient.
    kept = torch.tensor([[0.0, 1.0, 0.0, 1.0, 1.0, 0.0]])
    assert_close(log_probs.grad, -advantages * ratios * kept / 5)
    assert_close(losses.policy, torch.tensor((-1.2 - 1.1 + 0.8 + 0.9 - 0.5) / 5))
    assert_close(losses.clip_fraction, torch.tensor(2 / 5))
    assert_close(losses.approx_kl, 0.5 * masked_mean(ratios.log() ** 2, mask))


def test_value_loss_stops_the_gradient_only_where_the_clipped_error_is_larger() -> None:
    values = torch.tensor([[1.0, 1.0, 0.1, -0.5, -0.5, 5.0]], requires_grad=True)
    returns = torch.tensor([[0.0, 2.0, 1.0, -1.0, 0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    zeros = torch.zeros_like(mask)
    losses = ppo_losses(
        log_probs=zeros, old_log_probs=zeros, advantages=zeros, values=values, old_values=zeros,
        returns=returns, mask=mask, cliprange=0.2, cliprange_value=0.2, vf_coef=0.1,
    )  # fmt: skip
    losses.value.backward()
    # old values are 0, so clipped values are clamp(values, -0.2, 0.2); tokens 1 and 3 are worse clipped
    clipped_errors = [0.04, 3.24, 0.81, 0.64, 0.49]
    unclipped_errors = [1.0, 1.0, 0.81, 0.25, 1.0]
    expected = 0.5 * sum(map(max, clipped_errors, unclipped_errors)) / 5
    assert_close(losses.value, torch.tensor(expected))
    kept = torch.tensor([[1.0, 0.0, 1.0, 0.0, 1.0, 0.0]])
    assert_close(values.grad, (values.detach() - returns) * kept / 5)
    assert_close(losses.value_clip_fraction, torch.tensor(2 / 5))


def test_masked_whiten_normalises_real_tokens_and_zeroes_padding() -> None:
    torch.manual_seed(0)
    mask = ragged_mask([6, 3, 5], 6)
    values = 3.0 + 2.0 * torch.randn(3, 6, dtype=torch.float64)
    real = mask == 1
    whitened = masked_whiten(values, mask)
    assert abs(whitened[real].mean().item()) < 1e-9 and (whitened[~real] == 0).all()
    assert_close(whitened[real].var(unbiased=False).item(), 1.0)
    scaled = masked_whiten(values, mask, shift_mean=False)
    assert_close(scaled[real].mean().item(), values[real].mean().item())
    assert_close(scaled[real].var(unbiased=False).item(), 1.0)
    assert (scaled[~real] == 0).all()


def test_adaptive_kl_coef_follows_the_error_with_a_capped_step() -> None:
    coef, target, samples, horizon = 0.1, 6.0, 64, 1000
    assert adaptive_kl_coef(coef, target, target, samples, horizon) == coef
    assert math.isclose(adaptive_kl_coef(coef, 6.6, target, samples, horizon), coef * (1 + 0.1 * 0.064))
    assert math.isclose(adaptive_kl_coef(coef, 5.4, target, samples, horizon), coef * (1 - 0.1 * 0.064))
    # far off target, the error counts as +-20%
    assert math.isclose(adaptive_kl_coef(coef, 600.0, target, samples, horizon), coef * (1 + 0.2 * 0.064))
    assert math.isclose(adaptive_kl_coef(coef, 0.0, target, samples, horizon), coef * (1 - 0.2 * 0.064))


def test_cut_at_stop_pads_after_the_first_stop_token() -> None:
    stop, pad = 2, 0
    tokens = torch.tensor([[5, 6, 2, 7, 2], [5, 6, 7, 8, 9], [2, 5, 6, 7, 8]])
    cut, mask, ended = cut_at_stop(tokens, stop, pad)
    assert cut.tolist() == [[5, 6, 2, 0, 0], [5, 6, 7, 8, 9], [2, 0, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert ended.tolist() == [True, False, True]
    cut, mask, ended = cut_at_stop(tokens, None, pad)  # no stop token: every completion runs to the end
    assert torch.equal(cut, tokens) and mask.all() and not ended.any()


@pytest.fixture(scope="module")
def tiny_dir() -> str:
    return resolve_model("tiny")


@pytest.fixture
def tiny(tiny_dir: str):
    torch.manual_seed(0)
    return load_causal_lm(tiny_dir)


def steer_eos(model, eos: int, plan: list[list[bool]]) -> None:
    """Call k of lm_head (the k-th new token) makes row i's token EOS if plan[i][k], else never EOS."""
    calls = [0]

    def hook(module, args, logits):
        for row, wants in enumerate(plan):
            logits[row, :, eos] = 1e4 if wants[min(calls[0], len(wants) - 1)] else -1e4
        calls[0] += 1
        return logits

    model.lm_head.register_forward_hook(hook)


def test_generate_cuts_each_row_at_its_eos(tiny, tiny_dir: str) -> None:
    tokenizer = load_tokenizer(tiny_dir)
    tokenizer.padding_side = "left"
    eos = tokenizer.eos_token_id
    steer_eos(tiny, eos, [[False, False, True], [False]])
    sampled = generate(tiny, tokenizer, ["one two three", "four"], max_new_tokens=5, temperature=1.0)
    assert sampled.completion_ids[0, 2] == eos
    assert (sampled.completion_ids[0, 3:] == tokenizer.pad_token_id).all()
    assert (sampled.completion_ids[1] != eos).all()
    assert sampled.completion_mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]
    assert sampled.ended.tolist() == [True, False]
    assert sampled.prompt_mask[1].tolist()[-1] == 1 and sampled.prompt_mask[1, 0] == 0  # left padding


def test_generate_pads_when_all_stop_early_and_ignores_eos_without_stop(tiny, tiny_dir: str) -> None:
    tokenizer = load_tokenizer(tiny_dir)
    tokenizer.padding_side = "left"
    steer_eos(tiny, tokenizer.eos_token_id, [[True], [True]])
    early = generate(tiny, tokenizer, ["a b", "c"], max_new_tokens=4, temperature=1.0)
    assert early.completion_ids.shape == (2, 4)
    assert early.completion_mask.tolist() == [[1, 0, 0, 0]] * 2 and early.ended.all()
    full = generate(tiny, tokenizer, ["a b", "c"], max_new_tokens=4, temperature=1.0, stop_at_eos=False)
    assert (full.completion_ids == tokenizer.eos_token_id).all()
    assert full.completion_mask.all() and not full.ended.any()


def test_decode_answers_a_conversation_with_one_assistant_message(tiny_dir: str) -> None:
    tokenizer = load_tokenizer(tiny_dir)
    ids = tokenizer(["hello", "world"], return_tensors="pt", padding=True)["input_ids"]
    empty = ids[:, :0]
    completions = Completions(empty, empty, ids, torch.ones_like(ids), torch.ones(2, dtype=torch.bool))
    plain, chat = decode(tokenizer, completions, ["q", [{"role": "user", "content": "q"}]])
    assert isinstance(plain, str)
    assert chat == [{"role": "assistant", "content": tokenizer.decode(ids[1], skip_special_tokens=True)}]


def lora_policy(model):
    """The tiny model with a default and a value adapter, their lora_B random so each changes the output."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM")
    policy = get_peft_model(model, config)
    add_value_adapter(policy, config)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.5)
    return policy


def trainable(model) -> dict[str, bool]:
    return {name: param.requires_grad for name, param in model.named_parameters()}


@torch.no_grad()
def test_lora_layers_switch_adapters_without_touching_requires_grad(tiny) -> None:
    ids = torch.randint(3, 2000, (2, 6))
    mask = torch.ones_like(ids)
    base = tiny(input_ids=ids, attention_mask=mask).logits
    policy = lora_policy(tiny)
    before = trainable(policy)
    assert {"default", "value"} == {name.split(".")[-2] for name, grad in before.items() if grad}

    def logits() -> torch.Tensor:
        return policy(input_ids=ids, attention_mask=mask).logits

    default = logits()
    with lora_layers(policy, disabled=True):
        assert_close(logits(), base)
    assert trainable(policy) == before
    with lora_layers(policy, active="value"):
        value = logits()
    assert trainable(policy) == before
    with lora_layers(policy, active="default"):
        assert_close(logits(), default)  # outside any block only the default adapter runs
    assert not torch.allclose(default, base) and not torch.allclose(value, default)
    with pytest.raises(RuntimeError), lora_layers(policy, disabled=True):
        raise RuntimeError("a failing forward")
    assert_close(logits(), default)  # switches put back even on an error


@pytest.mark.parametrize("value_adapter", [False, True])
def test_one_backward_reaches_every_trainable_parameter(tiny, value_adapter: bool) -> None:
    module = PolicyAndValue(lora_policy(tiny) if value_adapter else tiny, value_adapter=value_adapter)
    ids = torch.randint(3, 2000, (2, 6))
    _, values = module(ids, torch.ones_like(ids))
    assert (values == 0).all()  # the head starts at zero: the first advantages are the rewards
    torch.nn.init.normal_(module.value_head.weight)  # else the value adapter's gradient is exactly 0
    logits, values = module(ids, torch.ones_like(ids))
    assert logits.shape == (2, 6, 2000) and values.shape == (2, 6)
    (logits.sum() + values.sum()).backward()
    params = dict(module.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and (p.grad is None or not p.grad.any())]
    assert missing == [] and params["value_head.weight"].requires_grad
    assert any("lora_A.value" in n for n in params) == value_adapter


def test_left_padding_leaves_a_rows_logits_and_positions_unchanged(tiny) -> None:
    mask = torch.tensor([[0, 0, 0, 1, 1, 1, 1, 1], [1] * 8])
    assert position_ids(mask).tolist() == [[0, 0, 0, 0, 1, 2, 3, 4], list(range(8))]
    ids = torch.randint(3, 2000, (1, 5))
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    with torch.no_grad():
        alone = causal_logits(tiny, ids, torch.ones_like(ids)).logits
        beside_padding = causal_logits(tiny, padded, mask[:1]).logits[:, 3:]
    assert_close(beside_padding, alone, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_gradient_checkpointing_leaves_the_critic_head_gradients_unchanged(tiny, use_reentrant: bool) -> None:
    module = PolicyAndValue(lora_policy(tiny), value_adapter=False).train()
    torch.nn.init.normal_(module.value_head.weight)
    ids = torch.randint(3, 2000, (2, 6))

    def critic_gradients() -> dict[str, torch.Tensor]:
        module.zero_grad(set_to_none=False)
        module(ids, torch.ones_like(ids))[1].sum().backward()
        return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}

    plain = critic_gradients()
    module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
    checkpointed = critic_gradients()
    assert_close(checkpointed, plain, rtol=1e-4, atol=1e-5)


def test_gradient_checkpointing_is_refused_for_a_critic_adapter(tiny) -> None:
    """Recomputing in backward would run the critic's layers with the policy's adapter on."""
    module = PolicyAndValue(lora_policy(tiny), value_adapter=True)
    with pytest.raises(ValueError, match="critic on its own adapter"):
        module.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def test_rollout_sampler_repeats_disjoint_batches_per_rank() -> None:
    samplers = [RolloutSampler(20, batch=4, repeats=3, rank=rank, world=2, seed=7) for rank in range(2)]
    per_rank = [list(sampler) for sampler in samplers]
    distinct = []
    for sampler, batches in zip(samplers, per_rank, strict=True):
        assert len(batches) == len(sampler) == 6  # 20 rows make 2 rollouts of 2 x 4; 4 rows are left over
        assert batches[0::3] == batches[1::3] == batches[2::3]  # each batch 3 times in a row
        distinct += batches[0::3]
    rows = [row for batch in distinct for row in batch]
    assert len(rows) == len(set(rows)) == 16 and set(rows) <= set(range(20))
    second = [list(sampler) for sampler in samplers]  # a new epoch draws a new order, still disjoint
    assert second != per_rank and not set(second[0][0]) & set(second[1][0])
    with pytest.raises(ValueError, match="4 prompts on each of 2 ranks"):
        RolloutSampler(7, batch=4, repeats=3, rank=0, world=2, seed=7)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_ppo_epochs", 0),
        ("num_mini_batches", 0),
        ("cliprange", 0.0),
        ("temperature", -1.0),
        ("lam", 1.5),
        ("gamma", -0.1),
        ("kl_target", 0.0),
        ("stop_token", "x"),
    ],
)
def test_ppo_config_names_the_bad_field(tmp_path, field: str, value) -> None:
    with pytest.raises(ValueError, match=rf"\b{field}\b"):
        PPOConfig(output_dir=str(tmp_path), use_cpu=True, **{field: value})


def test_rollout_batch_size_counts_every_micro_batch_of_every_mini_batch(tmp_path) -> None:
    config = PPOConfig(
        output_dir=str(tmp_path), use_cpu=True, per_device_train_batch_size=3,
        gradient_accumulation_steps=2, num_mini_batches=4, num_ppo_epochs=5,
    )  # fmt: skip
    assert config.rollout_batch_size == 3 * 2 * 4
    assert config.micro_batches_per_rollout == 5 * 4 * 2
