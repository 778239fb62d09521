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
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from align.cache import cache_root, exists, is_dir
from align.models.tool_template import CHATML_TOOLS

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] + '<|im_end|>' }}{% endif %}{{ '\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3 = (
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] | trim + '<|eot_id|>' }}{% endgeneration %}"
    "{% else %}{{ message['content'] | trim + '<|eot_id|>' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
GENERATION = re.compile(r"\{%-?\s*generation\s*-?%\}")
"""TRL's `has_generation_markers` test, here so that `align plan` needs no TRL (tests/test_chat_templates.py
holds the two to one answer)."""
SPECIAL_TOKEN = re.compile(r"<\|[A-Za-z0-9_]+\|>|<(?:start|end)_of_turn>")
"""What a special token looks like in a template file (ChatML's, Llama 3's, Phi's, Gemma's)."""
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>")
"""The tokens that end a turn in the templates people write; the first a file's template writes is its EOS."""


@dataclass(frozen=True)
class ChatTemplate:
    source: str  # how `align plan` names it: `chatml (builtin)`, a file, a model folder
    text: str
    special_tokens: tuple[str, ...] = ()  # added to the tokenizer when it lacks them
    eos: str | None = None  # the end of a turn, made the tokenizer's EOS

    @property
    def summary(self) -> str:
        """One line for `align plan`: where it comes from, the tokens it adds, the EOS it sets."""
        tokens = f"; adds {' '.join(self.special_tokens)} if missing" if self.special_tokens else ""
        return f"{self.source}{tokens}" + (f"; eos {self.eos}" if self.eos else "")


BUILTIN = {
    "chatml": ChatTemplate("chatml (builtin)", CHATML, ("<|im_start|>", "<|im_end|>"), "<|im_end|>"),
    "llama3": ChatTemplate(
        "llama3 (builtin)", LLAMA3, ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), "<|eot_id|>"
    ),
    "chatml-tools": ChatTemplate(
        "chatml-tools (builtin)", CHATML_TOOLS, ("<|im_start|>", "<|im_end|>"), "<|im_end|>"
    ),
}
"""`chatml-tools` (align/models/tool_template.py) also renders tool calls, tool results and `tools`."""


def marks_assistant_turns(text: str) -> bool:
    """Whether a template marks assistant turns (`{% generation %}`), which TRL's `assistant_only_loss`
    needs; every builtin does."""
    return GENERATION.search(text) is not None


def model_template(model: str) -> str | None:
    """The chat template of a model folder, or of a builtin model once it is cached, read without loading
    it; None where it has none or it is not here (a hub id)."""
    cached = cache_root() / "models" / model
    folder = cached if not Path(model).is_absolute() and is_dir(cached) else Path(model)
    return folder_template(folder) if folder.is_absolute() and is_dir(folder) else None


def folder_template(folder: Path) -> str | None:
    """A model folder's own template, from its tokenizer files (None when it has none); of named templates
    (a list in tokenizer_config.json), the `default` one."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text()
    for name in ("chat_template.json", "tokenizer_config.json"):
        try:
            template = json.loads((folder / name).read_text()).get("chat_template")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(template, list):
            named = {
                entry.get("name"): entry.get("template") for entry in template if isinstance(entry, dict)
            }
            template = named.get("default")
        if isinstance(template, str):
            return template
    return None


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


def template_variables(folder: Path) -> dict[str, str]:
    """The special tokens a tokenizer hands its template (`bos_token`, `eos_token`...), read from the
    folder's files, so that a template is rendered here as the tokenizer renders it."""
    found: dict[str, str] = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        try:
            settings = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        for key, value in settings.items() if isinstance(settings, dict) else ():
            value = value.get("content") if isinstance(value, dict) else value
            if key.endswith("_token") and isinstance(value, str):
                found[key] = value
    return found


def checked(text: str, source: str) -> str:
    """`text` when Jinja parses it (jinja2 is light: validate may import it), else the line that fails."""
    import jinja2
    import jinja2.ext

    class Generation(jinja2.ext.Extension):  # transformers' {% generation %}...{% endgeneration %}
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            next(parser.stream)
            return parser.parse_statements(("name:endgeneration",), drop_needle=True)

    try:
        jinja2.Environment(extensions=[Generation, "jinja2.ext.loopcontrols"]).parse(text)
    except jinja2.TemplateSyntaxError as err:
        raise ValueError(
            f"the chat template in {source} does not parse: {err.message} (line {err.lineno})"
        ) from None
    return text


def resolve_template(value: str) -> ChatTemplate:
    """The template `value` names; ValueError, saying what is accepted, when it names none."""
    if value in BUILTIN:
        return BUILTIN[value]
    path = Path(value)
    if is_dir(path):  # answers False for a name the OS refuses (too long), as validate must
        text = folder_template(path)
        if text is None:
            raise ValueError(f"the model folder {value} has no chat template to take")
        special, eos = special_tokens_of(path, text)
        return ChatTemplate(f"from {value}", checked(text, value), special, eos)
    if exists(path) and not is_dir(path):
        text = checked(path.read_text(), value)
        special = tuple(dict.fromkeys(SPECIAL_TOKEN.findall(text)))
        eos = next((token for token in special if token in END_OF_TURN), None)
        return ChatTemplate(value, text, special, eos)
    if path.is_absolute():
        raise ValueError(
            f"there is no file or folder {value}: give a builtin ({', '.join(BUILTIN)}) or a path"
        )
    raise ValueError(
        f"{value!r} is not a builtin chat template ({', '.join(BUILTIN)}), a .jinja file or a model folder"
    )


def pad_note(folder: Path) -> str | None:
    """What `align plan` says when a model folder's tokenizer has no pad token (read from its files):
    `load_tokenizer` pads with its EOS, the one it had before a template changes the EOS. None when it has
    a pad token, or its files do not say."""
    settings: dict[str, Any] = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):
        try:
            found = json.loads((folder / name).read_text())
        except (OSError, ValueError):
            continue
        settings.update(found if isinstance(found, dict) else {})
    eos = settings.get("eos_token")
    eos = eos.get("content") if isinstance(eos, dict) else eos
    if settings.get("pad_token") or not isinstance(eos, str):
        return None
    return f"pad token: {eos}, the model's EOS (it has no pad token; padded positions carry no loss)"


def plan_lines(template: ChatTemplate | None, model: str) -> list[str]:
    """`align plan`'s lines for a stage that reads rows: the template it applies and where it comes from,
    and the pad token when its model (a folder, read without loading it) has none."""
    folder = Path(model) if Path(model).is_absolute() and is_dir(Path(model)) else None
    if template is not None:
        lines = [f"chat template: {template.summary}"]
    elif folder is not None and folder_template(folder) is None:
        lines = ["chat template: none (the model has none; set `chat_template:` for conversational rows)"]
    else:
        lines = ["chat template: the model's own"]
    return lines + [note] if folder is not None and (note := pad_note(folder)) else lines


def apply(template: ChatTemplate, tokenizer: Any) -> Any:
    """`tokenizer` with the template, its special tokens (added when missing) and its EOS; the pad token,
    when there was none, stays the EOS the model had (`load_tokenizer`), so padding never hides an end of
    turn."""
    tokenizer.chat_template = template.text
    missing = [token for token in template.special_tokens if token not in tokenizer.get_vocab()]
    if missing:
        tokenizer.add_special_tokens(
            {"additional_special_tokens": missing}, replace_extra_special_tokens=False
        )
    if template.eos:
        tokenizer.eos_token = template.eos
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def fit_model(model: Any, tokenizer: Any, template: ChatTemplate | None) -> Any:
    """`model` with a row for every token of `tokenizer` (new rows are the mean of the others, as
    transformers resizes) and, when a template is applied here or a tokenizer grew by one upstream, the
    tokenizer's EOS and pad in its config and generation config, so that `generate` in plain transformers
    stops at the end of a turn (TRL's `clone_chat_template` does the same). Otherwise it is left as it is."""
    grown = model.get_input_embeddings().num_embeddings < len(tokenizer)
    if template is None and not grown:
        return model
    if grown:
        model.resize_token_embeddings(len(tokenizer))
    config = model.config.get_text_config()
    config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    generation = getattr(model, "generation_config", None)
    if generation is not None:
        stops = generation.eos_token_id
        stops = [] if stops is None else [stops] if isinstance(stops, int) else list(stops)
        generation.eos_token_id = [tokenizer.eos_token_id, *(s for s in stops if s != tokenizer.eos_token_id)]
        generation.pad_token_id = tokenizer.pad_token_id
    return model


def template_token_ids(template: ChatTemplate | None, tokenizer: Any) -> list[int]:
    """The ids of the template's special tokens: with LoRA their embedding rows train (peft's
    `trainable_token_indices`), since a token the base never saw has only its initial row."""
    if template is None or tokenizer is None:
        return []
    return sorted({tokenizer.convert_tokens_to_ids(token) for token in template.special_tokens})
