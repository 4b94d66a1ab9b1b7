"""JSON text that stays writable: lone surrogates become their escapes."""

from __future__ import annotations

import json

from fakeserver import LONE_SURROGATE

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.html_report import render_html
from pytest_gsm8k.core.jsontext import escape_surrogates, to_json
from pytest_gsm8k.core.scrub import printable


def test_surrogates_are_written_as_their_escapes_everywhere() -> None:
    text = f"a{LONE_SURROGATE}b \u00e9 \U0001f600"
    assert json.loads(to_json({"t": text})) == {"t": text}
    assert to_json({"t": text}).encode("utf-8")  # encodable
    assert escape_surrogates(text) == "a\\ud83db \u00e9 \U0001f600"
    assert escape_surrogates("plain") == "plain"
    assert printable(f"model{LONE_SURROGATE}\x1b[31m") == "model\\ud83d"
    report_json = {"problems": [{"id": "test-0001", "response": text, "index": 1}]}
    assert "\\ud83d" in render_html(report_json).encode("utf-8").decode("utf-8")
    stored = bl.dumps({"model": "m", "reported_models": [f"m{LONE_SURROGATE}"]})
    assert json.loads(stored)["reported_models"] == [f"m{LONE_SURROGATE}"]
