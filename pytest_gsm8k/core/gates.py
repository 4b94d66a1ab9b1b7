"""The release gates' rules, each written once (docs/baselines.md). Pure.

A gate spec answers what the run asks of it: :meth:`verdict` on final counts (rule, value and
threshold as fields, which every output reads), :meth:`certain` on partial counts for the early
stop (the verdict no unseen outcome could change, else None), and :meth:`cannot_fail` (why no
outcome at all could FAIL it at this size: then it is no verdict, and never certain PASS).
Count rules are integer thresholds (``need``) that agree exactly with the float comparison a
reader would write (``correct / n >= min_acc``), so the end and the early stop never differ
by a rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache
from typing import Literal

from pytest_gsm8k.core.calibrated import Evidence, Pair, difference, evidence, p_value
from pytest_gsm8k.core.records import GateRecord, Outcome
from pytest_gsm8k.core.scrub import printable

Verdict = Literal["PASS", "FAIL"]
#: a gate's word: UNDECIDED is a gate that was not decided and does not block the run (another
#: gate's early FAIL made it moot; a shard's gates wait for the merge); an undecided gate
#: that blocks says FAIL, "not a verdict: ..." (:func:`undecided`)
Word = Literal["PASS", "FAIL", "UNDECIDED"]

#: slack of the drop comparison: a drop equal to --gsm8k-max-drop in decimal passes even
#: when its float difference comes out a few ulps above it
DROP_TOLERANCE = 1e-12


@dataclass(frozen=True)
class GateVerdict:
    """One gate's verdict. ``rule`` names what decided (``min-acc``, ``early-stop``, a
    refusal such as ``baseline-missing``); ``passed``: does not block the run;
    ``undecided``: not decided (blocking: a FAIL "not a verdict"; else the word UNDECIDED)."""

    name: str
    rule: str
    passed: bool
    detail: str
    value: float | None = None
    threshold: float | None = None
    undecided: bool = False

    def __post_init__(self) -> None:
        # names from outside (a config's file, a label, a model id), made fit for one line once
        object.__setattr__(self, "name", printable(self.name))
        object.__setattr__(self, "detail", printable(self.detail))

    @property
    def word(self) -> Word:
        if not self.passed:
            return "FAIL"
        return "UNDECIDED" if self.undecided else "PASS"

    def to_json(self) -> GateRecord:
        return {
            "name": self.name,
            "rule": self.rule,
            "passed": self.passed,
            "value": self.value,
            "threshold": self.threshold,
            "detail": self.detail,
        }


#: how an undecided gate's sentence begins (:func:`undecided`)
NOT_A_VERDICT = "not a verdict: "


def undecided(verdict: GateVerdict, why: str) -> GateVerdict:
    """``verdict`` as no verdict (FAIL, exit 1): a gate that was not decided never passes.
    ``why``: why and what to do, in one clause, put in front of any earlier reason; a FAIL
    stays as it is (the run fails either way, for the rule's reason)."""
    if verdict.passed:
        detail = f"{NOT_A_VERDICT}{why}; on what ran: {verdict.detail}"
    elif verdict.detail.startswith(NOT_A_VERDICT):
        detail = f"{NOT_A_VERDICT}{why}; {verdict.detail.removeprefix(NOT_A_VERDICT)}"
    else:
        return verdict
    return replace(verdict, passed=False, detail=detail, undecided=True)


def min_acc_count(min_acc: float, n: int) -> int:
    """Smallest correct count ``c`` in ``0..n+1`` with ``c / n >= min_acc`` in floats
    (``n + 1``: none). ``ceil(min_acc * n)`` in fractions, nudged to agree with the float
    comparison itself (``c / n`` is correctly rounded, hence nondecreasing in ``c``)."""
    if n < 1:
        raise ValueError(f"need n >= 1, got {n}")
    count = max(0, min(n + 1, math.ceil(Fraction(min_acc) * n)))
    while count > 0 and (count - 1) / n >= min_acc:
        count -= 1
    while count <= n and count / n < min_acc:
        count += 1
    return count


def max_share_count(rate: float, n: int) -> int:
    """Largest count ``k`` in ``0..n`` with ``k / n <= rate`` in floats, as
    :func:`min_acc_count` finds its count: a share exactly at the rate passes."""
    if n < 1:
        raise ValueError(f"need n >= 1, got {n}")
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"need 0 <= rate <= 1, got {rate}")
    count = max(0, min(n, math.floor(Fraction(rate) * n)))
    while count < n and (count + 1) / n <= rate:
        count += 1
    while count > 0 and count / n > rate:
        count -= 1
    return count


def count_certain(correct: int, seen: int, size: int, need: int) -> Verdict | None:
    """A count rule "X >= need" with ``correct`` of X known after ``seen`` of ``size`` items
    (never PASS for a rule no count fails: it is no verdict)."""
    if need <= 0:
        return None
    if correct >= need:
        return "PASS"
    if correct + size - seen < need:
        return "FAIL"
    return None


@dataclass(frozen=True)
class MinAcc:
    """``--gsm8k-min-acc``: the accuracy over the run's problems is at least ``threshold``."""

    threshold: float
    name: str = "min-acc"
    option: str = "--gsm8k-min-acc"

    def need(self, n: int) -> int:
        return min_acc_count(self.threshold, n)

    def verdict(self, correct: int, n: int, label: str, runs: int = 1) -> GateVerdict:
        """``correct`` of the ``n * runs`` answers (``runs``: ``--gsm8k-repeats``)."""
        if n == 0:
            return GateVerdict(
                self.name,
                "min-acc",
                False,
                f"no problem has a result ({label}): nothing to compare with "
                f"{self.option} {self.threshold:g}",
                None,
                self.threshold,
            )
        passed = correct >= self.need(n * runs)
        accuracy = correct / (n * runs)
        every = f", mean of {runs} answers each" if runs > 1 else ""
        detail = (
            f"accuracy {accuracy:.4f} ({label}, n={n}{every}) "
            f"{'>=' if passed else 'is below'} {self.option} {self.threshold:g}"
        )
        verdict = GateVerdict(self.name, "min-acc", passed, detail, accuracy, self.threshold)
        why = self.cannot_fail(n)
        return verdict if why is None else undecided(verdict, why)

    def certain(self, correct: int, seen: int, n: int) -> Verdict | None:
        return count_certain(correct, seen, n, self.need(n))

    def cannot_fail(self, n: int) -> str | None:
        """Why no accuracy of ``n`` problems fails the gate (a threshold of 0), or None."""
        if n < 1 or self.need(n) > 0:
            return None
        return (
            f"{self.option} {self.threshold:g} cannot fail (every accuracy reaches it): set it "
            "above 0"
        )


@dataclass(frozen=True)
class ToleranceFloor:
    """A vLLM config's gate as vLLM's test_gsm8k_correctness.py asserts it: ``accuracy >=
    accuracy_threshold - tolerance``, the floor in floats as there, an error not correct."""

    config: str
    threshold: float
    tolerance: float

    @property
    def name(self) -> str:
        return f"{self.config}:vllm-threshold"

    @property
    def floor(self) -> float:
        return self.threshold - self.tolerance

    def need(self, n: int) -> int:
        return min_acc_count(self.floor, n)

    def verdict(self, correct: int, n: int, label: str, runs: int = 1) -> GateVerdict:
        if n == 0:
            return GateVerdict(
                self.name,
                "vllm-threshold",
                False,
                f"no problem has a result ({label})",
                None,
                self.floor,
            )
        passed = correct >= self.need(n * runs)
        accuracy = correct / (n * runs)
        detail = (
            f"accuracy {accuracy:.4f} ({label}, n={n}) {'>=' if passed else '<'} "
            f"accuracy_threshold {self.threshold:g} - tolerance {self.tolerance:g} "
            f"= {self.floor:.4f}"
        )
        verdict = GateVerdict(self.name, "vllm-threshold", passed, detail, accuracy, self.floor)
        why = self.cannot_fail(n)
        return verdict if why is None else undecided(verdict, why)

    def certain(self, correct: int, seen: int, n: int) -> Verdict | None:
        return count_certain(correct, seen, n, self.need(n))

    def cannot_fail(self, n: int) -> str | None:
        """Why no accuracy of ``n`` problems fails the floor (at or below 0), or None."""
        if n < 1 or self.need(n) > 0:
            return None
        return (
            f"its floor accuracy_threshold {self.threshold:g} - tolerance {self.tolerance:g} = "
            f"{self.floor:.4f} is at or below 0, so no accuracy fails it: raise "
            "accuracy_threshold (or lower tolerance) in the config"
        )


def _drop(pairs: Sequence[Pair]) -> float:
    """Mean baseline rate minus mean candidate rate over the pairs (0 without pairs)."""
    return -difference(pairs)[0] if pairs else 0.0


def failing_words(pairs: Sequence[Pair]) -> str:
    """The problems failing now, in counts that add up: newly failing and passing against a
    single-run baseline, the failing split into stable and noisy against a calibrated one."""
    failing = [x for x in pairs if x.failing]
    runs = max((x.base_runs for x in pairs), default=1)
    passing = sum(1 for x in pairs if x.base_correct == 0 and x.now_correct > 0)
    stable = sum(1 for x in failing if x.stable_flip)
    return flip_words(len(failing), passing, stable, runs)


def flip_words(failing: int, passing: int, stable: int, runs: int) -> str:
    """:func:`failing_words` from the counts a report's baseline block holds."""
    if runs == 1:
        return f"{failing} newly failing, {passing} newly passing"
    return (
        f"{failing} newly failing: {stable} stable (right in all {runs} baseline runs), "
        f"{failing - stable} noisy"
    )


def difference_words(pairs: Sequence[Pair]) -> str:
    """The one estimate of the difference against a baseline, as every line shows it."""
    return points_words(*difference(pairs))


def points_words(diff: float, low: float, high: float) -> str:
    """:func:`difference_words` from the estimate a report's baseline block holds."""
    return f"diff {100 * diff:+.2f} points [95% CI {100 * low:+.2f}, {100 * high:+.2f}]"


@dataclass(frozen=True)
class NoiseAware:
    """The baseline gate (core/calibrated.py): FAIL when the candidate is worse than the
    baseline beyond its noise at ``alpha`` AND its mean drop exceeds ``max_drop``."""

    alpha: float
    max_drop: float = 0.0
    name: str = "baseline"
    option: str = "--gsm8k-alpha"

    def _fails(self, p: float, drop: float) -> bool:
        return p < self.alpha and drop > self.max_drop + DROP_TOLERANCE

    def verdict(self, pairs: Sequence[Pair], seen: Evidence | None = None) -> GateVerdict:
        seen = seen or evidence(pairs)
        p = seen.p
        drop = _drop(pairs)
        runs = max((x.base_runs for x in pairs), default=1)
        how = (
            "exact McNemar"
            if seen.mcnemar
            else f"noise-aware, baseline {runs} run{'s' if runs != 1 else ''} per problem"
        )
        words = f"{failing_words(pairs)}; {difference_words(pairs)}"
        passed = not self._fails(p, drop)
        clause = f"p={p:.3g} {'<' if p < self.alpha else '>='} {self.option} {self.alpha:g}"
        if p < self.alpha and self.max_drop > 0:
            clause += (
                f", drop {100 * drop:.2f} points {'>' if not passed else '<='} "
                f"--gsm8k-max-drop {self.max_drop:g}"
            )
        verdict = GateVerdict(
            self.name, "noise-aware", passed, f"{clause} ({how}): {words}", p, self.alpha
        )
        why = self.cannot_fail(pairs) if passed else None
        return verdict if why is None else undecided(verdict, why)

    def rise(self, pairs: Sequence[Pair], seen: Evidence | None = None) -> str | None:
        """The warning for a rise noise cannot explain, or None: never a FAIL, but more often
        a changed measurement than a better model."""
        p = (seen or evidence(pairs)).rise
        if p >= self.alpha:
            return None
        return (
            f"WARNING: better than the baseline beyond its noise (p={p:.3g} < {self.option} "
            f"{self.alpha:g}; {difference_words(pairs)}): check for a changed prompt or "
            "extractor, the wrong model or endpoint, or contamination before trusting it"
        )

    def cannot_fail(self, pairs: Sequence[Pair]) -> str | None:
        """Why no outcome of the candidate fails the gate, or None: every candidate answer
        wrong gives the smallest p and the largest drop (six problems right in a single-run
        baseline reach p = 1/64 at best, not below alpha 0.01: no verdict)."""
        p, drop = _all_wrong(
            tuple(sorted((x.base_correct, x.base_runs, x.now_runs) for x in pairs))
        )
        if self._fails(p, drop):
            return None
        size = f"{len(pairs)} problem{'s' if len(pairs) != 1 else ''}"
        if p >= self.alpha:
            return (
                f"the smallest p {size} can give (every answer wrong) is {p:.3g} >= "
                f"{self.option} {self.alpha:g}, so the test cannot fail: use more problems"
            )
        return (
            f"the largest drop {size} can show (every answer wrong) is {100 * drop:.2f} "
            f"points, within --gsm8k-max-drop {self.max_drop:g}: lower it"
        )

    def certain(
        self, seen: Sequence[Pair], unseen: Sequence[tuple[str, int, int]]
    ) -> Verdict | None:
        """The verdict no outcome of the ``unseen`` problems (``(id, base_correct,
        base_runs)``) could change, else None: "all fail" and "all succeed" are the extremes
        for single candidate runs (core/calibrated.py); with repeats it waits for the end."""
        if any(x.now_runs != 1 for x in seen):
            return None
        worst = [*seen, *(Pair(i, c, k, 0, 1) for i, c, k in unseen)]
        if not self._fails(p_value(worst), _drop(worst)):
            return "PASS" if self.cannot_fail(worst) is None else None
        best = [*seen, *(Pair(i, c, k, 1, 1) for i, c, k in unseen)]
        if self._fails(p_value(best), _drop(best)):
            return "FAIL"
        return None


@lru_cache(maxsize=64)
def _all_wrong(sides: tuple[tuple[int, int, int], ...]) -> tuple[float, float]:
    """The p and the drop with every candidate answer wrong, for (baseline correct,
    baseline runs, candidate runs); cached: the early stop asks at every check."""
    worst = [Pair(str(i), c, k, 0, runs) for i, (c, k, runs) in enumerate(sides)]
    return p_value(worst), _drop(worst)


#: the outcomes an answer-format health gate may count (``--gsm8k-max-<outcome>``)
HEALTH_OUTCOMES: tuple[Outcome, ...] = ("unparsed", "truncated", "error")

#: how a gate's sentence names the problems of each counted outcome
_HEALTH_WORDS = {"unparsed": "unparsed", "truncated": "truncated", "error": "ended in an error"}


@dataclass(frozen=True)
class MaxShare:
    """``--gsm8k-max-unparsed`` / ``-truncated`` / ``-error``: at most ``rate`` of the
    problems with a result (the accuracy's ``n``) have ``outcome``, one outcome per problem
    (docs/baselines.md#answer-format-health). The early stop reads it as "the problems *not*
    of this outcome are at least ``n - allowed``" (:meth:`need`)."""

    outcome: Outcome
    rate: float

    @property
    def name(self) -> str:
        return f"max-{self.outcome}"

    @property
    def option(self) -> str:
        return f"--gsm8k-max-{self.outcome}"

    def allowed(self, n: int) -> int:
        """The most problems of the outcome ``n`` problems may have and pass."""
        return max_share_count(self.rate, n)

    def need(self, n: int) -> int:
        """The fewest problems of any *other* outcome that pass (the early stop's count)."""
        return n - self.allowed(n)

    def verdict(self, count: int, n: int, runs: int = 1) -> GateVerdict:
        """``count`` of the ``n * runs`` answers have the outcome."""
        if n == 0:
            return GateVerdict(
                self.name,
                self.name,
                False,
                f"no problem has a result: nothing to compare with {self.option} {self.rate:g}",
                None,
                self.rate,
            )
        total = n * runs
        passed = count <= self.allowed(total)
        share = count / total
        what = f"{total} answers" if runs > 1 else f"{n} problems"
        detail = (
            f"{share:.1%} of {what} {_HEALTH_WORDS[self.outcome]} ({count}; "
            f"{self.allowed(total)} allowed) {'<=' if passed else '>'} {self.option} {self.rate:g}"
        )
        verdict = GateVerdict(self.name, self.name, passed, detail, share, self.rate)
        why = self.cannot_fail(n)
        return verdict if why is None else undecided(verdict, why)

    def certain(self, count: int, seen: int, n: int) -> Verdict | None:
        """FAIL once ``count`` already exceeds what all ``n`` may hold; PASS once even every
        unseen problem having the outcome stays within it."""
        return count_certain(seen - count, seen, n, self.need(n))

    def cannot_fail(self, n: int) -> str | None:
        """Why no count of ``n`` problems fails the gate (a rate of 1), or None."""
        if n < 1 or self.allowed(n) < n:
            return None
        return (
            f"{self.option} {self.rate:g} allows every problem to be "
            f"{_HEALTH_WORDS[self.outcome]}, so it cannot fail: set it below 1"
        )
