"""The noise-aware baseline test: worse than the baseline beyond its own run-to-run noise? Pure.

Batched GPU serving is not deterministic even at temperature 0: the same model
answers some problems right in one run and wrong in the next. A gate that
counts every flip as evidence (``--gsm8k-max-drop 0``) fails unchanged
builds; a tolerance wide enough to absorb the noise (vLLM's ``threshold -
0.08``) misses real drops. This module measures the noise instead, from a
baseline recorded ``K`` times per problem (``--gsm8k-repeats K``), and tests
the candidate against it. A regression has two shapes, and the test has a
statistic for each: stable problems break (a broken template, a bad kernel on
some inputs), or the rates of the noisy problems drift down a little (a
quantization, a kernel or scheduler change).

The model
=========

Problem ``i`` has an unknown success rate ``θ_i`` under the baseline model. The
baseline saw ``c_i`` correct of ``K_i`` runs, the candidate ``d_i`` of ``L_i``
(``L_i = 1`` for a single run, more with ``--gsm8k-repeats`` on the candidate).
Runs are independent given ``θ_i``. The null hypothesis "no regression" is
``θ'_i = θ_i`` for every problem (an improvement anywhere only makes the test
more conservative: given its total, ``D_i`` follows Fisher's noncentral
hypergeometric law, stochastically larger when ``θ'_i > θ_i``).

The conditional null (no prior, no estimated rates)
===================================================

Under the null, the ``N_i = K_i + L_i`` runs of problem ``i`` are exchangeable.
Given their total ``t_i = c_i + d_i``, which runs hold the successes is uniform,
so ``D_i`` given ``t_i`` is hypergeometric::

    P(D_i = d | t_i) = C(t_i, d) C(N_i - t_i, L_i - d) / C(N_i, L_i)

and this does not depend on ``θ_i``. Conditioning on every ``t_i`` makes both
statistics below exact whatever the rates are. In particular a problem right in
``K`` of ``K`` baseline runs is not treated as certain (a 0.9-rate problem is
right 5 of 5 times 59% of the time): if the candidate misses it once, its null
probability of doing so is ``L / (K + L)`` given the total, not 0, so serving
noise on such problems is inside the null. Problems with ``t_i = 0`` or ``t_i =
N_i`` carry no information and drop out, as concordant pairs do in McNemar's
test. With ``K_i = L_i = 1`` both statistics *are* the exact one-sided McNemar
test.

Statistic 1, flips: each problem weighs its own surprise
========================================================

Per problem the surprise is that of the candidate doing this badly or worse,
``u_i = -ln P(D_i <= d_i | t_i)``, and the score is ``s_i = u_i⁴ / u_max²``,
where ``u_max = ln C(K_i + L_i, L_i)`` is the surprise of the most extreme
outcome (right in every baseline run, wrong in every candidate run); ``S = Σ
s_i``. With K = 5 and one candidate run, a problem right 5 of 5 times that fails
now (``t = 5`` of 6 runs, ``P(D = 0) = 1/6``) has ``s = ln² 6 = 3.21``; one
right 4 of 5 times (``P = 1/3``) ``s = ln⁴ 3 / ln² 6 = 0.45``; 3 of 5, 0.07; 1
of 5, 0.00001. The weights are steep because a stable break lands on the extreme
outcome only, while serving noise fills every stratum: each weight given to the
4-of-5 and 3-of-5 problems adds null variance and no signal (the most powerful
test against "problems right in every run now fail" counts the extreme outcomes
alone; the count loses to its discreteness and misses a partial break with
candidate repeats, such as a problem now right 1 of 5 times). Simulated
(``benchmarks/bench_gate.py``, K = 5, one candidate run, 1-point stable break,
the flips at ``alpha / 4``, 1,000 reruns): ``u²`` 74% (uniform family) and 43%
(beta), ``u⁴ / u_max²`` 82% and 48%, the count 80% and 49% (400 reruns); on 10%
noisy problems at 0.5 all of them 98%. Dividing by ``u_max²`` keeps the largest
score where ``u²`` had it. Scores are rounded to integer units (``RESOLUTION
u_max²`` for the extreme outcome; observed and null alike: resolution is lost,
never validity), and ``P(S* >= S_obs)`` is the convolution of the per-problem
score laws with the running total capped at ``S_obs``, ``O(m S_obs)``; in a
collapse a Chernoff bound below ``1e-12`` is returned instead (an upper bound on
``p``: the same verdict).

What one candidate run can see of a stable break. A problem that broke looks
like one right K of K times that fails by noise, and how often those fail
cannot be estimated from K runs alone (``θ^K (1 - θ)`` has no unbiased
estimate from K Bernoulli draws): the conditional null estimates it from the
candidate's run, as McNemar does. Against a 1-point break (13 of 1,319
problems) on the benchmark's noisy families, with K = 5 and one candidate run,
none of the exact tests tried reaches 95% even with the whole alpha: the count
of extreme outcomes is caught 90% (uniform) and 63% (beta) of the time, the
squared surprise (this gate before it had a rate statistic, blind to spread
shifts) 88% and 64%; only an oracle that knows every rate does better, 99.9%
and 83% (2,000 and 20,000 reruns). What closes it is candidate repeats: with 5
the extreme outcome has null probability ``1 / C(10, 5) = 1/252`` and every
family is caught in all but a few of 1,000 reruns.

Statistic 2, the rate difference
================================

The flip statistic is nearly blind to a drift of the noisy rates: each noisy
problem failing once more is hardly a surprise, and the squared weights spend
the power elsewhere. The estimate of the drop itself is the difference of the
mean rates, ``Δ = Σ (c_i / K_i - d_i / L_i)`` (in problems; ``/ n`` for
accuracy). Given the totals, ``c_i = t_i - d_i``, so ``Δ = Σ t_i / K_i - Σ w_i
d_i`` with ``w_i = 1 / K_i + 1 / L_i``: a large ``Δ`` is a small ``U = Σ a_i
d_i`` with integer ``a_i ∝ w_i`` (all 1 when every problem has the same ``K``
and ``L``). Its conditional p-value ``P(U* <= U_obs)`` comes from the law of ``U``, the
convolution of the hypergeometric laws (equal laws raised to their count by squaring,
ends below ``1e-20`` dropped: within ``1e-15`` of exact). Its null variance, in
problems, is ``sigma² = Σ w_i v_i`` with ``v_i = t_i (N_i - t_i) / (N_i (N_i -
1))``, the unbiased estimate of ``θ_i (1 - θ_i)`` from all ``N_i`` runs: the
known-variance z-test on ``Δ`` (variance ``Σ θ_i (1 - θ_i) w_i``) in
expectation, which is why the two have the same power (simulated:
``benchmarks/bench_gate.py``). The opposite tail, ``P(U* >= U_obs)``, is a rise
noise cannot explain: the gate warns on it (a changed prompt or extractor, the
wrong model, contamination), it never fails on it.

One null, alpha split
=====================

Both statistics are tests of the same conditional null. The gate's p-value is
the weighted Bonferroni combination ``p = min(1, p_S / FLIP_SHARE, p_U / (1 -
FLIP_SHARE))``: ``P(p < alpha) <= FLIP_SHARE alpha + (1 - FLIP_SHARE) alpha``,
exact, deterministic, with no simulation. With ``K = L = 1`` everywhere the two
statistics are the same McNemar test and ``p = p_U``, computed as the binomial
tail of the discordant pairs (``O(m)``, and exactly McNemar's). The
split costs the rate statistic ``z_{1 - 0.75 alpha}`` instead of ``z_{1 -
alpha}`` (2.43 against 2.33 at 0.01: a few points of power). More alpha for the
flips buys little and costs the rate statistic what the issue's other target
needs: at 3/8 a 1-point stable break (K = 5, one candidate run) is caught 88%
(uniform) and 57% (beta) of the time instead of 84% and 50% at 1/4 on the same
500 reruns, and a 1-point spread shift on 10% noisy problems at 0.5 falls 9
points below the known-variance z-test with K = 3 and K = 5. The split is fixed,
never chosen from the data: one chosen from the totals would keep the test exact
but break the monotonicity below (one more failure changes a total, hence the
split), and one chosen from the baseline's outcomes alone is not exact given the
totals. Nor would the minimum of the two p-values under their joint null gain:
it reclaims only the alpha both reject on, and under the null they hardly
overlap (both below their share in 0 and 3 of 10,000 reruns, K = 5, one
candidate run, uniform and beta families).

Monotone in every outcome (what the early stop relies on)
=========================================================

For ``L_i = 1``, let ``R`` be the null sum over the other problems and ``r``
their observed part. Flips: if problem ``i`` fails (``t = c``) its score law is
``z`` with probability ``q = P(D = 0 | c)``, else 0, and ``p_fail = q P(R >= r)
+ (1 - q) P(R >= r + z) <= P(R >= r)``; if it succeeds it adds a nonnegative law
and 0 observed, so ``p_succ >= P(R >= r)``. Rate: if it fails, ``p_fail = P(R +
a B <= r) <= P(R <= r)`` (``B`` its Bernoulli law); if it succeeds, ``p_succ =
P(R + a B' <= r + a) >= P(R <= r)``. Hence each further failure can only lower
both p-values and their combination, and over problems not seen yet the
extremes of ``p`` are "all fail" and "all succeed": the early stop's verdicts
are certain (``tests/unit/core/test_calibrated.py`` checks it on random small
cases). For ``L_i > 1`` it does not hold, so with repeats on the candidate the
early stop leaves this gate to the end of the run.

What the gate can see
=====================

:func:`reach` is the smallest drop the test detects with the given power,
for the least favourable shape: a drop spread thin over the noisy problems,
which the flip statistic hardly sees, so the rate statistic must, at its level
``alpha' = (1 - FLIP_SHARE) alpha``. Under such a drop ``Δ`` is about normal
with mean the drop and the null's standard deviation ``sigma``, so the drop seen
with power ``1 - beta`` is ``(z_{1 - alpha'} + z_{1 - beta}) sigma`` problems (the
power of a one-sided z-test, e.g. Lachin 1981, "Introduction to sample size
determination and power analysis for clinical trials", Controlled Clinical
Trials 2:93-113). It is never below the drop that alone reaches ``alpha'``:
``m`` problems failing every candidate run from ``K`` of ``K`` have ``p =
C(K + L, L)^-m``. Since ``sigma² = Σ v_i (1 / K + 1 / L)``, the candidate repeats
``L`` that bring it to one point are the smallest with ``(z_{1 - alpha'} +
z_{1-beta})² Σ v_i (1 / K + 1 / L) <= (n / 100)²``; none, when the baseline's own
``1 / K`` share is already too large (record it with more repeats).
``benchmarks/bench_gate.py`` checks the claim against the simulated 80%-power
drop for three noise families.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from statistics import NormalDist
from typing import Literal

from pytest_gsm8k.core.stats import (
    hypergeometric_pmf,
    mcnemar_one_sided,
    paired_difference_interval,
)

__all__ = [
    "FLIP_SHARE",
    "RESOLUTION",
    "Evidence",
    "Pair",
    "Reach",
    "Stability",
    "difference",
    "evidence",
    "flip_p_value",
    "p_value",
    "reach",
    "stability",
    "statistic",
]

#: score units: the most surprising outcome of a problem scores ``RESOLUTION u_max²``
#: (K = 5, one candidate run: 51 units, a 4-of-5 problem failing 7, a 3-of-5 one 1), fine
#: enough for the stable flips, coarse enough that a full run's exact p costs milliseconds
RESOLUTION = 16
#: above this many steps (informative problems x observed score) the Chernoff bound is
#: tried first (see the module docstring)
_EXACT_WORK = 3_000_000
#: a Chernoff bound below this is returned instead of the exact tail
_NEGLIGIBLE = 1e-12
#: mass dropped at each end of a partial law of the rate statistic (see _convolve)
_DROPPED = 1e-20
#: the share of alpha the flip statistic gets; the rate statistic gets the rest
FLIP_SHARE = 0.25
#: integer weights of the rate statistic above this are rounded (an unusual mix of K and L)
_MAX_WEIGHT = 64

Stability = Literal["stable-correct", "stable-wrong", "noisy"]
#: a law of a sum: (its smallest value, the probabilities of it and each next integer)
_Law = tuple[int, list[float]]


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
    def failing(self) -> bool:
        """Newly failing: right in some baseline run, wrong in some candidate run now."""
        return self.base_correct > 0 and self.now_correct < self.now_runs

    @property
    def stable_flip(self) -> bool:
        """Right in every one of several baseline runs, wrong at least once now: the
        regressions worth reading first (a single-run baseline has none: it cannot tell)."""
        return self.base_runs > 1 and self.base_correct == self.base_runs and self.failing

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
    """``round(RESOLUTION * u ** 4 / u_max ** 2)`` for ``d = 0..after``, ``u = -ln P(D <= d |
    total)`` and ``u_max = ln C(before + after, after)``, the surprise of a problem right in
    every baseline run and wrong in every candidate run (0 where ``P(D <= d) = 0``: an
    impossible outcome is never observed and has no mass)."""
    pmf = hypergeometric_pmf(total, before, after)
    most = math.log(hypergeometric_pmf(before, before, after)[0]) ** 2  # 1 / C(K + L, L)
    scores: list[int] = []
    below = 0.0
    for prob in pmf:
        below += prob
        if prob == 0.0 and below == 0.0:
            scores.append(0)
        else:
            scores.append(round(RESOLUTION * math.log(min(1.0, below)) ** 4 / most))
    return tuple(scores)


def _informative(pairs: Iterable[Pair]) -> list[Pair]:
    return [p for p in pairs if 0 < p.base_correct + p.now_correct < p.base_runs + p.now_runs]


def statistic(pairs: Iterable[Pair]) -> int:
    """``S``: the summed integer scores (in units of ``1 / RESOLUTION`` nats)."""
    return sum(p.score for p in pairs)


def flip_p_value(pairs: Sequence[Pair]) -> float:
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


def _weights(informative: Sequence[Pair]) -> list[int]:
    """The rate statistic's integer weights ``a_i ∝ 1 / K_i + 1 / L_i`` (all 1 when every
    problem has the same runs; rounded, which keeps the test exact, when they would be
    large: the statistic is then a close cousin of ``Δ``, tested exactly all the same)."""
    fractions = [Fraction(1, p.base_runs) + Fraction(1, p.now_runs) for p in informative]
    if not fractions:
        return []
    common = math.lcm(*(f.denominator for f in fractions))
    numerators = [int(f * common) for f in fractions]
    divisor = math.gcd(*numerators)
    weights = [x // divisor for x in numerators]
    if max(weights) > _MAX_WEIGHT:
        top = max(fractions)
        weights = [max(1, round(_MAX_WEIGHT * f / top)) for f in fractions]
    return weights


def _convolve(a: _Law, b: _Law) -> _Law:
    """The law of the sum of two independent laws ``(offset, pmf)``, its negligible ends
    dropped: at most :data:`_DROPPED` of mass at each end, so each p-value is within
    ``1e-15`` of the exact tail, and a law stays about 20 standard deviations wide."""
    (start, x), (shift, y) = (a, b) if len(a[1]) >= len(b[1]) else (b, a)
    out = [0.0] * (len(x) + len(y) - 1)
    for j, q in enumerate(y):
        if q:
            out[j : j + len(x)] = [o + q * v for o, v in zip(out[j : j + len(x)], x, strict=True)]
    low, high, mass = 0, len(out), 0.0
    while low < high - 1 and mass + out[low] <= _DROPPED:
        mass += out[low]
        low += 1
    mass = 0.0
    while high - 1 > low and mass + out[high - 1] <= _DROPPED:
        mass += out[high - 1]
        high -= 1
    return start + shift + low, out[low:high]


def _sum_law(laws: Iterable[tuple[int, Sequence[float]]]) -> _Law:
    """The law of ``Σ a X`` for independent ``X`` with the given pmfs over ``0, 1, ...``
    and integer weights ``a``. A full split has a few hundred distinct laws at most: each
    is raised to its count by squaring, and the powers are summed smallest first, so the
    cost grows with the width of the result, not with the problems times their runs (one
    by one, 1,319 problems with 100 runs a side took hours)."""
    parts: list[tuple[int, int, _Law]] = []
    for (weight, pmf), count in Counter((a, tuple(p)) for a, p in laws).items():
        spread = [0.0] * (weight * (len(pmf) - 1) + 1)
        spread[::weight] = pmf
        law, power = (0, spread), (0, [1.0])
        while count:
            if count & 1:
                power = _convolve(power, law)
            count >>= 1
            if count:
                law = _convolve(law, law)
        parts.append((len(power[1]), len(parts), power))
    heapq.heapify(parts)
    while len(parts) > 1:
        _, _, a = heapq.heappop(parts)
        _, order, b = heapq.heappop(parts)
        total = _convolve(a, b)
        heapq.heappush(parts, (len(total[1]), order, total))
    return parts[0][2] if parts else (0, [1.0])


def rate_p_values(pairs: Sequence[Pair]) -> tuple[float, float]:
    """The rate statistic's exact conditional p-values: ``(drop, rise)``, i.e. ``P(U* <=
    U_obs)`` and ``P(U* >= U_obs)`` (see the module docstring)."""
    informative = _informative(pairs)
    if all(p.base_runs == p.now_runs == 1 for p in informative):
        # one run a side: U is Binomial(m, 1/2) over the m discordant pairs, the exact
        # McNemar tails, exactly
        passing = sum(p.now_correct for p in informative)
        failing = len(informative) - passing
        return mcnemar_one_sided(failing, passing), mcnemar_one_sided(passing, failing)
    weights = _weights(informative)
    start, law = _sum_law(
        (weight, hypergeometric_pmf(p.base_correct + p.now_correct, p.base_runs, p.now_runs))
        for p, weight in zip(informative, weights, strict=True)
    )
    observed = sum(w * p.now_correct for p, w in zip(informative, weights, strict=True)) - start
    below = math.fsum(law[: max(0, observed + 1)])
    above = math.fsum(law[max(0, observed) :])
    return min(1.0, below), min(1.0, above)


@dataclass(frozen=True)
class Evidence:
    """The test's p-values on one comparison: ``flip`` (statistic 1), ``drop`` and
    ``rise`` (statistic 2's two tails); ``p`` is the gate's: their combination, or with
    one run a side (``mcnemar``, where both statistics are McNemar's) ``drop`` itself."""

    flip: float
    drop: float
    rise: float
    mcnemar: bool = False

    @property
    def p(self) -> float:
        if self.mcnemar:
            return self.drop
        return min(1.0, self.flip / FLIP_SHARE, self.drop / (1.0 - FLIP_SHARE))


def _mcnemar(pairs: Sequence[Pair]) -> bool:
    """One run a side everywhere: both statistics are the exact McNemar test."""
    return all(p.base_runs == 1 and p.now_runs == 1 for p in pairs)


def evidence(pairs: Sequence[Pair]) -> Evidence:
    """Both statistics' exact conditional p-values (see the module docstring)."""
    return _evidence(tuple(pairs))


@lru_cache(maxsize=8)
def _evidence(pairs: tuple[Pair, ...]) -> Evidence:
    """Cached: the gate, the report's block and the rise warning ask about the same pairs."""
    drop, rise = rate_p_values(pairs)
    if _mcnemar(pairs):
        return Evidence(drop, drop, rise, mcnemar=True)
    return Evidence(flip_p_value(pairs), drop, rise)


def p_value(pairs: Sequence[Pair]) -> float:
    """The gate's p-value (:attr:`Evidence.p`)."""
    return evidence(pairs).p


def difference(pairs: Sequence[Pair], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(diff, low, high)``: the candidate's mean rate minus the baseline's over the
    pairs, with its interval; the one estimate every line against a baseline shows.

    Problems are the unit: with one run a side it is Newcombe's interval for paired
    proportions (core/stats.py); with repeats, the normal interval of the mean of the
    per-problem differences ``now_rate - base_rate``, whose variance ``Σ (δ_i - δ̄)² /
    (n (n - 1))`` holds both sides' run-to-run noise and the problems' spread (the paired
    t-interval, treating problems as the sampled unit)."""
    n = len(pairs)
    if n == 0:
        return 0.0, -1.0, 1.0
    if _mcnemar(pairs):
        cells = Counter((p.base_correct, p.now_correct) for p in pairs)
        return paired_difference_interval(
            cells[1, 1], cells[1, 0], cells[0, 1], cells[0, 0], confidence
        )
    deltas = [p.now_rate - p.base_rate for p in pairs]
    diff = math.fsum(deltas) / n
    if n < 2:
        return diff, -1.0, 1.0
    var = math.fsum((x - diff) ** 2 for x in deltas) / (n * (n - 1))
    half = NormalDist().inv_cdf(0.5 + confidence / 2) * math.sqrt(var)
    return diff, max(-1.0, diff - half), min(1.0, diff + half)


@dataclass(frozen=True)
class Reach:
    """What the gate can see (:func:`reach`): the spread drop it detects with ``power``,
    in problems and in points of the ``n`` problems, and how many candidate repeats would
    bring that to one point with this baseline (None: none up to ``most``)."""

    problems: float
    points: float
    power: float
    repeats_for_one_point: int | None


def reach(pairs: Sequence[Pair], alpha: float, power: float = 0.8, most: int = 100) -> Reach:
    """The smallest drop the test detects with ``power`` at level ``alpha``, for the least
    favourable shape (a drop spread over the noisy problems; see the module docstring)."""
    n = len(pairs)
    if n == 0:
        return Reach(0.0, 0.0, power, None)
    level = alpha if _mcnemar(pairs) else (1.0 - FLIP_SHARE) * alpha
    normal = NormalDist()
    z = normal.inv_cdf(1.0 - level) + normal.inv_cdf(power)
    base_share = now_share = 0.0
    for pair in pairs:
        runs = pair.base_runs + pair.now_runs
        total = pair.base_correct + pair.now_correct
        v = total * (runs - total) / (runs * (runs - 1))
        base_share += v / pair.base_runs
        now_share += v / pair.now_runs
    before = max(p.base_runs for p in pairs)

    def drop(now_share: float, after: int) -> float:
        # m problems failing every candidate run from K of K alone: p = C(K + L, L)^-m
        alone = math.ceil(
            math.log(1.0 / level) / -math.log(hypergeometric_pmf(before, before, after)[0])
        )
        return max(z * math.sqrt(base_share + now_share), float(alone))

    after = max(p.now_runs for p in pairs)
    problems = drop(now_share, after)
    plain = now_share * after  # Σ v_i at one candidate run
    enough = next((r for r in range(1, most + 1) if drop(plain / r, r) <= n / 100), None)
    return Reach(problems, 100 * problems / n, power, enough)
