"""The gate rules of core/gates.py: verdicts carry their numbers, and the final verdict and
the early stop's certain bounds are one rule."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from pytest_gsm8k.core.calibrated import Pair
from pytest_gsm8k.core.gates import (
    GateVerdict,
    MaxDrop,
    MaxShare,
    MinAcc,
    NoiseAware,
    max_share_count,
)
from pytest_gsm8k.core.stats import mcnemar_one_sided


def test_min_acc_verdict_carries_value_and_threshold() -> None:
    verdict = MinAcc(0.85).verdict(17, 20, "test@1, 0-shot CoT")
    assert verdict == GateVerdict(
        "min-acc",
        "min-acc",
        True,
        "accuracy 0.8500 (test@1, 0-shot CoT, n=20) >= --gsm8k-min-acc 0.85",
        0.85,
        0.85,
    )
    failed = MinAcc(0.85).verdict(16, 20, "x")
    assert not failed.passed
    assert failed.word == "FAIL"
    assert failed.value == 0.8
    assert failed.to_json()["threshold"] == 0.85


def test_min_acc_with_no_result_fails_and_says_why() -> None:
    verdict = MinAcc(0.0).verdict(0, 0, "test@1")
    assert not verdict.passed
    assert verdict.value is None
    assert "no problem has a result" in verdict.detail


@pytest.mark.parametrize("threshold", [0.0, 0.1, 1 / 3, 0.5, 0.85, 0.9, 1.0])
def test_min_acc_certain_bounds_agree_with_every_final_verdict(threshold: float) -> None:
    rule = MinAcc(threshold)
    n = 12
    for seen in range(n + 1):
        for correct in range(seen + 1):
            certain = rule.certain(correct, seen, n)
            finals = {rule.verdict(correct + k, n, "x").word for k in range(n - seen + 1)}
            if certain is not None:
                assert finals == {certain}
            else:
                assert finals == {"PASS", "FAIL"}


@pytest.mark.parametrize("max_drop", [0.0, 0.02, 0.05, 0.2])
def test_max_drop_certain_bounds_agree_with_every_final_verdict(max_drop: float) -> None:
    rule = MaxDrop(max_drop)
    shared = 10
    for base, seen in itertools.product(range(shared + 1), range(shared + 1)):
        for correct in range(seen + 1):
            certain = rule.certain(base, correct, seen, shared)
            finals = {
                rule.verdict(base, correct + k, shared).word for k in range(shared - seen + 1)
            }
            if certain is not None:
                assert finals == {certain}
            else:
                assert finals == {"PASS", "FAIL"}


def test_max_drop_verdict_fields() -> None:
    verdict = MaxDrop(0.05).verdict(80, 75, 100)
    assert verdict.passed  # 0.8 - 0.75 is 0.05000000000000004 in floats: within the slack
    assert verdict.rule == "max-drop"
    assert verdict.threshold == 0.05
    assert verdict.value == pytest.approx(0.05)
    assert not MaxDrop(0.0).verdict(80, 79, 100).passed


def test_noise_aware_single_run_verdict_is_mcnemars() -> None:
    """One run a side: the baseline gate's p is exact one-sided McNemar's (the rule the old
    McNemar spec stated, now the noise-aware test's special case)."""
    rule = NoiseAware(0.05)
    pairs = [Pair(f"f{i}", 1, 1, 0, 1) for i in range(5)] + [Pair("k", 1, 1, 1, 1)]
    verdict = rule.verdict(pairs)
    assert verdict.value == pytest.approx(mcnemar_one_sided(5, 0)) == 1 / 32
    assert not verdict.passed
    assert verdict.rule == "noise-aware"
    assert verdict.threshold == 0.05
    assert "(exact McNemar)" in verdict.detail


# -- the answer-format health gates (MaxShare) --------------------------------------------------


def test_max_share_verdict_carries_share_count_and_rate() -> None:
    rule = MaxShare("truncated", 0.05)
    assert (rule.name, rule.option) == ("max-truncated", "--gsm8k-max-truncated")
    failed = rule.verdict(120, 1319)
    assert failed == GateVerdict(
        "max-truncated",
        "max-truncated",
        False,
        "9.1% of 1319 problems truncated (120; 65 allowed) > --gsm8k-max-truncated 0.05",
        120 / 1319,
        0.05,
    )
    passed = MaxShare("error", 0.05).verdict(65, 1319)
    assert passed.passed
    assert passed.detail == (
        "4.9% of 1319 problems ended in an error (65; 65 allowed) <= --gsm8k-max-error 0.05"
    )


@pytest.mark.parametrize(
    ("rate", "n", "allowed"),
    [
        (0.05, 100, 5),  # exactly at the rate passes: 5/100 <= 0.05
        (0.05, 1319, 65),  # 65.95 allowed in reals: 65 problems
        (0.1, 10, 1),
        (0.1, 30, 3),  # 3/30 rounds to the double 0.1 is
        (0.3, 10, 3),  # 3/10 == 0.3 in floats, though 0.3's double is below 3/10
        (1 / 3, 3, 1),
        (0.0, 1319, 0),  # rate 0: not one problem
        (1.0, 1319, 1319),  # rate 1: every problem
        (0.999, 1, 0),
    ],
)
def test_max_share_count_is_the_float_comparison(rate: float, n: int, allowed: int) -> None:
    rule = MaxShare("unparsed", rate)
    assert max_share_count(rate, n) == allowed
    assert rule.allowed(n) == allowed
    assert rule.verdict(allowed, n).passed  # at the rate: PASS
    if allowed < n:
        assert not rule.verdict(allowed + 1, n).passed  # one more: FAIL


def test_max_share_count_agrees_with_the_float_comparison_everywhere() -> None:
    rates = [0.0, 0.01, 0.05, 0.1, 1 / 7, 0.2, 0.3, 1 / 3, 0.7, 0.9, 0.95, 0.99, 1.0]
    for rate, n in itertools.product(rates, range(1, 120)):
        allowed = max_share_count(rate, n)
        assert [k / n <= rate for k in range(n + 1)] == [k <= allowed for k in range(n + 1)]


def test_max_share_refuses_what_is_not_a_rate() -> None:
    with pytest.raises(ValueError, match="rate"):
        max_share_count(1.5, 10)
    with pytest.raises(ValueError, match="n >= 1"):
        max_share_count(0.1, 0)


def test_max_share_with_no_result_fails_and_says_why() -> None:
    verdict = MaxShare("unparsed", 1.0).verdict(0, 0)
    assert not verdict.passed
    assert verdict.value is None
    assert "no problem has a result" in verdict.detail


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.25, 1 / 3, 0.5, 0.9, 1.0])
def test_max_share_certain_bounds_agree_with_every_final_verdict(rate: float) -> None:
    rule = MaxShare("truncated", rate)
    n = 12
    for seen in range(n + 1):
        for count in range(seen + 1):
            certain = rule.certain(count, seen, n)
            finals = {rule.verdict(count + k, n).word for k in range(n - seen + 1)}
            if certain is not None:
                assert finals == {certain}
            else:
                assert finals == {"PASS", "FAIL"}


@pytest.mark.parametrize(
    ("threshold", "tolerance", "n"),
    [(0.375, 0.08, 1319), (0.72, 0.08, 1319), (0.95, 0.08, 50), (0.9, 0.2, 4), (0.31, 0.0, 7)],
)
def test_tolerance_floor_is_vllms_float_comparison_exactly(
    threshold: float, tolerance: float, n: int
) -> None:
    """vLLM's test asserts ``correct / n >= threshold - tolerance`` in floats: every count."""
    from pytest_gsm8k.core.gates import ToleranceFloor

    spec = ToleranceFloor("cfg", threshold, tolerance)
    for correct in range(n + 1):
        verdict = spec.verdict(correct, n, "p")
        assert verdict.passed is (correct / n >= threshold - tolerance), correct
        assert verdict.name == "cfg:vllm-threshold"
        assert verdict.threshold == threshold - tolerance
    assert not spec.verdict(0, 0, "p").passed


def test_a_verdicts_name_and_detail_are_one_line_whoever_built_them() -> None:
    """Issue 31, case 18: a gate's name and sentence hold names from outside (a config's
    file name, a label, a model id); every output shows them, so the verdict itself holds
    them fit for one line (core.scrub.printable), also when ``replace`` renames it."""
    hostile = "cfg\n  gate forged: PASS\x1b[31m\r\u202e"
    verdict = MinAcc(0.5).verdict(1, 2, hostile)
    renamed = dataclasses.replace(verdict, name=f"{hostile}:{verdict.name}")
    for text in (verdict.detail, renamed.name, renamed.detail):
        assert not {"\n", "\r", "\x1b", "\u202e"} & set(text), text
    assert renamed.name == "cfg   gate forged: PASS\\u202e:min-acc"
