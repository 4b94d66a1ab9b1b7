"""JSON text in and out: deeply nested JSON from outside (a baseline file, a --gsm8k-param
value, a data row) is refused by the depth-capped reader with one line naming where it came
from, never a RecursionError; JSON text written stays writable: lone surrogates become their
escapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakeserver import LONE_SURROGATE

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core import jsontext
from pytest_gsm8k.core.dataset import DatasetError, parse_jsonl
from pytest_gsm8k.core.html_report import render_html
from pytest_gsm8k.core.jsontext import escape_surrogates, to_json
from pytest_gsm8k.core.scrub import printable
from pytest_gsm8k.core.settings import SettingsError, parse_params

#: far past the interpreter's recursion limit: json.loads alone raises RecursionError
ABYSS = 100_000
ROW = {"question": "Two plus two?", "answer": "2 + 2 = 4\n#### 4"}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_the_cap_is_exact_and_deep_text_is_refused() -> None:
    assert jsontext.loads(nested(jsontext.MAX_DEPTH)) is not None
    brackets_in_a_string = '{"a": [1, {"b": "[[[[[[[[[[[[[[[[[[["}]}'
    assert jsontext.loads(brackets_in_a_string) == {"a": [1, {"b": "[" * 19}]}
    for depth in (jsontext.MAX_DEPTH + 1, 900, ABYSS):
        with pytest.raises(jsontext.TooDeep, match="nested deeper than 64 levels"):
            jsontext.loads(nested(depth))
    with pytest.raises(json.JSONDecodeError):
        jsontext.loads("[1,")


def test_a_deep_data_row_names_the_file_and_line(tmp_path: Path) -> None:
    lines = [json.dumps(ROW).encode(), json.dumps({**ROW, "meta": "X"}).encode()]
    lines[1] = lines[1].replace(b'"X"', nested(ABYSS).encode())
    with pytest.raises(DatasetError, match=r"^rows\.jsonl:2: JSON nested deeper than 64 levels$"):
        parse_jsonl(lines, "test", "rows.jsonl")


def test_a_deep_param_names_the_option() -> None:
    with pytest.raises(SettingsError, match=r"^--gsm8k-param x: JSON nested deeper than 64"):
        parse_params([f"x={nested(ABYSS)}"])
    with pytest.raises(SettingsError, match=r"^--gsm8k-param x: JSON nested deeper than 64"):
        parse_params([f"x={nested(100)}"])
    assert parse_params(["x=[[1]]", "y=[[1"]) == (("x", "[[1]]"), ("y", '"[[1"'))


def test_a_deep_baseline_is_corrupt() -> None:
    text = '{"kind": "pytest-gsm8k baseline", "schema": 1, "x": ' + nested(ABYSS) + "}"
    with pytest.raises(bl.BaselineError, match=r"^b\.gsm8k: corrupt baseline \(JSON nested deeper"):
        bl.loads(text, "b.gsm8k")


def test_surrogates_are_written_as_their_escapes_everywhere() -> None:
    text = f"a{LONE_SURROGATE}b \u00e9 \U0001f600"
    assert json.loads(to_json({"t": text})) == {"t": text}
    assert to_json({"t": text}).encode("utf-8")  # encodable
    assert escape_surrogates(text) == "a\\ud83db \u00e9 \U0001f600"
    assert escape_surrogates("plain") == "plain"
    assert printable(f"model{LONE_SURROGATE}\x1b[31m") == "model\\ud83d"
    report_json = {"problems": [{"id": "test-0001", "response": text, "index": 1}]}
    assert "\\ud83d" in render_html(report_json, {}, {}).encode("utf-8").decode("utf-8")
    stored = bl.dumps({"model": "m", "reported_models": [f"m{LONE_SURROGATE}"]})
    assert json.loads(stored)["reported_models"] == [f"m{LONE_SURROGATE}"]
