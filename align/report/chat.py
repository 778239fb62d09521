"""`align chat`: talk to a model folder, or to a stage's output named by its pipeline file, with the model's
chat template, the reply streamed token by token. The CLI prints what `reply` yields."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from align.errors import AlignError
from align.records import Output
from align.run import records


@dataclass(frozen=True)
class ChatTarget:
    """What to load: a base model folder (or builtin, or hub id), the adapters to merge into it, and where
    the tokenizer (with the chat template the stage used) was saved; `said` names it for a person."""

    base: str
    adapters: tuple[str, ...]
    tokenizer: str
    said: str


def chat_target(target: str, stage: str | None, overrides: list[str] | None = None) -> ChatTarget:
    """A pipeline file with `stage` (default: its last stage that wrote a model or adapter), else a model."""
    path = Path(target)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        return stage_target(path, stage, overrides or [])
    if stage is not None:
        raise AlignError(f"--stage {stage}: names a stage of a pipeline file; {target} is not one")
    from align.models.loading import resolve_model

    folder = resolve_model(target, "target")
    return ChatTarget(folder, (), folder, target)


def stage_target(path: Path, stage: str | None, overrides: list[str]) -> ChatTarget:
    from align.pipeline.file import load

    pipeline = load(str(path), overrides)
    names = list(pipeline.stages)
    if stage is not None and stage not in names:
        raise AlignError(f"--stage {stage}: no such stage in {path}; stages: {', '.join(names)}")
    root = pipeline.defaults.output_root

    def output(name: str) -> Output | None:
        record = records.read_stage(records.stage_dir(root, pipeline.name, name))
        if record is None or not record.succeeded or record.kind == "eval":
            return None
        return record.output

    if stage is None:
        stage = next((name for name in reversed(names) if output(name)), None)
        if stage is None:
            raise AlignError(f"{path}: no stage has a finished model yet; run `align run {path}` first")
    found = output(stage)
    if found is None:
        kind = pipeline.stages[stage].kind
        why = "an eval stage writes no model" if kind == "eval" else f"not finished: `align run {path}`"
        raise AlignError(f"--stage {stage}: no model to chat with ({why}); name a stage that trains")
    adapters = tuple(found.adapters)
    return ChatTarget(found.base, adapters, adapters[-1] if adapters else found.base, f"stage {stage}")


def load_chat_model(target: ChatTarget) -> tuple[Any, Any]:
    """The model (its adapters merged) and its tokenizer, in fp32 on the GPU when there is one."""
    import warnings

    import torch
    from peft import PeftModel
    from transformers import GenerationConfig
    from transformers.utils import logging

    from align.models.loading import load_causal_lm, load_tokenizer

    logging.disable_progress_bar()  # a chat shows replies, not loading bars
    warnings.filterwarnings("ignore", category=FutureWarning)
    model = load_causal_lm(target.base, dtype=torch.float32)
    for adapter in target.adapters:
        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    if torch.cuda.is_available():
        model = model.to("cuda")
    # `generate` fills every setting it is not given (a repetition_penalty, a top_k) from the checkpoint's
    # generation_config.json; the eval stage asks with exactly its own settings, and so must a chat, or
    # it answers otherwise than the eval table says (align/stages/eval_answers.py)
    model.generation_config = GenerationConfig()
    tokenizer = load_tokenizer(target.tokenizer)
    if tokenizer.chat_template is None:
        raise AlignError(
            f"{target.said}: its tokenizer has no chat template; train it with `chat_template: chatml` set, "
            "or chat with a model that has one"
        )
    return model.eval(), tokenizer


def reply(
    model: Any, tokenizer: Any, messages: list[dict[str, str]], max_new_tokens: int, temperature: float
) -> Iterator[str]:
    """The assistant's reply to `messages`, piece by piece as it is generated (greedy at temperature 0)."""
    from transformers import TextIteratorStreamer

    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    ).to(model.device)
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, skip_special_tokens=True)
    sampling = {"do_sample": True, "temperature": temperature} if temperature > 0 else {"do_sample": False}
    settings = dict(
        **ids,
        **sampling,
        max_new_tokens=max_new_tokens,
        streamer=streamer,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    worker = threading.Thread(target=model.generate, kwargs=settings, daemon=True)
    worker.start()
    yield from streamer
    worker.join()
