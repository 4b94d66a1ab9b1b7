"""The release gates' rules, each written once: the verdict on final counts, ``certain`` on
partial ones (the early stop), ``cannot_fail`` at this size (no verdict). Count thresholds
are integers that agree with the float comparison, so the two never differ by a rounding. Pure."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import ClassVar, Literal, cast

from pytest_gsm8k.core.calibrated import Evidence, Pair, difference, evidence
from pytest_gsm8k.core.records import GateRecord, Outcome, Word
from pytest_gsm8k.core.scrub import printable

Verdict = Literal["PASS", "FAIL"]

#: slack of the drop comparison: a drop equal to --gsm8k-max-drop in decimal passes even
#: when its float difference comes out a few ulps above it
DROP_TOLERANCE = 1e-12


@dataclass(frozen=True)
class GateVerdict:
    """One gate's verdict; ``passed``: does not block the run."""

    name: str
    rule: str
    passed: bool
    detail: str
    value: float | None = None
    threshold: float | None = None
    undecided: bool = False

    def __post_init__(self) -> None:  # names from outside, made fit for one line once
        object.__setattr__(self, "name", printable(self.name))
        object.__setattr__(self, "detail", printable(self.detail))

    @property
    def word(self) -> Word:  # the JSON's "verdict", which every output shows
        return "FAIL" if not self.passed else "UNDECIDED" if self.undecided else "PASS"

    def to_json(self) -> GateRecord:
        keys = ("name", "rule", "passed", "value", "threshold", "detail")
        return cast(GateRecord, {key: getattr(self, key) for key in keys} | {"verdict": self.word})


NOT_A_VERDICT = "not a verdict: "


def undecided(verdict: GateVerdict, why: str | None, *, fails_too: bool = False) -> GateVerdict:
    """``verdict`` as no verdict (never passing) unless ``why`` is None; a FAIL too if fails_too."""
    if why is None:
        return verdict
    if verdict.passed or (fails_too and not verdict.detail.startswith(NOT_A_VERDICT)):
        detail = f"{NOT_A_VERDICT}{why}; on what ran: {verdict.detail}"
    elif verdict.detail.startswith(NOT_A_VERDICT):
        detail = f"{NOT_A_VERDICT}{why}; {verdict.detail.removeprefix(NOT_A_VERDICT)}"
    else:
        return verdict
    return replace(verdict, passed=False, detail=detail, undecided=True)


def _first(n: int, ok: Callable[[int], bool]) -> int:
    """The smallest ``c`` in ``0..n`` with ``ok(c)`` (``n + 1``: none); ``ok`` is monotone
    because ``c / n`` is correctly rounded, hence nondecreasing in ``c``."""
    return bisect.bisect_left(range(n + 1), True, key=ok)


def min_acc_count(min_acc: float, n: int) -> int:
    return _first(n, lambda c: c / n >= min_acc)


def max_share_count(rate: float, n: int) -> int:
    return _first(n, lambda c: c / n > rate) - 1


def count_certain(good: int, seen: int, size: int, need: int) -> Verdict | None:
    """The rule ``X >= need``, ``good`` known after ``seen`` of ``size`` (need <= 0: no PASS)."""
    if need <= 0:
        return None
    if good >= need:
        return "PASS"
    return "FAIL" if good + size - seen < need else None


class _CountRule:
    """PASS iff the good answers reach :meth:`need`; ``against``: the limit in words."""

    name: str
    against: ClassVar[str]
    never: ClassVar[str]
    need: Callable[[int], int]  # the good answers of ``n`` that PASS (each rule's method)

    def cannot_fail(self, n: int) -> str | None:
        return None if n < 1 or self.need(n) > 0 else self.never.format(s=self)

    def _verdict(
        self, n: int, label: str, limit: float, passed: bool, value: float, said: str
    ) -> GateVerdict:
        rule, against = self.name.rpartition(":")[2], self.against.format(s=self)
        if n == 0:
            detail = f"no problem has a result{label}: nothing to compare with {against}"
            return GateVerdict(self.name, rule, False, detail, None, limit)
        verdict = GateVerdict(self.name, rule, passed, f"{said} {against}", value, limit)
        return undecided(verdict, self.cannot_fail(n))


class _Accuracy(_CountRule):
    """A floor on the accuracy: ``--gsm8k-min-acc`` or a vLLM config's."""

    floor: float

    def need(self, n: int) -> int:
        return min_acc_count(self.floor, n)

    def verdict(self, correct: int, n: int, label: str, runs: int = 1) -> GateVerdict:
        """``correct`` of the ``n * runs`` answers (``runs``: ``--gsm8k-repeats``)."""
        total = max(n * runs, 1)
        passed, accuracy = correct >= self.need(total), correct / total
        every = f", mean of {runs} answers each" if runs > 1 else ""
        said = f"accuracy {accuracy:.4f} ({label}, n={n}{every}) {'>=' if passed else 'is below'}"
        return self._verdict(n, f" ({label})", self.floor, passed, accuracy, said)


@dataclass(frozen=True)
class MinAcc(_Accuracy):
    """``--gsm8k-min-acc``: the accuracy over the run's problems is at least ``threshold``
    (the name a shard's plan block holds)."""

    threshold: float
    name: str = "min-acc"
    option: str = "--gsm8k-min-acc"
    against = "{s.option} {s.floor:g}"
    never = against + " cannot fail (every accuracy reaches it): set it above 0"

    @property
    def floor(self) -> float:  # type: ignore[override]
        return self.threshold


@dataclass(frozen=True)
class ToleranceFloor(_Accuracy):
    """A vLLM config's gate as vLLM's test_gsm8k_correctness.py asserts it: ``accuracy >=
    accuracy_threshold - tolerance``, the floor in floats as there."""

    config: str
    threshold: float
    tolerance: float
    against = "accuracy_threshold {s.threshold:g} - tolerance {s.tolerance:g} = {s.floor:.4f}"
    never = (
        "its floor " + against + " is at or below 0, so no accuracy fails it: raise "
        "accuracy_threshold (or lower tolerance) in the config"
    )

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"{self.config}:vllm-threshold"

    @property
    def floor(self) -> float:  # type: ignore[override]
        return self.threshold - self.tolerance


#: the outcomes an answer-format health gate may count (``--gsm8k-max-<outcome>``)
HEALTH_OUTCOMES: tuple[Outcome, ...] = ("unparsed", "truncated", "error")


@dataclass(frozen=True)
class MaxShare(_CountRule):
    """``--gsm8k-max-<outcome>``: at most ``rate`` of the answers have ``outcome``; its good
    answers are those *not* of the outcome (docs/baselines.md#answer-format-health)."""

    outcome: Outcome
    rate: float
    against = "--gsm8k-max-{s.outcome} {s.rate:g}"
    never = against + " allows every problem to be {s.words}, so it cannot fail: set it below 1"

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"max-{self.outcome}"

    @property
    def words(self) -> str:  # how its sentence names the problems of its outcome
        return "ended in an error" if self.outcome == "error" else self.outcome

    def allowed(self, n: int) -> int:
        return max_share_count(self.rate, n)

    def need(self, n: int) -> int:
        return n - self.allowed(n)

    def verdict(self, count: int, n: int, runs: int = 1) -> GateVerdict:
        """``count`` of the ``n * runs`` answers have the outcome."""
        total = max(n * runs, 1)
        allowed = self.allowed(total)
        passed, what = count <= allowed, f"{total} answers" if runs > 1 else f"{n} problems"
        said = f"{count / total:.1%} of {what} {self.words} ({count}; {allowed} allowed)"
        said += " <=" if passed else " >"
        return self._verdict(n, "", self.rate, passed, count / total, said)


def _drop(pairs: Sequence[Pair]) -> float:
    return -difference(pairs)[0] if pairs else 0.0


def failing_words(pairs: Sequence[Pair]) -> str:
    """The problems failing now, in counts that add up (:func:`flip_words`)."""
    failing = [x for x in pairs if x.failing]
    passing = sum(1 for x in pairs if x.base_correct == 0 and x.now_correct > 0)
    stable = sum(1 for x in failing if x.stable_flip)
    return flip_words(len(failing), passing, stable, max((x.base_runs for x in pairs), default=1))


def flip_words(failing: int, passing: int, stable: int, runs: int) -> str:
    """Newly failing and passing; against a calibrated baseline, failing stable and noisy."""
    if runs == 1:
        return f"{failing} newly failing, {passing} newly passing"
    return (
        f"{failing} newly failing: {stable} stable (right in all {runs} baseline runs), "
        f"{failing - stable} noisy"
    )


def points_words(diff: float, low: float, high: float) -> str:
    """The one estimate of the difference against a baseline, as every line shows it."""
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

    def verdict(self, pairs: Sequence[Pair], seen: Evidence) -> GateVerdict:
        p, drop = seen.p, _drop(pairs)
        runs = max((x.base_runs for x in pairs), default=1)
        how = f"noise-aware, baseline {runs} run{'s' * (runs != 1)} per problem"
        how = "exact McNemar" if seen.mcnemar else how
        passed = not self._fails(p, drop)
        clause = f"p={p:.3g} {'<' if p < self.alpha else '>='} {self.option} {self.alpha:g}"
        if p < self.alpha and self.max_drop > 0:
            clause += (
                f", drop {100 * drop:.2f} points {'>' if not passed else '<='} "
                f"--gsm8k-max-drop {self.max_drop:g}"
            )
        detail = f"{clause} ({how}): {failing_words(pairs)}; {points_words(*difference(pairs))}"
        verdict = GateVerdict(self.name, "noise-aware", passed, detail, p, self.alpha)
        return undecided(verdict, self.cannot_fail(pairs) if passed else None)

    def rise(self, pairs: Sequence[Pair], seen: Evidence) -> str | None:
        """The warning for a rise noise cannot explain (more often a changed measurement)."""
        p = seen.rise
        if p >= self.alpha:
            return None
        return (
            f"WARNING: better than the baseline beyond its noise (p={p:.3g} < {self.option} "
            f"{self.alpha:g}; {points_words(*difference(pairs))}): check for a changed prompt or "
            "extractor, the wrong model or endpoint, or contamination before trusting it"
        )

    def cannot_fail(self, pairs: Sequence[Pair]) -> str | None:
        """Why no outcome fails the gate (all wrong: the smallest p, the largest drop), or None."""
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
        base_runs)``) could change, else None: all fail and all succeed are the extremes for
        single candidate runs (core/calibrated.py)."""
        worst, best = extremes(seen, unseen)
        if not self._fails(evidence(worst).p, _drop(worst)):
            return "PASS" if self.cannot_fail(worst) is None else None
        return "FAIL" if self._fails(evidence(best).p, _drop(best)) else None


def extremes(seen: Sequence[Pair], unseen: Sequence[tuple[str, int, int]]) -> list[list[Pair]]:
    """The pairs with every unseen problem wrong, and with every one right (one run each)."""
    return [[*seen, *(Pair(i, c, k, now, 1) for i, c, k in unseen)] for now in (0, 1)]


@lru_cache(maxsize=64)
def _all_wrong(sides: tuple[tuple[int, int, int], ...]) -> tuple[float, float]:
    """The p and drop with every candidate answer wrong (cached: the early stop asks often)."""
    worst = [Pair(str(i), c, k, 0, runs) for i, (c, k, runs) in enumerate(sides)]
    return evidence(worst).p, _drop(worst)
