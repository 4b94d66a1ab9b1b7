"""The gate rules of core/gates.py: verdicts carry their numbers, the final verdict and
the early stop's certain bounds are one rule, and a gate that cannot fail at the run's size
is no verdict (issue 31, rule 2)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from pytest_gsm8k.core.calibrated import Pair, evidence
from pytest_gsm8k.core.gates import (
    GateVerdict,
    MaxShare,
    MinAcc,
    NoiseAware,
    ToleranceFloor,
    _drop,
    count_certain,
    max_share_count,
    undecided,
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
            certain = count_certain(correct, seen, n, rule.need(n))
            finals = {rule.verdict(correct + k, n, "x").word for k in range(n - seen + 1)}
            if certain is not None:
                assert finals == {certain}
            else:
                # open, or a gate that cannot fail: no verdict whatever comes (never certain)
                assert finals == ({"FAIL"} if rule.cannot_fail(n) else {"PASS", "FAIL"})


def test_noise_aware_single_run_verdict_is_mcnemars() -> None:
    """One run a side: the baseline gate's p is exact one-sided McNemar's (the rule the old
    McNemar spec stated, now the noise-aware test's special case)."""
    rule = NoiseAware(0.05)
    pairs = [Pair(f"f{i}", 1, 1, 0, 1) for i in range(5)] + [Pair("k", 1, 1, 1, 1)]
    verdict = rule.verdict(pairs, evidence(pairs))
    assert verdict.value == pytest.approx(mcnemar_one_sided(5, 0)) == 1 / 32
    assert not verdict.passed
    assert verdict.rule == "noise-aware"
    assert verdict.threshold == 0.05
    assert "(exact McNemar)" in verdict.detail


# -- the answer-format health gates (MaxShare) --------------------------------------------------


def test_max_share_verdict_carries_share_count_and_rate() -> None:
    rule = MaxShare("truncated", 0.05)
    assert rule.name == "max-truncated"
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
    if allowed < n:
        assert rule.verdict(allowed, n).passed  # at the rate: PASS
        assert not rule.verdict(allowed + 1, n).passed  # one more: FAIL
    else:  # every problem allowed: the gate cannot fail, and is no verdict
        assert rule.cannot_fail(n) is not None
        assert not rule.verdict(allowed, n).passed


def test_max_share_count_agrees_with_the_float_comparison_everywhere() -> None:
    rates = [0.0, 0.01, 0.05, 0.1, 1 / 7, 0.2, 0.3, 1 / 3, 0.7, 0.9, 0.95, 0.99, 1.0]
    for rate, n in itertools.product(rates, range(1, 120)):
        allowed = max_share_count(rate, n)
        assert [k / n <= rate for k in range(n + 1)] == [k <= allowed for k in range(n + 1)]


def test_max_share_with_no_problem_is_no_verdict_not_a_count() -> None:
    """A rate outside 0..1 never reaches the rule: the settings refuse it (test_settings.py)."""
    rule = MaxShare("unparsed", 0.1)
    verdict = rule.verdict(0, 0)
    assert (verdict.passed, verdict.value) == (False, None)
    assert verdict.detail.startswith("no problem has a result: nothing to compare with")
    assert rule.cannot_fail(0) is None


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
            certain = count_certain(seen - count, seen, n, rule.need(n))  # the early stop's count
            finals = {rule.verdict(count + k, n).word for k in range(n - seen + 1)}
            if certain is not None:
                assert finals == {certain}
            else:
                assert finals == ({"FAIL"} if rule.cannot_fail(n) else {"PASS", "FAIL"})


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


# -- rule 2: a gate that cannot fail at the run's size is no verdict ----------------------------


def test_count_gates_that_cannot_fail_say_why_and_what_to_do() -> None:
    """Issue 31 case 7: a vLLM config at accuracy_threshold 0.05 with the default tolerance
    0.08 has a floor of -0.03, which a model at 0.0000 PASSed; min-acc 0 and a health gate at
    rate 1 are the same. Each says why, names what to change, and is no verdict."""
    floor = ToleranceFloor("cfg", 0.05, 0.08)
    why = floor.cannot_fail(8)
    assert why is not None
    assert "accuracy_threshold 0.05 - tolerance 0.08 = -0.0300 is at or below 0" in why
    assert "raise accuracy_threshold" in why
    verdict = floor.verdict(0, 8, "x")
    assert not verdict.passed
    assert verdict.detail.startswith(f"not a verdict: {why}; on what ran: accuracy 0.0000")
    assert verdict.rule == "vllm-threshold"
    assert (verdict.value, verdict.threshold) == (0.0, floor.floor)
    assert ToleranceFloor("cfg", 0.08, 0.08).cannot_fail(8) is not None  # a floor of exactly 0
    assert ToleranceFloor("cfg", 0.09, 0.08).cannot_fail(8) is None  # 0.01: 0 of 8 fails it
    assert not ToleranceFloor("cfg", 0.09, 0.08).verdict(0, 8, "x").passed

    assert "set it above 0" in str(MinAcc(0.0).cannot_fail(10))
    assert MinAcc(1e-9).cannot_fail(10) is None
    assert "not a verdict" in MinAcc(0.0).verdict(10, 10, "x").detail
    assert "set it below 1" in str(MaxShare("error", 1.0).cannot_fail(5))
    assert MaxShare("error", 0.999).cannot_fail(5) is None


def test_a_failed_verdict_stays_a_fail_and_each_reason_is_said() -> None:
    """``undecided`` takes a PASS away: a FAIL keeps its own reason, and a gate already no
    verdict gains the new reason in front (a narrowed run of a gate that cannot fail: both)."""
    failed = MinAcc(0.9).verdict(1, 10, "x")
    assert undecided(failed, "why") is failed
    made = undecided(MinAcc(0.5).verdict(9, 10, "x"), "why; do this")
    assert not made.passed
    assert made.detail.startswith("not a verdict: why; do this; on what ran: accuracy 0.9000")
    both = undecided(MinAcc(0.0).verdict(9, 10, "x"), "2 of 10 deselected")
    assert not both.passed
    assert both.detail.startswith(
        "not a verdict: 2 of 10 deselected; --gsm8k-min-acc 0 cannot fail (every accuracy "
        "reaches it): set it above 0; on what ran: accuracy 0.9000"
    )


def test_a_single_run_baseline_of_six_problems_cannot_fail_at_alpha_001() -> None:
    """Issue 31 case 6: six problems, a baseline at 1.0, the model at 0.0: p = 1/64 is the
    smallest p there is, not below 0.01, and the gate PASSed. Seven can reach 1/128."""
    six = [Pair(f"p{i}", 1, 1, 0, 1) for i in range(6)]
    rule = NoiseAware(0.01)
    why = rule.cannot_fail(six)
    assert why is not None
    assert "the smallest p 6 problems can give (every answer wrong) is 0.0156 >= " in why
    assert "--gsm8k-alpha 0.01" in why
    assert "use more problems" in why
    verdict = rule.verdict(six, evidence(six))
    assert not verdict.passed
    assert verdict.detail.startswith(f"not a verdict: {why}; on what ran: p=0.0156 >= ")
    assert rule.certain([], [(p.problem_id, 1, 1) for p in six]) is None  # never "PASS"
    seven = [Pair(f"p{i}", 1, 1, 0, 1) for i in range(7)]
    assert rule.cannot_fail(seven) is None
    assert not rule.verdict(seven, evidence(seven)).passed
    assert "not a verdict" not in rule.verdict(seven, evidence(seven)).detail
    assert NoiseAware(0.05).cannot_fail(six) is None  # 1/64 < 0.05
    # the drop allowed on top: six stable problems lost are a drop of 100 points at most
    assert "within --gsm8k-max-drop 1" in str(NoiseAware(0.05, max_drop=1.0).cannot_fail(six))


@pytest.mark.parametrize("max_drop", [0.0, 0.3])
@pytest.mark.parametrize("alpha", [0.01, 0.05, 0.2])
def test_noise_aware_cannot_fail_exactly_when_no_candidate_outcome_fails(
    alpha: float, max_drop: float
) -> None:
    """Against every small baseline (up to 7 problems, 1 or 3 runs each), with single
    candidate runs: ``cannot_fail`` says None exactly when some outcome of the candidate
    FAILs the test (brute force over every outcome)."""
    rule = NoiseAware(alpha, max_drop)
    for size in range(1, 8):
        for runs in (1, 3):
            for base in itertools.combinations_with_replacement(range(runs + 1), size):
                baseline = [(f"p{i}", c, runs) for i, c in enumerate(base)]
                outcomes = itertools.product((0, 1), repeat=size)
                every = (  # built as any() asks: it stops at the first outcome that FAILs
                    [Pair(i, c, k, d, 1) for (i, c, k), d in zip(baseline, now, strict=True)]
                    for now in outcomes
                )
                fails = any(rule._fails(evidence(pairs).p, _drop(pairs)) for pairs in every)
                pairs = [Pair(i, c, k, 1, 1) for i, c, k in baseline]
                assert (rule.cannot_fail(pairs) is None) is fails, (base, runs)
