"""Shapes of Llama-style decoders, so memory can be planned without loading weights.

Counts are analytic and match `sum(p.numel() for p in LlamaForCausalLM(config).parameters())`
exactly; other families with extra bias terms (Qwen2's q/k/v bias) need those flags set.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "models"

LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The linears of one decoder layer, as peft's `target_modules` names them."""

_REQUIRED_CONFIG_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


@dataclass(frozen=True)
class Architecture:
    """The shape of a decoder-only transformer with GQA attention and a gated (SwiGLU) MLP."""

    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool = False
    head_dim: int | None = None
    attention_bias: bool = False
    mlp_bias: bool = False

    @property
    def attention_head_dim(self) -> int:
        """Per-head width; Llama derives it from hidden_size unless the config sets it."""
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in_features, out_features) of each linear in one decoder layer."""
        h, i = self.hidden_size, self.intermediate_size
        q_width = self.num_heads * self.attention_head_dim
        kv_width = self.num_kv_heads * self.attention_head_dim
        return {
            "q_proj": (h, q_width),
            "k_proj": (h, kv_width),
            "v_proj": (h, kv_width),
            "o_proj": (q_width, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def linear_weight_count(self) -> int:
        """Weights of all decoder-layer linears: the part that 4-bit quantization packs."""
        return self.num_layers * sum(n_in * n_out for n_in, n_out in self.linear_shapes().values())

    def param_count(self) -> int:
        """Every parameter once: embeddings, layers, final norm, and lm_head unless tied."""
        shapes = self.linear_shapes()
        biases = 0
        if self.attention_bias:
            biases += sum(shapes[name][1] for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
        if self.mlp_bias:
            biases += sum(shapes[name][1] for name in ("gate_proj", "up_proj", "down_proj"))
        norms_per_layer = 2 * self.hidden_size
        layers = self.linear_weight_count() + self.num_layers * (biases + norms_per_layer)
        embeddings = self.vocab_size * self.hidden_size
        lm_head = 0 if self.tie_embeddings else embeddings
        return embeddings + layers + self.hidden_size + lm_head

    def reward_model_param_count(self) -> int:
        """This trunk as a one-label sequence classifier (what a `reward` stage writes): the lm_head
        gives way to a bias-free hidden -> 1 score head."""
        lm_head = 0 if self.tie_embeddings else self.vocab_size * self.hidden_size
        return self.param_count() - lm_head + self.hidden_size

    def activation_bytes(
        self,
        micro_batch_size: int,
        seq_len: int,
        *,
        width: int,
        gradient_checkpointing: bool,
        trunk_passes: int = 1,
    ) -> int:
        """Activations kept for backward, after Korthikanti et al. 2022 (no tensor parallelism).

        Per layer 34*s*b*h bytes at 16 bits (width 2; doubled at fp32). Their 5*a*s^2*b
        attention-score term is left out: SDPA / flash attention, transformers' default, never
        stores the s x s matrix. With checkpointing only each layer's input (2*s*b*h at 16 bits)
        is kept, plus one layer's full activations while it is recomputed. The logits add
        s*b*V*(width + 4 + 4) bytes at 16 bits (the logits, their fp32 upcast for the loss and
        cross-entropy's saved log-softmax), s*b*V*8 at fp32; at a 128k vocabulary they
        outweigh several layers.

        `trunk_passes` counts forwards through the layers that backward needs: a PPO critic on its own
        LoRA adapter runs the trunk a second time on the same tokens and ends in a value head, not logits.
        """
        token_width = micro_batch_size * seq_len * self.hidden_size * width
        full_layer = 17 * token_width
        if gradient_checkpointing:  # layers are recomputed one at a time, whichever pass they belong to
            layers = trunk_passes * self.num_layers * token_width + full_layer
        else:
            layers = trunk_passes * self.num_layers * full_layer
        logit_bytes = 8 if width == 4 else 8 + width
        return layers + micro_batch_size * seq_len * self.vocab_size * logit_bytes

    def lora_param_count(self, rank: int, target_modules: tuple[str, ...] | str = LINEAR_MODULES) -> int:
        """Adapter parameters: A (r x in) plus B (out x r), i.e. r*(in+out), per targeted linear per layer."""
        if rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {rank}")
        shapes = self.linear_shapes()
        per_layer = sum(rank * sum(shapes[name]) for name in resolve_lora_targets(target_modules))
        return self.num_layers * per_layer


def resolve_lora_targets(target_modules: tuple[str, ...] | list[str] | str) -> tuple[str, ...]:
    """Check target names against the decoder linears; "all-linear" means all seven, as in peft."""
    if target_modules == "all-linear":
        return LINEAR_MODULES
    targets = (target_modules,) if isinstance(target_modules, str) else tuple(target_modules)
    unknown = [name for name in targets if name not in LINEAR_MODULES]
    if unknown or not targets:
        raise ValueError(
            f"LoRA target_modules {list(targets)} not understood: use 'all-linear' or names from "
            f"{list(LINEAR_MODULES)}"
        )
    return tuple(dict.fromkeys(targets))


def architecture_from_config(config: dict) -> Architecture:
    """Read an HF config.json dict with LlamaConfig keys; missing keys are named in the error."""
    missing = [key for key in _REQUIRED_CONFIG_KEYS if key not in config]
    if missing:
        raise ValueError(f"model config lacks {missing}: a Llama-style config.json has all of them")
    num_heads = config["num_attention_heads"]
    return Architecture(
        hidden_size=config["hidden_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=config.get("num_key_value_heads") or num_heads,
        intermediate_size=config["intermediate_size"],
        vocab_size=config["vocab_size"],
        tie_embeddings=bool(config.get("tie_word_embeddings", False)),
        head_dim=config.get("head_dim"),
        attention_bias=bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
    )


def _load_presets(directory: Path) -> tuple[dict[str, Architecture], dict[str, str]]:
    """One YAML per preset: `name`, `aliases` (hub ids) and `config` (config.json keys)."""
    presets: dict[str, Architecture] = {}
    aliases: dict[str, str] = {}
    for path in sorted(directory.glob("*.yaml")):
        entry = yaml.safe_load(path.read_text())
        name = entry["name"]
        presets[name] = architecture_from_config(entry["config"])
        aliases[name.lower()] = name
        for alias in entry.get("aliases", []):
            aliases[alias.lower()] = name
    return presets, aliases


PRESETS, PRESET_ALIASES = _load_presets(PRESET_DIR)


def architecture_for(model_name_or_dir: str) -> Architecture | None:
    """The shape of a local model dir (its config.json) or of a known preset / hub id; None if unknown."""
    config_path = Path(model_name_or_dir) / "config.json"
    if config_path.is_file():
        return architecture_from_config(json.loads(config_path.read_text()))
    preset = PRESET_ALIASES.get(model_name_or_dir.strip().lower())
    return PRESETS[preset] if preset else None
