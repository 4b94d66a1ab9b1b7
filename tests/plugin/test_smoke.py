"""A first end-to-end check: the plugin in a pytester directory against the scripted server."""

from __future__ import annotations

import json

import pytest
from fakeserver import FakeOpenAIServer, Script


def test_limit_run_reports_scripted_accuracy(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    wrong = {0, 3, 7}
    server.set_script(Script(behaviours={i: "wrong" for i in wrong}))
    result = pytester.runpytest(*gsm8k_args, "--gsm8k-limit=40", "--gsm8k-report=r.json")
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["n"] == 40
    marked = {p["index"] for p in report["problems"] if p["outcome"] == "wrong"}
    assert marked == wrong & {p["index"] for p in report["problems"]}
    assert report["correct"] == 40 - len(marked)
    result.stdout.fnmatch_lines([f"gsm8k acc (test@1, 0-shot CoT) = {report['accuracy']:.4f}*n=40"])
    assert result.ret == 0
