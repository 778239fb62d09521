"""CSV and TSV files: read through `datasets`' csv builder with every cell as text, and checked row by row
by the scan with the line numbers an editor shows (the header is line 1; a record spanning lines is at its
first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from align.data.loading import load_data
from align.data.scan import check_data
from align.errors import DataError

ROWS = 'prompt,completion\nWhat is 6*7?,42\n"Two\nlines",None\nSay NA,NA\n'


def test_a_csv_and_a_tsv_load_as_text(tmp_path: Path) -> None:
    data = tmp_path / "rows.csv"
    data.write_text(ROWS)
    assert check_data(str(data), "sft", "d") is None
    rows = load_data(str(data), "sft", "d")
    # pandas alone would read 42 as the number 42.0, and None and NA as missing values
    assert rows["completion"] == ["42", "None", "NA"] and rows["prompt"][1] == "Two\nlines"
    tsv = tmp_path / "rows.tsv"
    tsv.write_text("question\tanswer\nWhat is 6*7?\t42\nA, B or C?\tB\n")
    renames = {"question": "prompt", "answer": "completion"}
    assert check_data(str(tsv), "sft", "d", renames) is None
    assert load_data(str(tsv), "sft", "d", renames)[1] == {"prompt": "A, B or C?", "completion": "B"}


def test_a_row_missing_a_value_is_refused_naming_its_line(tmp_path: Path) -> None:
    data = tmp_path / "rows.csv"
    data.write_text(ROWS + "No answer,\n")  # lines: header 1, 2, 3-4 (a quoted line break), 5, then 6
    assert check_data(str(data), "sft", "d") == (
        f"{data} line 6 lacks 'completion'; each row of sft data needs one of: messages, text, "
        "prompt+completion"
    )
    short = tmp_path / "short.csv"
    short.write_text("prompt,completion\nHi,Hello\nOnly a prompt\n")
    assert check_data(str(short), "sft", "d").startswith(f"{short} line 3 lacks 'completion'")


def test_a_line_with_more_values_than_columns_ends_the_check_at_its_line(tmp_path: Path) -> None:
    data = tmp_path / "rows.csv"
    data.write_text("prompt,completion\nHi,Hello\nOne, two,three\n")
    message = "line 3 has 3 values where line 1 names 2 columns; quote a value that holds the delimiter"
    assert check_data(str(data), "sft", "d").startswith(f"{data} {message}")
    with pytest.raises(DataError, match=f"stages.sft.data.train: {data} {message}"):
        load_data(str(data), "sft", "stages.sft.data.train")  # a file loaded without validate names it too


def test_a_header_without_the_columns_is_refused_before_any_row(tmp_path: Path) -> None:
    data = tmp_path / "rows.csv"
    data.write_text("question,response\nHi,Hello\n")
    problem = check_data(str(data), "sft", "d")
    assert problem.startswith(
        f"{data} lacks column 'messages' that sft data needs (it has: question, response)"
    )
    assert problem.endswith("rename them: data: {columns: {question: prompt, response: completion}}")
