"""What the configuration reference says about one key of the pipeline file: its type, the values it
allows, its default and its description, all read from the pydantic spec (align/config/) itself.

A key's description is its docstring (the string under the field); else its note in
scripts/docs_field_notes.yaml, which holds what the code does not say yet; else the comment on its line;
else the docstring of the block it holds. Nothing here imports torch or TRL.
"""

from __future__ import annotations

import ast
import enum
import inspect
import io
import json
import textwrap
import tokenize
import types
import typing
from functools import cache
from pathlib import Path
from typing import Any, Literal

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

NOTES = Path(__file__).with_name("docs_field_notes.yaml")
CONSTRAINTS = {
    annotated_types.Gt: ("gt", "> {}"),
    annotated_types.Ge: ("ge", "≥ {}"),
    annotated_types.Lt: ("lt", "< {}"),
    annotated_types.Le: ("le", "≤ {}"),
    annotated_types.MultipleOf: ("multiple_of", "a multiple of {}"),
    annotated_types.MinLen: ("min_length", "at least {} item(s)"),
}
"""pydantic's constraint metadata and how the reference words each."""


@cache
def notes() -> dict[str, str]:
    """`Class.key: description` for keys whose class does not describe them yet."""
    return yaml.safe_load(NOTES.read_text(encoding="utf-8")) or {}


@cache
def source_docs(cls: type) -> dict[str, tuple[str, str]]:
    """Each key a class itself declares, with its docstring and its line's comment ("" where absent)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    comments = {
        token.start[0]: token.string.lstrip("#").strip()
        for token in tokenize.generate_tokens(io.StringIO(source).readline)
        if token.type == tokenize.COMMENT
    }
    body = ast.parse(source).body[0].body
    found = {}
    for node, after in zip(body, [*body[1:], None], strict=True):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        docstring = ""
        if isinstance(after, ast.Expr) and isinstance(getattr(after, "value", None), ast.Constant):
            docstring = inspect.cleandoc(str(after.value.value))
        found[node.target.id] = (docstring, comments.get(node.end_lineno, ""))
    return found


def owner(cls: type[BaseModel], key: str) -> type:
    """The class of `cls`'s MRO that declares `key`."""
    return next(c for c in cls.__mro__ if key in vars(c).get("__annotations__", {}))


def code_words(cls: type[BaseModel], key: str) -> tuple[str, str]:
    """(docstring, line comment) of `key` where it is declared."""
    return source_docs(owner(cls, key)).get(key, ("", ""))


def note_key(cls: type[BaseModel], key: str) -> str:
    """The notes file's key for a field: the class that declares it, then the key."""
    return f"{owner(cls, key).__name__}.{key}"


def sentence(text: str) -> str:
    """A line comment as a sentence: capitalised, with its full stop."""
    text = text.strip()
    return f"{text[0].upper()}{text[1:]}{'' if text.endswith('.') else '.'}" if text else ""


def description(cls: type[BaseModel], key: str) -> str:
    """What the reference says a key is for: its docstring, else its note, else its line comment, else
    the docstring of the block it holds."""
    docstring, comment = code_words(cls, key)
    if docstring:
        return docstring
    if note := notes().get(note_key(cls, key)):
        return note
    if comment:
        return sentence(comment)
    blocks = [model for model, _ in models_in(cls.model_fields[key].annotation) if model.__doc__]
    return inspect.cleandoc(blocks[0].__doc__ or "") if blocks else ""


def models_in(annotation: Any, in_list: bool = False) -> list[tuple[type[BaseModel], bool]]:
    """The pydantic blocks a field's type holds (through Optional, lists, dicts and Annotated), each with
    whether it is an item of a list (`rewards[]`)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [(annotation, in_list)]
    found: list[tuple[type[BaseModel], bool]] = []
    listed = in_list or typing.get_origin(annotation) is list
    for arg in typing.get_args(annotation):
        if not isinstance(arg, str | int | float | FieldInfo) and arg is not None:
            found += [item for item in models_in(arg, listed) if item not in found]
    return found


def constraint_words(metadata: list[Any]) -> list[str]:
    """`[Gt(gt=0)]` -> `["> 0"]`; a regex pattern is quoted."""
    words = []
    for item in metadata:
        if type(item) in CONSTRAINTS:
            attribute, form = CONSTRAINTS[type(item)]
            words.append(form.format(getattr(item, attribute)))
        elif isinstance(item, FieldInfo):
            words += constraint_words(item.metadata)
        elif getattr(item, "pattern", None):
            words.append(f"matches `{item.pattern}`")
    return words


def type_words(annotation: Any, link: typing.Callable[[type[BaseModel]], str]) -> tuple[str, list[str]]:
    """A field's type as the reference writes it, and the values it allows (literals and constraints)."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null", []
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return link(annotation), []
    if origin is typing.Annotated:
        inner, allowed = type_words(args[0], link)
        return inner, allowed + constraint_words(list(args[1:]))
    if origin is Literal:
        return "string" if all(isinstance(a, str) for a in args) else "value", [f"`{a}`" for a in args]
    if isinstance(annotation, type) and issubclass(annotation, enum.StrEnum):  # written as its values
        return "string", [f"`{member}`" for member in annotation]
    if origin in (typing.Union, types.UnionType):
        parts = [type_words(arg, link) for arg in args]
        names = list(dict.fromkeys(name for name, _ in parts))
        return " or ".join(names), [word for _, allowed in parts for word in allowed]
    if origin is list:
        inner, allowed = type_words(args[0], link) if args else ("any", [])
        return f"list of {inner}", allowed
    if origin is dict:
        key, _ = type_words(args[0], link) if args else ("any", [])
        value, allowed = type_words(args[1], link) if args else ("any", [])
        return f"map of {key} to {value}", allowed
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Any: "any"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation))), []


def field_type(field: FieldInfo, link: typing.Callable[[type[BaseModel]], str]) -> tuple[str, str]:
    """(type, allowed values) of a field, its own constraints included."""
    name, allowed = type_words(field.annotation, link)
    allowed += constraint_words(field.metadata)
    return name, ", ".join(dict.fromkeys(allowed))


def default_words(field: FieldInfo) -> str:
    """A field's default as YAML would write it; a block's default is its own keys' defaults."""
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return "its keys' defaults" if isinstance(value, BaseModel) else yaml_value(value)


def yaml_value(value: Any) -> str:
    """A value as YAML writes it, in code: `null`, `true`, `auto`, `["a", "b"]`."""
    if value is None or isinstance(value, bool | list | dict):
        return f"`{json.dumps(value)}`"
    return f"`{value}`"
