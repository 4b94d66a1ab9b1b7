"""The noise-aware baseline test: worse than the baseline beyond its own run-to-run noise? Pure.

Batched GPU serving is not deterministic even at temperature 0: the same model
answers some problems right in one run and wrong in the next. A gate that
counts every flip as evidence (``--gsm8k-max-drop 0``) fails unchanged
builds; a tolerance wide enough to absorb the noise (vLLM's ``threshold -
0.08``) misses real drops. This module measures the noise instead, from a
baseline recorded ``K`` times per problem (``--gsm8k-repeats K``), and tests
the candidate against it. It is written for the case where most problems are
stable and a minority flips, which is what serving noise looks like.

The model
=========

Problem ``i`` has an unknown success rate ``θ_i`` under the baseline model. The
baseline saw ``c_i`` correct of ``K_i`` runs, the candidate ``d_i`` of ``L_i``
(``L_i = 1`` for a single run, more with ``--gsm8k-repeats`` on the candidate).
Runs are independent given ``θ_i``. The null hypothesis "no regression" is
``θ'_i = θ_i`` for every problem (an improvement anywhere only makes the test
more conservative).

The conditional null (no prior, no estimated rates)
===================================================

Under the null, the ``K_i + L_i`` runs of problem ``i`` are exchangeable. Given
their total ``t_i = c_i + d_i``, which runs hold the successes is uniform, so
``D_i`` given ``t_i`` is hypergeometric::

    P(D_i = d | t_i) = C(t_i, d) C(K_i + L_i - t_i, L_i - d) / C(K_i + L_i, L_i)

and this does not depend on ``θ_i``. Conditioning on every ``t_i`` makes the
test exact whatever the rates are: the estimation error of rates from ``K``
repeats, the question the issue raises, never enters, because no rate is
estimated. Problems with ``t_i = 0`` or ``t_i = K_i + L_i`` (never or always
right in every run) carry no information and drop out, exactly as concordant
pairs do in McNemar's test. With ``K_i = L_i = 1`` the test *is* the exact
one-sided McNemar test (every informative problem is a discordant pair, and
each weighs the same).

The statistic: each problem weighs its own surprise, squared
===========================================================

Per problem the surprise is that of the candidate doing this badly or worse,
``u_i = -ln P(D_i <= d_i | t_i)`` (0 when ``d_i`` is the most the problem
could have scored), and the score is ``s_i = u_i ** 2``; ``S = Σ s_i``. It
weighs what the issue asks for: a problem right 5 of 5 times that fails now
(``t = 5`` of 6 runs, ``P(D = 0) = 1/6``) has ``u = ln 6 = 1.79``, ``s =
3.21``; one right 3 of 5 times that fails (``P = 1/2``) ``u = 0.69``, ``s =
0.48``; one right 1 of 5 times ``s = 0.03``. A plain count of failures weighs
them alike and lets the flips of problems that flip anyway drown a real drop;
Fisher's combination (``Σ u_i``, the log of the product of the problems' own
conditional p-values) does better; squaring moves more of the say to the stable
problems, where serving noise does not live. Simulated (``python
benchmarks/bench_gate.py --reruns 10000``: 1,319 problems, 10% flipping at p =
0.5, K = 5, 13 always-right problems turned wrong), the test's power at level
0.001 is 11% for the count, 75% for ``Σ u`` and 98% for ``Σ u²`` (34%, 95% and
100% at 0.01), with false alarms at or below the level for all three. Any
fixed weights keep the test exact; these are chosen for the failure a release
gate exists for.

Scores are rounded to integer units of ``1 / RESOLUTION``. The rounded ``S`` is
the statistic (observed and null alike), so rounding costs a little
resolution, never validity. The p-value ``P(S* >= S_obs)`` is then exact: the
null law of ``S*`` is the convolution of the per-problem score laws, summed
with the running total capped at ``S_obs`` (scores are never negative, so a
partial sum that reaches it stays there), which costs ``O(m * S_obs)`` for
``m`` informative problems. When that is large (a collapse: hundreds of
stable problems failing) and the Chernoff bound ``min_λ e^{-λ S_obs} Π
E[e^{λ s_i}]`` is already below ``1e-12``, that bound is returned: an upper
bound on ``p``, so the verdict it gives is the exact test's.

Monotone in every outcome (what the early stop relies on)
=========================================================

For ``L_i = 1``: let ``R`` be the null sum over the other problems and ``r``
their observed part. If problem ``i`` fails (``t = c``) its score law is
``z`` with probability ``q = P(D = 0 | c)``, else 0, and ``p_fail = q P(R >=
r) + (1 - q) P(R >= r + z) <= P(R >= r)``; if it succeeds (``t = c + 1``) it
adds a nonnegative law and 0 observed, so ``p_succ = P(R + X >= r) >= P(R >=
r)``. Hence each further failure can only lower ``p``, and over problems not
seen yet the extremes of ``p`` are "all fail" and "all succeed": the early
stop's verdicts are certain, as for the count gates (the tests check it on
random small cases, ``tests/unit/core/test_calibrated.py``). For ``L_i > 1`` it
does not hold (a problem going from 1 to 2 of 2 can *lower* ``p``: it moves to a
stratum whose null law is wider), so with repeats on the candidate the early
stop leaves this gate to the end of the run.

What the gate can see
=====================

:func:`detectable_drop` is the smallest drop, in problems turned from always
right to wrong, the test detects with the given power. Each such problem adds
``w = ln² C(K + L, L)`` to ``S``, but it also becomes informative itself: the
null mean grows by its conditional mean ``mu_f = w / C(K + L, L)`` and the null
variance by its conditional variance ``v_f``. With ``sigma = sqrt(Σ Var(s_i |
t_i))`` over the informative problems the normal approximation asks for the
smallest ``m`` with ``m (w - mu_f) >= z_{1-alpha} sqrt(sigma² + m v_f) +
z_{power} sigma``, and at least the ``m`` that alone reach ``p < alpha``
(``C(K + L, L)^-m < alpha``). At n = 1319 with 10% of problems flipping at p =
0.5 and alpha 0.01 that is 29 problems for a single-run baseline (McNemar's
own power) and 8 for ``K = 5``. It is an approximation for a sentence;
``tests/unit/core/test_calibrated.py`` checks it against a simulation of the
test itself, and ``benchmarks/bench_gate.py`` against the real rate.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

from pytest_gsm8k.core.stats import hypergeometric_pmf

__all__ = [
    "RESOLUTION",
    "Pair",
    "Stability",
    "detectable_drop",
    "null_moments",
    "p_value",
    "stability",
    "statistic",
]

#: score units per squared nat: fine enough that the weights keep their order
#: (ln(6/5)² = 0.033 is 1 unit, ln 2² = 0.48 is 8, ln 6² = 3.21 is 51), coarse enough
#: that the exact p-value of a full run costs milliseconds
RESOLUTION = 16
#: above this many steps (informative problems x observed score) the Chernoff bound is
#: tried first (see the module docstring)
_EXACT_WORK = 3_000_000
#: a Chernoff bound below this is returned instead of the exact tail
_NEGLIGIBLE = 1e-12

Stability = Literal["stable-correct", "stable-wrong", "noisy"]


@dataclass(frozen=True)
class Pair:
    """One problem as the test sees it: baseline ``base_correct`` of ``base_runs``,
    candidate ``now_correct`` of ``now_runs``."""

    problem_id: str
    base_correct: int
    base_runs: int
    now_correct: int
    now_runs: int

    def __post_init__(self) -> None:
        if not (0 <= self.base_correct <= self.base_runs and self.base_runs >= 1):
            raise ValueError(f"{self.problem_id}: baseline {self.base_correct} of {self.base_runs}")
        if not (0 <= self.now_correct <= self.now_runs and self.now_runs >= 1):
            raise ValueError(f"{self.problem_id}: run {self.now_correct} of {self.now_runs}")

    @property
    def base_rate(self) -> float:
        return self.base_correct / self.base_runs

    @property
    def now_rate(self) -> float:
        return self.now_correct / self.now_runs

    @property
    def stability(self) -> Stability:
        return stability(self.base_correct, self.base_runs)

    @property
    def stable_flip(self) -> bool:
        """Always right in the baseline, wrong at least once now: the regressions worth
        reading first (with a single-run baseline every right problem counts as stable)."""
        return self.base_correct == self.base_runs and self.now_correct < self.now_runs

    @property
    def score(self) -> int:
        return _scores(self.base_correct + self.now_correct, self.base_runs, self.now_runs)[
            self.now_correct
        ]


def stability(correct: int, runs: int) -> Stability:
    """``stable-correct`` / ``stable-wrong`` when every run agreed, else ``noisy``."""
    if correct == runs:
        return "stable-correct"
    if correct == 0:
        return "stable-wrong"
    return "noisy"


@lru_cache(maxsize=4096)
def _law(total: int, before: int, after: int) -> tuple[tuple[int, float], ...]:
    """The null law of one problem's integer score given its total: (score, probability)
    pairs, zero scores merged, in increasing score."""
    pmf = hypergeometric_pmf(total, before, after)
    scores = _scores(total, before, after)
    law: dict[int, float] = {}
    for d, prob in enumerate(pmf):
        if prob > 0.0:
            law[scores[d]] = law.get(scores[d], 0.0) + prob
    return tuple(sorted(law.items()))


@lru_cache(maxsize=4096)
def _scores(total: int, before: int, after: int) -> tuple[int, ...]:
    """``round(RESOLUTION * ln(P(D <= d | total)) ** 2)`` for ``d = 0..after`` (0 where
    ``P(D <= d) = 0``: an impossible outcome is never observed and has no mass)."""
    pmf = hypergeometric_pmf(total, before, after)
    scores: list[int] = []
    below = 0.0
    for prob in pmf:
        below += prob
        if prob == 0.0 and below == 0.0:
            scores.append(0)
        else:
            scores.append(round(RESOLUTION * math.log(min(1.0, below)) ** 2))
    return tuple(scores)


def _informative(pairs: Iterable[Pair]) -> list[Pair]:
    return [p for p in pairs if 0 < p.base_correct + p.now_correct < p.base_runs + p.now_runs]


def statistic(pairs: Iterable[Pair]) -> int:
    """``S``: the summed integer scores (in units of ``1 / RESOLUTION`` nats)."""
    return sum(p.score for p in pairs)


def p_value(pairs: Sequence[Pair]) -> float:
    """Exact ``P(S* >= S_obs)`` under the conditional null (see the module docstring)."""
    informative = _informative(pairs)
    observed = statistic(informative)
    if observed <= 0:
        return 1.0
    if len(informative) * observed > _EXACT_WORK:
        bound = _chernoff(informative, observed)
        if bound < _NEGLIGIBLE:
            return bound
    top = observed
    # dist[x]: null probability that the partial sum is x (x < top) or >= top (x == top)
    dist = [0.0] * (top + 1)
    dist[0] = 1.0
    reach = 0  # highest index holding mass, below top
    for pair in informative:
        law = _law(pair.base_correct + pair.now_correct, pair.base_runs, pair.now_runs)
        new = [0.0] * (top + 1)
        new[top] = dist[top]
        span = reach + 1
        for score, prob in law:
            if score == 0:
                for x in range(span):
                    new[x] += prob * dist[x]
                continue
            keep = max(0, min(span, top - score))  # x + score < top
            for x in range(keep):
                new[x + score] += prob * dist[x]
            if keep < span:
                new[top] += prob * math.fsum(dist[keep:span])
        dist = new
        reach = min(top - 1, reach + law[-1][0])
    return min(1.0, dist[top])


def _chernoff(informative: Sequence[Pair], observed: int) -> float:
    """``min_λ e^{-λ S_obs} Π E[e^{λ s_i}]`` over a grid of λ: an upper bound on the tail.

    Problems with the same law (the same total and runs) share one factor, raised to their
    count: a full run has a handful of laws, so each λ costs a handful of sums."""
    strata = Counter(
        (pair.base_correct + pair.now_correct, pair.base_runs, pair.now_runs)
        for pair in informative
    )
    laws = [(_law(*key), count) for key, count in strata.items()]
    best = 0.0
    for step in range(1, 200):
        lam = 1e-4 * 1.08**step
        log_bound = -lam * observed
        for law, count in laws:
            top = law[-1][0]
            # log Σ p e^{λ z} computed around the largest exponent
            log_bound += count * (
                lam * top
                + math.log(math.fsum(prob * math.exp(lam * (score - top)) for score, prob in law))
            )
        best = min(best, log_bound)
    return math.exp(best)


def null_moments(pairs: Iterable[Pair]) -> tuple[float, float]:
    """Mean and variance of ``S*`` under the conditional null, in squared nats."""
    mean = var = 0.0
    for pair in _informative(pairs):
        law = _law(pair.base_correct + pair.now_correct, pair.base_runs, pair.now_runs)
        m1 = sum(prob * score for score, prob in law) / RESOLUTION
        m2 = sum(prob * score * score for score, prob in law) / RESOLUTION**2
        mean += m1
        var += m2 - m1 * m1
    return mean, var


def detectable_drop(pairs: Sequence[Pair], alpha: float, power: float = 0.8) -> int:
    """How many always-right problems must turn wrong for the test to see it with
    ``power`` at level ``alpha`` (see the module docstring; an approximation).

    Shift-aware: a flipped problem adds its observed score ``w`` to ``S``, but also joins
    the informative problems, raising the null mean by ``mu_f`` and the null variance by
    ``v_f`` (its own conditional law given ``t = K``). The smallest ``m`` with ``m (w -
    mu_f) >= z_{1-alpha} sqrt(sigma^2 + m v_f) + z_{power} sigma`` is returned. For ``K = L
    = 1`` that is McNemar's: half a flip's weight is its null mean, which a formula with the
    whole weight missed by a factor of two.
    """
    if not pairs:
        return 0
    before = max(p.base_runs for p in pairs)
    after = max(p.now_runs for p in pairs)
    law = _law(before, before, after)  # a stable problem now failing: t = K of K + L
    weight = _scores(before, before, after)[0] / RESOLUTION  # ln² C(K + L, L), rounded
    if weight <= 0:
        return len(pairs) + 1
    mean_f = sum(prob * score for score, prob in law) / RESOLUTION
    var_f = sum(prob * score * score for score, prob in law) / RESOLUTION**2 - mean_f**2
    _, var = null_moments(pairs)
    normal = NormalDist()
    z_alpha, z_power = normal.inv_cdf(1.0 - alpha), normal.inv_cdf(power)
    alone = math.ceil(math.log(1.0 / alpha) / math.sqrt(weight) - 1e-9)
    shift = weight - mean_f
    for m in range(1, len(pairs) + 1):
        if m * shift >= z_alpha * math.sqrt(var + m * var_f) + z_power * math.sqrt(var):
            return max(m, alone)
    return len(pairs) + 1
