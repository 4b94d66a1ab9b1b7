"""The noise-aware baseline test: worse than the baseline beyond its own run-to-run noise? Pure.

Batched serving answers some problems differently from run to run even at temperature 0, so
this module measures the noise from a baseline of K runs per problem and tests the candidate
against it. What it catches, simulated: docs/baselines.md and benchmarks/README.md
(``benchmarks/bench_gate.py``). The derivation:

**Model and null.** Problem ``i`` has an unknown rate ``θ_i``; the baseline saw ``c_i`` right
of ``K_i`` runs, the candidate ``d_i`` of ``L_i``; runs are independent given ``θ_i``. The
null "no regression" is ``θ'_i = θ_i`` for every ``i`` (an improvement makes ``D_i`` given its
total stochastically larger: Fisher's noncentral hypergeometric law, so only more
conservative). Under the null the ``N_i = K_i + L_i`` runs are exchangeable, so given the
total ``t_i = c_i + d_i``, ``D_i`` is hypergeometric, ``P(D_i = d | t_i) = C(t_i, d)
C(N_i - t_i, L_i - d) / C(N_i, L_i)``, free of ``θ_i``: conditioning on every ``t_i`` makes
both statistics exact whatever the rates. A problem right K of K times is not certain (a
candidate miss has null probability ``L / (K + L)``); problems with ``t_i`` = 0 or ``N_i``
drop out, as concordant pairs do in McNemar's test, which both statistics are when ``K_i =
L_i = 1``.

**Statistic 1, flips.** ``u_i = -ln P(D_i <= d_i | t_i)``, scored ``s_i = u_i⁴ / u_max²``
with ``u_max = ln C(K_i + L_i, L_i)`` (the most extreme outcome), ``S = Σ s_i``. Steep weights,
because a stable break lands on the extreme outcome while noise fills every stratum. Scores
are rounded to integer units (``RESOLUTION u_max²`` for the extreme; observed and null alike,
so only resolution is lost); ``P(S* >= S_obs)`` is the convolution of the per-problem laws
capped at ``S_obs``, ``O(m S_obs)``; when that is large, a Chernoff bound below ``1e-12`` is
returned instead (an upper bound on ``p``: the same verdict).

**Statistic 2, the rate difference.** ``Δ = Σ (c_i / K_i - d_i / L_i)``. Given the totals ``c_i
= t_i - d_i``, so ``Δ = Σ t_i / K_i - Σ w_i d_i`` with ``w_i = 1 / K_i + 1 / L_i``: a large
``Δ`` is a small ``U = Σ a_i d_i``, integer ``a_i ∝ w_i``. ``P(U* <= U_obs)`` comes from the law
of ``U``: equal laws raised to their count by squaring, summed smallest first, ends below
``1e-20`` dropped (within ``1e-15`` of exact). Its null variance ``sigma² = Σ w_i v_i``, ``v_i =
t_i (N_i - t_i) / (N_i (N_i - 1))`` (unbiased for ``θ_i (1 - θ_i)``), is the known-variance
z-test's in expectation. The other tail ``P(U* >= U_obs)`` is a rise noise cannot explain:
warned about, never failed on.

**One null, alpha split.** ``p = min(1, p_S / FLIP_SHARE, p_U / (1 - FLIP_SHARE))``, a
weighted Bonferroni bound: ``P(p < alpha) <= alpha``, exact, no simulation. With ``K = L = 1``
everywhere ``p = p_U``, the binomial McNemar tail in ``O(m)``. The split is fixed: one chosen
from the totals would break the monotonicity below, one from the baseline alone is not exact
given the totals.

**Monotone in every outcome** (the early stop relies on it). For ``L_i = 1``, with ``R`` the
null sum over the other problems and ``r`` their observed part: flips, a failure scores ``z``
with probability ``q = P(D = 0 | c)``, so ``p_fail = q P(R >= r) + (1 - q) P(R >= r + z) <=
P(R >= r)``, while a success adds a nonnegative law and 0 observed, ``p_succ >= P(R >= r)``;
rate, ``p_fail = P(R + a B <= r) <= P(R <= r) <= P(R + a B' <= r + a) = p_succ``. Each further
failure can only lower both p-values and their combination, so over unseen problems "all
fail" and "all succeed" are the extremes. Not for ``L_i > 1``: the early stop waits then.

**What the gate can see** (:func:`reach`): the least favourable shape is a drop spread thin
over the noisy problems, which only the rate statistic sees, at ``alpha' = (1 - FLIP_SHARE)
alpha``. ``Δ`` is then about normal with the null's ``sigma``, so the drop seen with power ``1 -
beta`` is ``(z_{1 - alpha'} + z_{1 - beta}) sigma`` problems (Lachin 1981, Controlled Clinical
Trials 2:93-113), and never below what alone reaches ``alpha'``: ``m`` problems failing every
run from K of K give ``p = C(K + L, L)^-m``. The candidate repeats that bring it to one point
are the smallest ``L`` with ``(z_{1 - alpha'} + z_{1-beta})² Σ v_i (1 / K + 1 / L) <= (n /
100)²``; none when the baseline's own ``1 / K`` share is already too large.
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
    """One problem's null law of integer scores given its total: (score, probability)."""
    pmf = hypergeometric_pmf(total, before, after)
    scores = _scores(total, before, after)
    law: dict[int, float] = {}
    for d, prob in enumerate(pmf):
        if prob > 0.0:
            law[scores[d]] = law.get(scores[d], 0.0) + prob
    return tuple(sorted(law.items()))


@lru_cache(maxsize=4096)
def _scores(total: int, before: int, after: int) -> tuple[int, ...]:
    """``round(RESOLUTION u⁴ / u_max²)`` for ``d = 0..after`` (0 for an impossible ``d``)."""
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
    """``min_λ e^{-λ S_obs} Π E[e^{λ s_i}]`` over a grid of λ: an upper bound on the tail
    (problems of the same law share one factor, raised to their count)."""
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
    """The rate statistic's integer weights ``a_i ∝ 1 / K_i + 1 / L_i``, rounded when large
    (the statistic is then a close cousin of ``Δ``, still tested exactly)."""
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
    """The p-values of statistic 1 (``flip``) and statistic 2's tails (``drop``, ``rise``);
    ``p`` is the gate's (``drop`` itself when both statistics are McNemar's)."""

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
    """Both statistics' exact conditional p-values (see the module docstring). Not cached:
    the verdict step computes it once per group and hands it to each reader."""
    drop, rise = rate_p_values(pairs)
    if _mcnemar(pairs):
        return Evidence(drop, drop, rise, mcnemar=True)
    return Evidence(flip_p_value(pairs), drop, rise)


def p_value(pairs: Sequence[Pair]) -> float:
    """The gate's p-value (:attr:`Evidence.p`)."""
    return evidence(pairs).p


def difference(pairs: Sequence[Pair], confidence: float = 0.95) -> tuple[float, float, float]:
    """``(diff, low, high)``: the candidate's mean rate minus the baseline's, with its
    interval, the one estimate every line against a baseline shows. Problems are the unit:
    Newcombe's paired interval with one run a side, else the normal interval of the mean
    per-problem difference (its variance holds both sides' noise and the problems' spread)."""
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
    """The spread drop the gate detects with ``power`` (:func:`reach`), in problems and
    points, and the candidate repeats that would bring it to one point (None: none)."""

    problems: float
    points: float
    power: float
    repeats_for_one_point: int | None


def reach(pairs: Sequence[Pair], alpha: float, power: float = 0.8, most: int = 100) -> Reach:
    """The smallest drop detected with ``power`` at ``alpha``, for the least favourable
    shape (see the module docstring)."""
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
