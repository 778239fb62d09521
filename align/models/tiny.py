"""A tiny random-init Llama with a real BPE tokenizer, built offline in about a second.

Tests and demos need a model that loads with plain `AutoModelForCausalLM`/`AutoTokenizer`, speaks
ChatML like real instruct models, and trains in seconds on two CPU cores. Nothing here needs a hub.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from pydoc_data.topics import topics

import chatterbot_corpus
import torch
import yaml
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

PAD, IM_START, IM_END = "<|pad|>", "<|im_start|>", "<|im_end|>"
VOCAB_SIZE = 2000

# ChatML, as SmolLM2 and Qwen use it. The {% generation %} markers let TRL's
# `assistant_only_loss` find the assistant tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}"
    "{{ '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def english_text() -> Iterator[str]:
    """Real prose, code and chat from installed packages, in a fixed order so the vocabulary is stable."""
    yield from (topics[key] for key in sorted(topics))
    corpus = Path(chatterbot_corpus.__file__).parent / "data" / "english"
    for path in sorted(corpus.glob("*.yml")):
        for conversation in yaml.safe_load(path.read_text(encoding="utf-8"))["conversations"]:
            yield from (str(turn) for turn in conversation)


def train_tokenizer(vocab_size: int = VOCAB_SIZE) -> PreTrainedTokenizerFast:
    """Byte-level BPE (GPT-2 style), so any text round-trips without unknown tokens."""
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, IM_START, IM_END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(english_text(), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=IM_END,
        pad_token=PAD,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


def build_tiny_model(out_dir: Path, *, seed: int = 0) -> None:
    """Write a ~0.2M-parameter Llama and its tokenizer to `out_dir`; the same seed gives the same bytes."""
    tokenizer = train_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng():  # leave the caller's RNG as it was
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def build_tiny_reward_model(out_dir: Path, tiny_dir: Path, *, seed: int = 0) -> Path:
    """A one-label sequence classifier on the tiny model's config and tokenizer, random init with `seed`:
    a stand-in reward model for tests and benchmarks."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    config = AutoConfig.from_pretrained(tiny_dir, num_labels=1, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(seed)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir
