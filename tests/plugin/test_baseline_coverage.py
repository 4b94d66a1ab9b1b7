"""Which problems a baseline holds: a partial run never replaces a whole baseline, a baseline
that holds fewer problems than the run says so, and a hand-trimmed one is refused by name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import XDIST, GsmRun, made_once, output, report

from pytest_gsm8k.core import baseline as bl

LIMIT = "--gsm8k-limit=100"
BASELINE = Path("__snapshots__") / "gsm8k" / "test@1_0-shot_CoT.gsm8k"
TWO = "test-0082 or test-0112"  # two problems of the limit-100 subset (seed 1234)


@pytest.fixture
def recorded(pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun) -> str:
    """A baseline recorded from an all-correct run of the 100-problem subset (once per
    process); its text."""

    def record() -> None:
        result, _ = gsm8k_run(LIMIT, "--snapshot-update", report=None, xdist=())
        result.stdout.fnmatch_lines([f"*baseline written: {BASELINE} (n=100, accuracy 1.0000)*"])

    made_once("coverage baseline", pytester.path, [BASELINE], record)
    return (pytester.path / BASELINE).read_text()


def _gate_lines(result: pytest.RunResult) -> list[str]:
    return [line for line in result.outlines if "gate baseline:" in line]


def test_a_deselected_run_does_not_replace_the_baseline(
    pytester: pytest.Pytester,
    recorded: str,
    gsm8k_run: GsmRun,
    server: FakeOpenAIServer,
) -> None:
    server.set_script(Script(default="wrong"))
    result, _ = gsm8k_run(
        LIMIT, "--gsm8k-no-cache", "-k", TWO, "--snapshot-update", ret=1, report=None
    )
    text = output(result)
    (line,) = _gate_lines(result)
    assert f"FAIL: not written to {BASELINE}: 98 of the 100 problems of its selection were " in line
    assert "deselected (-k)" in line
    assert "--gsm8k-baseline-partial" in line
    assert "baseline written" not in text
    assert "Traceback" not in text
    assert (pytester.path / BASELINE).read_text() == recorded
    # the all-wrong model is still measured against the whole baseline
    result, _ = gsm8k_run(LIMIT, "--gsm8k-no-cache", "--gsm8k-require-baseline", ret=1, report=None)
    result.stdout.fnmatch_lines(["*1.0000 -> 0.0000 on 100 problems*", "*gate baseline: FAIL*"])


def test_a_last_failed_run_does_not_replace_the_baseline(
    pytester: pytest.Pytester,
    recorded: str,
    gsm8k_run: GsmRun,
    server: FakeOpenAIServer,
) -> None:
    server.set_script(Script(behaviours={82: "error500", 112: "error500"}))
    args = [LIMIT, "--gsm8k-no-cache", "--gsm8k-max-retries=0"]
    gsm8k_run(*args, ret=1, report=None)  # two errors: --lf's last failures
    server.set_script(Script(default="wrong"))
    result, _ = gsm8k_run(*args, "--lf", "--snapshot-update", ret=1, report=None)
    (line,) = _gate_lines(result)
    assert "98 of the 100 problems of its selection were deselected (--lf)" in line
    assert (pytester.path / BASELINE).read_text() == recorded


def test_a_smaller_limit_does_not_replace_a_larger_baseline(
    pytester: pytest.Pytester, recorded: str, gsm8k_run: GsmRun, server: FakeOpenAIServer
) -> None:
    result, _ = gsm8k_run("--gsm8k-limit=20", "--snapshot-update", ret=1, report=None)
    (line,) = _gate_lines(result)
    assert f"FAIL: not written to {BASELINE}: it holds 80 problems this run does not have" in line
    assert "delete it" in line
    assert "--gsm8k-baseline-partial" in line
    assert (pytester.path / BASELINE).read_text() == recorded
    # a larger limit extends it
    result, _ = gsm8k_run("--gsm8k-limit=120", "--snapshot-update", report=None)
    result.stdout.fnmatch_lines([f"*baseline written: {BASELINE} (n=120, accuracy 1.0000)*"])


def test_a_smaller_baseline_than_the_run_says_so_and_fails_when_required(
    pytester: pytest.Pytester, recorded: str, gsm8k_run: GsmRun, server: FakeOpenAIServer
) -> None:
    forced, _ = gsm8k_run(
        "--gsm8k-limit=20", "--snapshot-update", "--gsm8k-baseline-partial", report=None
    )
    forced.stdout.fnmatch_lines([f"*baseline written: {BASELINE} (n=20, accuracy 1.0000)*"])
    stored = bl.loads((pytester.path / BASELINE).read_text(), "b")
    assert "partial" not in stored  # the whole of its own selection (limit 20)
    result, _ = gsm8k_run(LIMIT, report=None)
    result.stdout.fnmatch_lines(
        [f"*baseline: {BASELINE} covers 20 of this run's 100 problems: 80 are not in it*"]
    )
    result, _ = gsm8k_run(LIMIT, "--gsm8k-require-baseline", ret=1, report=None)
    (line,) = _gate_lines(result)
    assert "FAIL" in line
    assert "covers 20 of this run's 100 problems: 80 are not in it" in line
    assert "--gsm8k-require-baseline needs every problem of the run" in line


def test_a_partial_baseline_is_written_only_when_asked_and_says_so(
    pytester: pytest.Pytester,
    recorded: str,
    gsm8k_run: GsmRun,
    server: FakeOpenAIServer,
) -> None:
    server.set_script(Script(default="wrong"))
    args = [LIMIT, "--gsm8k-no-cache"]
    result, _ = gsm8k_run(
        *args,
        "-k",
        TWO,
        "--snapshot-update",
        "--gsm8k-baseline-partial",
        "--gsm8k-report=r.json",
        report=None,
    )
    result.stdout.fnmatch_lines(
        [f"*baseline written: {BASELINE} (n=2 of the 100 of its selection, partial*"]
    )
    stored = bl.loads((pytester.path / BASELINE).read_text(), "b")
    assert stored["partial"]["ids"] == ["test-0082", "test-0112"]
    assert stored["partial"]["of"] == 100
    assert "-k" in stored["partial"]["reason"]
    assert report(pytester)["baseline"]["partial"] is True
    # the whole selection against it: said; compared on its two problems (both wrong in it)
    # the gate could not fail, which is no verdict (rule 2); --gsm8k-require-baseline: a FAIL
    result, _ = gsm8k_run(*args, ret=1, report=None)
    result.stdout.fnmatch_lines(
        [f"*baseline: {BASELINE} covers 2 of this run's 100 problems: 98 are not in it*"]
    )
    (line,) = _gate_lines(result)
    assert "FAIL: not a verdict: the smallest p 2 problems can give (every answer wrong)" in line
    result, _ = gsm8k_run(*args, "--gsm8k-require-baseline", ret=1, report=None)
    (line,) = _gate_lines(result)
    assert "FAIL" in line
    assert "covers 2 of this run's 100 problems: 98 are not in it" in line


def _trim(path: Path, keep: list[str], extra: dict[str, Any]) -> None:
    """Keep a few problems, marked wrong, and the extra ones; n and accuracy edited to match
    (a file an all-wrong model would pass against)."""
    data = json.loads(path.read_text())
    problems = dict.fromkeys(keep, "wrong") | extra
    data["problems"] = problems
    data["n"] = len(problems)
    data["accuracy"] = sum(v == "correct" for v in problems.values()) / len(problems)
    path.write_text(bl.dumps(data))


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (
            {"test-9998": "wrong", "test-9999": "wrong"},
            "2 problem ids are not in the test split: test-9998, test-9999",
        ),
        ({}, "its 3 problems are not the 100 of its selection (limit 100, seed 1234: 97 missing"),
    ],
    ids=["unknown-ids", "trimmed"],
)
def test_a_hand_trimmed_baseline_is_refused_by_name(
    pytester: pytest.Pytester,
    recorded: str,
    gsm8k_run: GsmRun,
    server: FakeOpenAIServer,
    extra: dict[str, Any],
    needle: str,
) -> None:
    _trim(pytester.path / BASELINE, ["test-0082", "test-0112", "test-0015"], extra)
    server.set_script(Script(default="wrong"))
    result, _ = gsm8k_run(LIMIT, "--gsm8k-no-cache", "--gsm8k-require-baseline", ret=1, report=None)
    text = output(result)
    (line,) = _gate_lines(result)
    assert f"FAIL: {BASELINE}: " in line, line
    assert needle in line, line
    assert "Traceback" not in text


def test_an_early_stopped_run_writes_a_partial_baseline_only_when_asked(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    server.set_script(Script(default="wrong"))
    args = [LIMIT, "--gsm8k-min-acc=0.85", "--gsm8k-early-stop=certain"]
    result, _ = gsm8k_run(*args, "--snapshot-update", ret=1, report=None)
    (line,) = _gate_lines(result)
    assert "not written" in line
    assert "the run stopped early" in line
    assert "--gsm8k-baseline-partial" in line
    assert not (pytester.path / BASELINE).exists()
    gsm8k_run(
        *args, "--snapshot-update", "--gsm8k-baseline-partial", ret=1, report=None
    )  # min-acc FAIL (decided early); the baseline is written
    stored = bl.loads((pytester.path / BASELINE).read_text(), "b")
    assert "stopped early" in stored["partial"]["reason"]
    assert len(stored["problems"]) < 100
    assert stored["partial"]["of"] == 100


def test_an_early_stop_never_turns_a_failed_baseline_gate_into_a_pass(
    pytester: pytest.Pytester,
    recorded: str,
    gsm8k_args: list[str],
    gsm8k_run: GsmRun,
    server: FakeOpenAIServer,
) -> None:
    """min-acc decides early (PASS); a baseline gate that failed for another reason (no
    baseline, one that does not cover the run) stays FAIL."""
    args = ["--gsm8k-min-acc=0.5", "--gsm8k-early-stop=certain"]
    missing, _ = gsm8k_run(
        *args,
        LIMIT,
        "--gsm8k-require-baseline",
        "--gsm8k-baseline=nowhere.gsm8k",
        ret=1,
        report=None,
    )
    (line,) = _gate_lines(missing)
    assert "FAIL: no baseline at nowhere.gsm8k" in line
    assert (
        pytester.runpytest(
            *gsm8k_args, LIMIT, "-k", TWO, "--snapshot-update", "--gsm8k-baseline-partial"
        ).ret
        == 0
    )
    uncovered, _ = gsm8k_run(*args, LIMIT, "--gsm8k-require-baseline", ret=1, report=None)
    (line,) = _gate_lines(uncovered)
    assert "FAIL" in line
    assert "are not in it" in line


@XDIST
def test_no_gate_passes_on_a_last_failed_rerun_after_a_hiccup(
    pytester: pytest.Pytester,
    recorded: str,
    gsm8k_run: GsmRun,
    server: FakeOpenAIServer,
) -> None:
    """Two problems fail on a transient 500 and the run FAILs its floor; `--lf` once the
    hiccup is over reruns exactly those two, which now pass: neither min-acc nor the baseline
    may PASS on them (it once did, exit 0). What ran is still shown."""
    server.set_script(Script(behaviours={82: "error500", 112: "error500"}))
    args = [LIMIT, "--gsm8k-no-cache", "--gsm8k-max-retries=0"]
    # the set-up (the hiccup) and the follow-up without --lf: plain under -n 2 too (what
    # crosses processes is the rerun's deselection, made by the workers)
    gsm8k_run(*args, "--gsm8k-min-acc=0.99", ret=1, report=None, xdist=())
    server.set_script(Script())
    result, _ = gsm8k_run(*args, "--gsm8k-min-acc=0.99", "--lf", ret=1, report=None)
    text = output(result)
    for gate in ("min-acc", "baseline"):
        (line,) = [line for line in result.outlines if f"gate {gate}:" in line]
        assert f"gate {gate}: FAIL: not a verdict: 98 of the 100 problems of its selection " in line
        assert "were deselected (--lf); a gate holds for the whole selection" in line
    assert "accuracy 1.0000 (test@1, 0-shot CoT, n=2) >= --gsm8k-min-acc 0.99" in text
    assert "Traceback" not in text
    # the same options without --lf: the whole selection, a real PASS
    gsm8k_run(*args, "--gsm8k-min-acc=0.99", report=None, xdist=())
