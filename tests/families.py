"""Tiny random-init models of eight transformers families, built offline from their own config classes
with the tiny model's tokenizer: what a stranger brings that is not a Llama."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from align.models.loading import resolve_model

SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
FAMILIES: dict[str, dict] = {
    "llama": dict(SHAPE, intermediate_size=128),
    "qwen2": dict(SHAPE, intermediate_size=128),
    "qwen3": dict(SHAPE, intermediate_size=128, head_dim=16),
    "gemma2": dict(SHAPE, intermediate_size=128, head_dim=16, query_pre_attn_scalar=16),
    "phi3": dict(SHAPE, intermediate_size=128),
    "mistral": dict(SHAPE, intermediate_size=128),
    "mixtral": dict(SHAPE, intermediate_size=64, num_local_experts=4, num_experts_per_tok=2),
    "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=512),
}


def build_family(family: str, folder: Path, seed: int = 0, *, chat_template: bool = True) -> Path:
    """A saved random-init model of `family` beside the tiny model's tokenizer (and its chat template, unless
    `chat_template` is False: a base model, as a user brings one), with a row for every token that tokenizer
    has as the family's tokenizer class reads it (Qwen2's adds an unknown token, as a real Qwen2 checkpoint
    has)."""
    tiny = Path(resolve_model("tiny"))
    out = folder / family
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }
    AutoConfig.for_model(family, **FAMILIES[family], **special).save_pretrained(out)
    files = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
    for name in files if chat_template else files[:-1]:
        if (tiny / name).is_file():
            shutil.copy(tiny / name, out / name)
    rows = len(AutoTokenizer.from_pretrained(out))  # the family's tokenizer class
    config = AutoConfig.for_model(family, **FAMILIES[family], **special, vocab_size=rows)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out


def parameter_count(folder: Path) -> int:
    model = AutoModelForCausalLM.from_pretrained(folder)
    return sum(param.numel() for param in model.parameters())
