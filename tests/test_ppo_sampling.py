"""PPO samples what it scores: the sampling settings are exactly those PPO passes (a checkpoint's
generation_config.json adds none), and truncated sampling, which its log-probs would not match, is refused."""

from __future__ import annotations

import json

import pytest
import torch

from align.trainers.ppo_config import PPOConfig


def test_sampling_ignores_the_checkpoint_generation_config(tmp_path) -> None:
    """generate() fills every setting it is not given from generation_config.json; PPO's samples must come
    from the distribution its log-probs are computed under, whatever the checkpoint says."""
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from align.models.loading import resolve_model
    from align.trainers.sampling import generate

    plain = resolve_model("tiny")
    tuned = tmp_path / "tuned"
    shutil.copytree(plain, tuned)
    inherited = {"repetition_penalty": 50.0, "min_p": 0.9, "no_repeat_ngram_size": 1}  # min_p: near greedy
    (tuned / "generation_config.json").write_text(json.dumps(inherited))
    tokenizer = AutoTokenizer.from_pretrained(plain, padding_side="left")
    prompts = ["Hello there", "What is two plus two?"]
    samples = []
    for folder in (plain, tuned):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(folder)
        assert (model.generation_config.min_p == 0.9) == (folder == tuned)
        samples.append(generate(model, tokenizer, prompts, max_new_tokens=12, temperature=1.0).completion_ids)
    assert torch.equal(samples[0], samples[1])


@pytest.mark.parametrize("setting", [{"top_k": 5}, {"top_p": 0.9}])
def test_ppo_refuses_truncated_sampling(tmp_path, setting) -> None:
    with pytest.raises(ValueError, match="full softmax at `temperature`"):
        PPOConfig(output_dir=str(tmp_path), use_cpu=True, **setting)
