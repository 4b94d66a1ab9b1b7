"""Deeply nested JSON from outside (a data file, a --gsm8k-param value, a baseline) in a run
is one line naming where it came from, never a RecursionError and an INTERNALERROR."""

from __future__ import annotations

import json

import pytest
from fakeserver import FakeOpenAIServer
from helpers import GsmRun, output

#: far past the interpreter's recursion limit: json.loads alone raises RecursionError
ABYSS = 100_000


ROW = {"question": "Two plus two?", "answer": "2 + 2 = 4\n#### 4"}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_a_deep_data_file_is_a_usage_error(pytester: pytest.Pytester) -> None:
    data = pytester.path / "deep.jsonl"
    data.write_text(json.dumps(ROW) + "\n" + nested(ABYSS) + "\n", encoding="utf-8")
    result = pytester.runpytest("--gsm8k-model=m", f"--gsm8k-data={data}")
    text = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert f"ERROR: gsm8k: {data}:2: JSON nested deeper than 64 levels" in text
    assert "INTERNALERROR" not in text
    assert "Traceback" not in text


@pytest.mark.parametrize("where", ["option", "ini"])
def test_a_deep_param_is_a_usage_error(pytester: pytest.Pytester, where: str) -> None:
    value = f"x={nested(ABYSS)}"
    if where == "ini":
        pytester.makeini(f"[pytest]\ngsm8k_param = {value}\n")
        result = pytester.runpytest("--gsm8k-model=m")
    else:
        result = pytester.runpytest("--gsm8k-model=m", f"--gsm8k-param={value}")
    text = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text[-2000:]
    assert "ERROR: gsm8k: --gsm8k-param x: JSON nested deeper than 64 levels" in text
    assert "INTERNALERROR" not in text
    assert "Traceback" not in text


def test_a_deep_baseline_fails_its_gate_after_the_run(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    path = pytester.path / "deep.gsm8k"
    path.write_text(
        '{"kind": "pytest-gsm8k baseline", "schema": 1, "x": ' + nested(ABYSS) + "}",
        encoding="utf-8",
    )
    result, _ = gsm8k_run(
        "--gsm8k-limit=3",
        "--gsm8k-baseline=deep.gsm8k",
        "--gsm8k-early-stop=certain",
        "--gsm8k-min-acc=0.5",
        "--gsm8k-html=page.html",
        ret=1,
        report=None,
    )
    text = output(result)
    result.stdout.fnmatch_lines(
        [
            "*gsm8k acc (test@1, 0-shot CoT) = 1.0000*",
            "*gate baseline: FAIL: deep.gsm8k: corrupt baseline (JSON nested deeper than 64 *",
        ]
    )
    assert "INTERNALERROR" not in text
    assert "Traceback" not in text
    assert (pytester.path / "page.html").is_file()
