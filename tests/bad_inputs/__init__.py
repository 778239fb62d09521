"""The bad-input corpus (issue 34): malformed pipelines, data files, models and command lines, each a
`Case`. Each module here holds one category's `CASES`; tests/test_bad_inputs.py runs them all in-process,
without Ray and without training, and holds each to the front door's standard: exit code 2, a few lines,
the YAML path or file:line named, and no traceback."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Case:
    """One bad input.

    `argv`: the command line after `align`; `{pipeline}` stands for the written pipeline file and `{dir}`
    for the case's folder (the working directory while it runs). `pipeline`: the YAML text written to
    `{dir}/pipeline.yaml` (None: no file). `files`: more files, by path relative to `{dir}`, with their
    text. `expect`: what the error output must contain (the YAML path or file:line, and the gist).
    `lines`: the most lines the output may take."""

    name: str
    argv: tuple[str, ...] = ("validate", "{pipeline}")
    pipeline: str | None = None
    files: dict[str, str] = field(default_factory=dict)
    expect: tuple[str, ...] = ()
    code: int = 2
    lines: int = 8


def pipeline(stages: str, header: str = "name: bad\nbase_model: tiny\n") -> str:
    """A pipeline file's text: `header`, then `stages:` with the indented block `stages` under it."""
    indented = "".join(f"  {line}\n" for line in stages.strip("\n").splitlines())
    return f"{header}stages:\n{indented}"
