"""A model's shape and exact parameter counts, so memory can be planned without loading weights.

The counts come from the model's own transformers class built on the meta device
(align/models/meta_count.py): every parameter, with MoE experts, fused projections (phi3's `qkv_proj`),
biases, norms and tied embeddings, as the class holds them, for any family transformers knows (llama, qwen,
gemma, phi, mistral, mixtral, gpt2...). LoRA's trainable count is peft's own, applied to that meta model.
Both are cached by (config digest, transformers and peft versions) under `$ALIGN_CACHE/model-counts`, so
only a plan that meets a config for the first time imports torch; the rest reads JSON.

Presets are published config.json files under configs/models/<name>/, found by name or hub id
(configs/models/aliases.yaml), so `align plan` answers for them with no hub.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from align.cache import cache_root
from align.fingerprint import digest

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "models"
COUNTS_FOLDER = "model-counts"
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraTargets:
    """A `lora.target_modules` resolved against the model: linears (or peft's `all-linear`, MoE weights
    included), and the MoE weights named, which peft adapts through `target_parameters`."""

    modules: tuple[str, ...] | str
    parameters: tuple[str, ...] = ()
    summary: str = ""  # what is adapted and what is left out, in words, for `align plan`


@dataclass(frozen=True, eq=False)
class Architecture:
    """What the memory plan reads of a model: its config's shape fields and the counts of its class.

    params: every parameter once (tied embeddings once); output_head: an untied lm_head's weights (0 when
    tied); quantizable: the weights of the linears bitsandbytes packs to NF4 (every linear but the head);
    linears: full names of the modules peft's `all-linear` adapts; moe_weights: full names of the MoE
    weights it adapts as parameters (the experts' fused 3-D weights, the router), through peft's
    `target_parameters`.
    """

    config: dict[str, Any] = field(repr=False)
    model_type: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    experts_per_token: int
    params: int
    output_head: int
    quantizable: int
    linears: tuple[str, ...]
    moe_weights: tuple[str, ...]

    def param_count(self) -> int:
        return self.params

    def linear_weight_count(self) -> int:
        """Weights of the linears: the part that 4-bit quantization packs."""
        return self.quantizable

    def reward_model_param_count(self) -> int:
        """This trunk as a one-label sequence classifier (what a `reward` stage writes): the lm_head gives
        way to a bias-free hidden -> 1 score head."""
        return self.params - self.output_head + self.hidden_size

    def linear_names(self) -> list[str]:
        """The names `target_modules` can give: each linear's own name, as peft matches them."""
        return sorted({name.rsplit(".", 1)[-1] for name in self.linears})

    def moe_weight_names(self) -> list[str]:
        """The names that adapt the MoE weights (e.g. `experts.gate_up_proj`, the router's `gate.weight`)."""
        return sorted({".".join(name.split(".")[-2:]) for name in self.moe_weights})

    def resolve_lora(self, targets: list[str] | tuple[str, ...] | str) -> LoraTargets:
        """Each target name matched as peft matches it (the whole name or its last dotted parts), against
        the linears and the expert weights; a name that matches neither is refused with what the model has."""
        moe = ", ".join(self.moe_weight_names())
        if targets == ALL_LINEAR:
            adapted = f"; MoE weights too: {moe}" if moe else ""
            return LoraTargets(ALL_LINEAR, summary=f"all-linear: {', '.join(self.linear_names())}{adapted}")
        names = (targets,) if isinstance(targets, str) else tuple(dict.fromkeys(targets))

        def matches(name: str, candidates: tuple[str, ...]) -> bool:
            return any(full == name or full.endswith("." + name) for full in candidates)

        unknown = [name for name in names if not matches(name, self.linears + self.moe_weights)]
        if unknown or not names:
            listed = f", or its MoE weights {self.moe_weight_names()}" if moe else ""
            raise ValueError(
                f"LoRA target_modules {list(unknown or names)} not in this {self.model_type} model: use "
                f"'all-linear' or names of its linears {self.linear_names()}{listed}"
            )
        modules = tuple(name for name in names if matches(name, self.linears))
        parameters = tuple(name for name in names if matches(name, self.moe_weights))
        left_out = f"; MoE weights left out ({moe}: name them to adapt)" if moe and not parameters else ""
        return LoraTargets(modules, parameters, summary=", ".join(names) + left_out)

    def lora_param_count(self, rank: int, targets: list[str] | tuple[str, ...] | str = ALL_LINEAR) -> int:
        """Adapter parameters as peft builds them for `targets` on this model."""
        if rank < 1:
            raise ValueError(f"LoRA rank must be a positive integer, got {rank}")
        resolved = self.resolve_lora(targets)
        return lora_count(self, rank, resolved)

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

        Per layer (15 + 19k)*s*b*h bytes at 16 bits (width 2; doubled at fp32): attention and the two
        norms 15*s*b*h, the MLP 19*s*b*h for each of the k experts a token visits (k = 1 for a dense model,
        the config's `num_experts_per_tok` for MoE), so 34*s*b*h for a dense layer. Their 5*a*s^2*b
        attention-score term is left out: SDPA / flash attention, transformers' default, never stores the
        s x s matrix. With checkpointing only each layer's input (2*s*b*h at 16 bits) is kept, plus one
        layer's full activations while it is recomputed. The logits add s*b*V*(width + 4 + 4) bytes at 16
        bits (the logits, their fp32 upcast for the loss and cross-entropy's saved log-softmax), s*b*V*8 at
        fp32; at a 128k vocabulary they outweigh several layers.

        `trunk_passes` counts forwards through the layers that backward needs: a PPO critic on its own
        LoRA adapter runs the trunk a second time on the same tokens and ends in a value head, not logits.
        """
        token_width = micro_batch_size * seq_len * self.hidden_size * width
        full_layer = (15 + 19 * self.experts_per_token) * token_width // 2
        if gradient_checkpointing:  # layers are recomputed one at a time, whichever pass they belong to
            layers = trunk_passes * self.num_layers * token_width + full_layer
        else:
            layers = trunk_passes * self.num_layers * full_layer
        logit_bytes = 8 if width == 4 else 8 + width
        return layers + micro_batch_size * seq_len * self.vocab_size * logit_bytes


def versions() -> dict[str, str]:
    """What the counts depend on besides the config (read from package metadata: no import)."""
    return {name: importlib.metadata.version(name) for name in ("transformers", "peft")}


def counts_file(config: dict[str, Any]) -> Path:
    return cache_root() / COUNTS_FOLDER / f"{digest({'config': config, **versions()})[:32]}.json"


def read_counts(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_counts(path: Path, counts: dict[str, Any]) -> None:
    """Whole or not at all: ranks and runs may plan the same model at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    with os.fdopen(handle, "w") as out:
        json.dump(counts, out)
    os.replace(scratch, path)


def architecture_from_config(config: dict[str, Any]) -> Architecture:
    """The architecture of an HF config.json dict, counted once on the meta device, then read from cache."""
    if not config.get("model_type"):
        raise ValueError("model config has no `model_type`: a transformers config.json names its family")
    path = counts_file(config)
    stored = read_counts(path)
    if "model" not in stored:
        from align.models.meta_count import count

        stored = {"model": count(config), "lora": stored.get("lora", {})}
        write_counts(path, stored)
    model = stored["model"]
    return Architecture(
        config=config,
        **{key: tuple(value) if isinstance(value, list) else value for key, value in model.items()},
    )


def lora_count(arch: Architecture, rank: int, targets: LoraTargets) -> int:
    """peft's trainable count for (rank, targets), cached beside the model's counts."""
    key = json.dumps([rank, targets.modules, targets.parameters])
    path = counts_file(arch.config)
    stored = read_counts(path)
    if key not in stored.get("lora", {}):
        from align.models.meta_count import count_lora

        modules = targets.modules if isinstance(targets.modules, str) else list(targets.modules)
        value = count_lora(arch.config, rank, modules, list(targets.parameters))
        stored = read_counts(path)  # another process may have added counts meanwhile
        stored.setdefault("lora", {})[key] = value
        write_counts(path, stored)
    return stored["lora"][key]


class Presets(Mapping[str, Architecture]):
    """The shipped configs by name, each counted when first asked for (torch only on a cache miss)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def __getitem__(self, name: str) -> Architecture:
        if name not in self.names():
            raise KeyError(name)
        return preset_architecture(self.directory / name)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def names(self) -> list[str]:
        return sorted(path.parent.name for path in self.directory.glob("*/config.json"))


@cache
def preset_architecture(folder: Path) -> Architecture:
    return architecture_from_config(json.loads((folder / "config.json").read_text()))


@cache
def preset_aliases() -> dict[str, str]:
    """Hub id (lower case) -> preset name, from configs/models/aliases.yaml; each name is its own alias."""
    aliases = {name.lower(): name for name in PRESETS.names()}
    for name, hub_ids in yaml.safe_load((PRESET_DIR / "aliases.yaml").read_text()).items():
        aliases.update({hub_id.lower(): name for hub_id in hub_ids})
    return aliases


PRESETS = Presets(PRESET_DIR)


def architecture_for(model_name_or_dir: str) -> Architecture | None:
    """The shape of a local model dir (its config.json) or of a known preset / hub id; None if unknown:
    no config, or a family only its own code knows (`auto_map`)."""
    config_path = Path(model_name_or_dir) / "config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        if config.get("auto_map") or not known_family(config.get("model_type")):
            return None
        return architecture_from_config(config)
    preset = preset_aliases().get(model_name_or_dir.strip().lower())
    return PRESETS[preset] if preset else None


@cache
def known_family(model_type: str | None) -> bool:
    """Whether transformers ships the family: its name in the Auto classes' table, read as text (an import
    of transformers costs seconds)."""
    package = Path(importlib.util.find_spec("transformers").submodule_search_locations[0])
    table = (package / "models" / "auto" / "modeling_auto.py").read_text()
    return bool(model_type) and f'("{model_type}",' in table
