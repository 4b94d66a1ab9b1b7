"""``python -m pytest_gsm8k compare`` on JSON reports the suite's own runs wrote (the
scripted server behind them): a worse run exits 1 with its flips listed, an identical one
exits 0, reports of different protocols are refused in one line with exit 2."""

from __future__ import annotations

import sys

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import report

LIMIT = "--gsm8k-limit=20"


def compare(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """The command, as a user runs it, in the runs' folder."""
    return pytester.run(sys.executable, "-m", "pytest_gsm8k", "compare", *args)


@pytest.fixture
def first(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> list[int]:
    """a.json: an all-correct run of 20 problems; its problems' indices."""
    result = pytester.runpytest(*gsm8k_args, LIMIT, "--gsm8k-report=a.json")
    assert result.ret == 0, result.stdout.str()
    return [p["index"] for p in report(pytester, "a.json")["problems"]]


def test_a_worse_run_exits_1_with_its_flips_listed(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], first: list[int]
) -> None:
    flipped = first[3:9]
    server.set_script(Script(behaviours={i: "wrong" for i in flipped}))
    # the second run under xdist: its report is the same kind of report
    result = pytester.runpytest(
        *gsm8k_args, "-n", "2", LIMIT, "--gsm8k-no-cache", "--gsm8k-report=b.json"
    )
    assert result.ret == 0, result.stdout.str()  # no gate in the run itself
    shown = compare(pytester, "a.json", "b.json")
    text = shown.stdout.str()
    assert shown.ret == 1, text + shown.stderr.str()
    assert shown.stderr.str() == ""
    lines = text.splitlines()
    assert lines[0] == "### gsm8k compare (test@1, 0-shot CoT): B 0.7000 vs A 1.0000 on 20 problems"
    assert "Paired on the 20 problems both reports hold (A holds 20, B holds 20)." in lines
    end = (
        "; 6 newly failing, 0 newly passing; one-sided p=0.01562 (B worse than A; the gate's test)."
    )
    assert any(
        line.startswith("Difference B - A: -0.3000 [95% CI ") and line.endswith(end)
        for line in lines
    ), text
    assert any(
        line.startswith(
            "| compare | FAIL | p=0.0156 \\< --alpha 0.05 (exact McNemar): 6 newly failing, 0 "
            "newly passing"
        )
        for line in lines
    )
    assert "**Newly failing in B (6):**" in lines
    listed = [line for line in lines if line.startswith("- `test-")]
    assert [line[3:12] for line in listed] == [f"test-{i:04d}" for i in sorted(flipped)]
    assert all(len(line) > len("- `test-0000`: ") + 20 for line in listed)  # with the question

    lenient = compare(pytester, "a.json", "b.json", "--alpha", "0.01")
    assert lenient.ret == 0
    lenient.stdout.fnmatch_lines(["| compare | PASS | p=0.0156 \\>= --alpha 0.01 (exact McNemar)*"])
    better = compare(pytester, "b.json", "a.json")
    assert better.ret == 0
    better.stdout.fnmatch_lines(["**Newly passing in B (6):**"])


def test_identical_runs_exit_0(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], first: list[int]
) -> None:
    result = pytester.runpytest(*gsm8k_args, LIMIT, "--gsm8k-no-cache", "--gsm8k-report=b.json")
    assert result.ret == 0
    shown = compare(pytester, "a.json", "b.json")
    assert shown.ret == 0, shown.stdout.str() + shown.stderr.str()
    shown.stdout.fnmatch_lines(
        [
            "### gsm8k compare (test@1, 0-shot CoT): B 1.0000 vs A 1.0000 on 20 problems",
            "*; 0 newly failing, 0 newly passing; one-sided p=1 (B worse than A; the gate's test).",
            "| compare | PASS | p=1 \\>= --alpha 0.05 (exact McNemar): 0 newly failing, 0 newly "
            "passing; diff +0.00 points *",
        ]
    )
    assert "Newly" not in shown.stdout.str()


def test_a_subset_is_compared_on_the_ids_both_hold(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], first: list[int]
) -> None:
    result = pytester.runpytest(*gsm8k_args, "--gsm8k-limit=5", "--gsm8k-report=b.json")
    assert result.ret == 0
    shown = compare(pytester, "a.json", "b.json")
    assert shown.ret == 0
    shown.stdout.fnmatch_lines(
        ["Paired on the 5 problems both reports hold (A holds 20, B holds 5; 15 only in A)."]
    )


def test_reports_of_different_protocols_are_refused(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], first: list[int]
) -> None:
    result = pytester.runpytest(
        *gsm8k_args, LIMIT, "--gsm8k-max-tokens=512", "--gsm8k-report=c.json"
    )
    assert result.ret == 0
    shown = compare(pytester, "a.json", "c.json")
    assert shown.ret == 2
    assert shown.stdout.str() == ""
    assert shown.stderr.lines == [
        "gsm8k: refused to compare a.json with c.json: protocol max_tokens is 512 in B (c.json) "
        "but 1024 in A (a.json)"
    ]


def test_a_missing_file_or_a_bad_alpha_is_refused(
    pytester: pytest.Pytester, first: list[int]
) -> None:
    missing = compare(pytester, "a.json", "nowhere.json")
    assert missing.ret == 2
    assert missing.stderr.lines == [
        "gsm8k: nowhere.json: cannot read it (No such file or directory)"
    ]
    bad = compare(pytester, "a.json", "a.json", "--alpha", "1.5")
    assert bad.ret == 2
    assert "--alpha: must be between 0 and 1 (exclusive), got 1.5" in bad.stderr.str()
