"""The weights a stage publishes, in the dtype its `save_dtype` names: by default the input model's.

Mixed-precision training holds fp32 weights (ddp, fsdp) and a merge is checked in fp32, so what the
trainer writes is fp32 even for a bf16 input; published as is, a bf16 model would come back twice its
size. The saved files are rewritten once, after every rank has saved; checkpoints keep the dtype training
holds, so a resume continues exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from align.stages.context import DTYPES, StageContext

SAVE_DTYPE_INPUT = "input"


def export_dtype(ctx: StageContext, output: str) -> torch.dtype | None:
    """The dtype to publish `output` ("model" or "adapter") in; None keeps it as saved.

    `input` is the input model's dtype, as its config records it; an adapter stays as trained.
    """
    wanted = ctx.plan.stage.save_dtype
    if wanted != SAVE_DTYPE_INPUT:
        return DTYPES[wanted]
    if output != "model":
        return None
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(ctx.model_input.base, trust_remote_code=ctx.plan.remote_code)
    return config.dtype if isinstance(config.dtype, torch.dtype) else None


def cast_saved_weights(folder: Path, dtype: torch.dtype) -> None:
    """Rewrite each safetensors file in `folder` with its floating-point tensors in `dtype`, and the dtype
    its config.json and shard index record."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    total = 0
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), "pt") as weights:
            metadata = weights.metadata()
            tensors = {name: weights.get_tensor(name) for name in weights.keys()}
        cast = {name: t.to(dtype) if t.is_floating_point() else t for name, t in tensors.items()}
        total += sum(t.numel() * t.element_size() for t in cast.values())
        if any(t.dtype != cast[name].dtype for name, t in tensors.items()):
            save_file(cast, str(path), metadata=metadata)
    rewrite_json(folder / "config.json", "dtype", str(dtype).removeprefix("torch."))
    for index in folder.glob("*.safetensors.index.json"):
        rewrite_json(index, "metadata", {**json.loads(index.read_text())["metadata"], "total_size": total})


def rewrite_json(path: Path, key: str, value: object) -> None:
    """Set one top-level key of a JSON file, if the file exists and holds another value."""
    if not path.is_file():
        return
    body = json.loads(path.read_text())
    if body.get(key) != value:
        path.write_text(json.dumps({**body, key: value}, indent=2) + "\n")


def publish(ctx: StageContext, folder: Path, output: str) -> None:
    """Cast what the stage saved in `folder` to its export dtype (the main rank, once every rank saved)."""
    dtype = export_dtype(ctx, output)
    if dtype is not None:
        cast_saved_weights(folder, dtype)
