"""A model's parameters counted on its own transformers class, built on the meta device: no weights, no
memory, about a second even for Mixtral-8x7B. The torch side of align/models/architectures.py, imported only
when a count is not cached yet."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

ALL_LINEAR = "all-linear"

if not Path("/proc/driver/nvidia").exists():  # peft imports DeepSpeed, which says it found no GPU on stdout
    os.environ.setdefault("DS_ACCELERATOR", "cpu")


def meta_model(config: dict[str, Any]) -> torch.nn.Module:
    """The causal LM `config` describes, with every parameter on the meta device."""
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(CONFIG_MAPPING[config["model_type"]].from_dict(config))


def linear_modules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The linears bitsandbytes packs to NF4 (nn.Linear and GPT-2's Conv1D), by full name; the output head
    stays unpacked."""
    from transformers.pytorch_utils import Conv1D

    head = model.get_output_embeddings()
    return {
        name: module
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear | Conv1D) and module is not head
    }


def lora_inventory(model: torch.nn.Module) -> tuple[list[str], list[str]]:
    """What peft's `all-linear` adapts on this model: (module names, expert weight names). Read from peft
    itself applied at rank 1, because it reaches past nn.Linear: MoE routers, and the experts' fused 3-D
    weights through `target_parameters`."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora.layer import LoraLayer, ParamWrapper

    with warnings.catch_warnings():  # peft's notes on MoE patterns it matched no module with
        warnings.simplefilter("ignore")
        adapted = get_peft_model(model, LoraConfig(r=1, target_modules=ALL_LINEAR))
    modules, parameters = [], []
    for name, module in adapted.base_model.model.named_modules():
        if isinstance(module, ParamWrapper):
            parameters.append(f"{name.replace('.base_layer', '')}.{module.parameter_name}")
        elif isinstance(module, LoraLayer):
            modules.append(name)
    return sorted(modules), sorted(parameters)


def count(config: dict[str, Any]) -> dict[str, Any]:
    """Every count the memory plan needs, as JSON: see `Architecture` for what each field means."""
    model = meta_model(config)
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    text = model.config.get_text_config()
    counts = {
        "model_type": model.config.model_type,
        "hidden_size": text.hidden_size,
        "num_layers": text.num_hidden_layers,
        "vocab_size": text.vocab_size,
        "experts_per_token": int(getattr(text, "num_experts_per_tok", None) or 1),
        "params": sum(param.numel() for param in model.parameters()),
        "output_head": 0 if head is None or tied else head.weight.numel(),
        "quantizable": sum(module.weight.numel() for module in linear_modules(model).values()),
    }
    counts["linears"], counts["moe_weights"] = lora_inventory(model)
    return counts


def count_lora(config: dict[str, Any], rank: int, modules: list[str] | str, parameters: list[str]) -> int:
    """LoRA's trainable parameters as peft itself builds them on the meta model."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=rank, target_modules=modules or None, target_parameters=parameters or None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adapted = get_peft_model(meta_model(config), lora)
    return sum(param.numel() for param in adapted.parameters() if param.requires_grad)
