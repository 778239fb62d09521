"""The bad-input corpus (tests/bad_inputs/): every case exits 2 in at most a few lines that name the YAML
path or file:line, with no traceback, and without Ray or training (each runs `align` in-process)."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

import pytest

import tests.bad_inputs as corpus
from align.cli import main
from tests.bad_inputs import Case


def all_cases() -> list[Case]:
    found = []
    for module in pkgutil.iter_modules(corpus.__path__):
        found += importlib.import_module(f"{corpus.__name__}.{module.name}").CASES
    return found


CASES = all_cases()


def test_the_corpus_is_large_and_named_uniquely() -> None:
    names = [case.name for case in CASES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert len(CASES) >= 120


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_bad_input_gets_one_clear_answer(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for relative, text in case.files.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(text, encoding="utf-8")
    if case.pipeline is not None:
        (tmp_path / "pipeline.yaml").write_text(case.pipeline, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    argv = [arg.replace("{pipeline}", "pipeline.yaml").replace("{dir}", str(tmp_path)) for arg in case.argv]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's own usage errors
        code = exit_.code
    out, err = capsys.readouterr()
    said = out + err
    assert code == case.code, said
    assert "Traceback" not in said
    assert len(err.strip().splitlines()) <= case.lines, err
    for expected in case.expect:
        assert expected in said, f"expected {expected!r} in:\n{said}"
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized()
