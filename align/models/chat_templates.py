"""Chat templates for models that ship none (Llama-3-8B, Qwen2.5-7B base, Mistral-7B-v0.1): `chat_template:`
in a pipeline file (top level, or a stage's own) names a builtin (`chatml`), a `.jinja` file, or a model
folder to take the template from. Resolved here without importing anything heavy, so `align validate` and
`align plan` read it; applied to the tokenizer in the worker (`apply`), with the special tokens it needs
added (the model's embeddings are resized to them) and its end-of-turn token as EOS, so generation stops
where a turn ends. The template is then saved with every output the stage writes.

Like TRL's `clone_chat_template`, which copies a template and its special tokens from another tokenizer;
align takes the template from a name or a file too, and leaves resizing to where the model is loaded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # how `align plan` names it: `chatml (builtin)`, a file, a model folder
    text: str
    special_tokens: tuple[str, ...] = ()  # added to the tokenizer when it lacks them
    eos: str | None = None  # the end of a turn, made the tokenizer's EOS


BUILTIN = {"chatml": ChatTemplate("chatml (builtin)", CHATML, ("<|im_start|>", "<|im_end|>"), "<|im_end|>")}


def folder_template(folder: Path) -> str | None:
    """A model folder's own template, from its tokenizer files (None when it has none)."""
    for name in ("chat_template.jinja",):
        if (folder / name).is_file():
            return (folder / name).read_text()
    try:
        template = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError, AttributeError):
        return None
    return template if isinstance(template, str) else None


def special_tokens_of(folder: Path, text: str) -> tuple[tuple[str, ...], str | None]:
    """The folder's special tokens that its template writes, and its EOS if the template writes it."""
    try:
        settings = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return (), None
    added = [entry.get("content") for entry in (settings.get("added_tokens_decoder") or {}).values()]
    special = tuple(token for token in added if isinstance(token, str) and token in text)
    eos = settings.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    return special, eos if isinstance(eos, str) and eos in text else None


def resolve_template(value: str) -> ChatTemplate:
    """The template `value` names; ValueError, saying what is accepted, when it names none."""
    if value in BUILTIN:
        return BUILTIN[value]
    path = Path(value)
    if path.is_dir():
        text = folder_template(path)
        if text is None:
            raise ValueError(f"the model folder {value} has no chat template to take")
        special, eos = special_tokens_of(path, text)
        return ChatTemplate(f"from {value}", text, special, eos)
    if path.is_file():
        return ChatTemplate(value, path.read_text())
    raise ValueError(
        f"{value!r} is not a builtin chat template ({', '.join(BUILTIN)}), a .jinja file or a model folder"
    )


def apply(template: ChatTemplate, tokenizer: Any) -> Any:
    """`tokenizer` with the template, its special tokens (added when missing), its EOS, and a pad token
    (EOS when it has none)."""
    tokenizer.chat_template = template.text
    missing = [token for token in template.special_tokens if token not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens({"additional_special_tokens": missing})
    if template.eos:
        tokenizer.eos_token = template.eos
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer
