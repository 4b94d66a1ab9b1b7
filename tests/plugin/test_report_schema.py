"""The JSON report matches its checked-in schema (pytest_gsm8k/schema/report.schema.json) for
the shapes a run can take: a gated test@1 run, a sampled run compared with a baseline, xdist."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema
import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import GsmRun, output, report


def schema() -> dict[str, Any]:
    text = resources.files("pytest_gsm8k").joinpath("schema/report.schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def test_a_gated_run_and_a_baseline_comparison_match_the_schema(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    gsm8k_run: GsmRun,
) -> None:
    validator = jsonschema.Draft202012Validator(schema())
    server.set_script(Script(behaviours={1: "wrong", 2: "unparsed"}))
    gsm8k_run("--gsm8k-limit=8", "--gsm8k-min-acc=0.5", "--gsm8k-report=r.json", report=None)
    validator.validate(report(pytester))
    assert report(pytester)["gates"][0]["threshold"] == 0.5
    args = ["--gsm8k-limit=8", "--gsm8k-protocol=maj@3", "--gsm8k-report=m.json"]
    gsm8k_run(*args, "--snapshot-update", report=None)
    compared = pytester.runpytest(*gsm8k_args, *args, "--gsm8k-alpha=0.05")
    data = report(pytester, "m.json")
    validator.validate(data)
    assert {g["rule"] for g in data["gates"]} == {"noise-aware"}, output(compared)
    assert any("votes" in p for p in data["problems"])
