"""mkdocs hooks (mkdocs.yml `hooks:`): the reference pages written from the code at every build, so they
cannot drift from it, and the stage kinds' table put where docs/stages/index.md asks for it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # mkdocs loads this file by path; `scripts.` and `align.` import from the root
    sys.path.insert(0, str(ROOT))

from mkdocs.structure.files import File, Files  # noqa: E402

from scripts.docs_pages import cli_page, configuration_page, kinds_table  # noqa: E402

KINDS_MARK = "<!-- stage kinds: generated -->"
GENERATED_PAGES = {"reference/configuration.md": configuration_page, "reference/cli.md": cli_page}


def on_files(files: Files, config) -> Files:
    for path, page in GENERATED_PAGES.items():
        files.append(File.generated(config, path, content=page()))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    return markdown.replace(KINDS_MARK, kinds_table()) if KINDS_MARK in markdown else markdown
