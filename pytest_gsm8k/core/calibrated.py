"""The noise-aware baseline test: worse than the baseline beyond its own run-to-run noise
(batched serving flips some answers even at temperature 0)? Pure. The derivation:
docs/baselines.md#the-noise-aware-test."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from statistics import NormalDist

from pytest_gsm8k.core.stats import (
    Z95,
    hypergeometric_pmf,
    mcnemar_one_sided,
    paired_difference_interval,
)

#: score units: the most surprising outcome scores ``RESOLUTION u_max²`` (K = 5: 51 units, a
#: 4-of-5 problem failing 7): fine enough for stable flips, a full run's exact p in milliseconds
RESOLUTION = 16
#: above this many steps (informative problems x observed score) Chernoff's bound goes first
_EXACT_WORK = 3_000_000
#: a Chernoff bound below this is returned instead of the exact tail
_NEGLIGIBLE = 1e-12
_DROPPED = 1e-20
#: the share of alpha the flip statistic gets; the rate statistic gets the rest
FLIP_SHARE = 0.25
#: the rate statistic's integer weights above this are rounded (an unusual mix of K and L)
_MAX_WEIGHT = 64
#: the power the detectable drop is stated at
POWER = 0.8
#: the most repeats a side may hold (--gsm8k-repeats' own bound)
MAX_REPEATS = 100

#: a law of a sum: (its smallest value, the probabilities of it and each next integer)
_Law = tuple[int, list[float]]
#: a problem's scores with their null probabilities: (score, probability), by score
_Scores = tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class Pair:
    """One problem: baseline ``base_correct`` of ``base_runs``, candidate ``now_correct``."""

    problem_id: str
    base_correct: int
    base_runs: int
    now_correct: int
    now_runs: int

    @property
    def base_rate(self) -> float:
        return self.base_correct / self.base_runs

    @property
    def now_rate(self) -> float:
        return self.now_correct / self.now_runs

    @property
    def failing(self) -> bool:
        """Newly failing: right in some baseline run, wrong in some candidate run now."""
        return self.base_correct > 0 and self.now_correct < self.now_runs

    @property
    def stable_flip(self) -> bool:
        """Right in all of several baseline runs, wrong now: the regressions to read first."""
        return self.base_runs > 1 and self.base_correct == self.base_runs and self.failing

    @property
    def score(self) -> int:
        scores, _ = _null(self.base_correct + self.now_correct, self.base_runs, self.now_runs)
        return scores[self.now_correct]


@lru_cache(maxsize=4096)
def _null(total: int, before: int, after: int) -> tuple[tuple[int, ...], _Scores]:
    """One problem's integer scores ``round(RESOLUTION u⁴ / u_max²)`` for ``d = 0..after`` (0
    for an impossible ``d``), and their null law given its total: (score, probability)."""
    pmf = hypergeometric_pmf(total, before, after)
    most = math.log(hypergeometric_pmf(before, before, after)[0]) ** 2  # 1 / C(K + L, L)
    scores = tuple(
        0 if below == 0.0 else round(RESOLUTION * math.log(min(1.0, below)) ** 4 / most)
        for below in itertools.accumulate(pmf)
    )
    law: dict[int, float] = {}
    for score, prob in zip(scores, pmf, strict=True):
        if prob > 0.0:
            law[score] = law.get(score, 0.0) + prob
    return scores, tuple(sorted(law.items()))


def _informative(pairs: Iterable[Pair]) -> list[Pair]:
    return [p for p in pairs if 0 < p.base_correct + p.now_correct < p.base_runs + p.now_runs]


def flip_p_value(pairs: Sequence[Pair]) -> float:
    """Exact ``P(S* >= S_obs)`` under the conditional null."""
    informative = _informative(pairs)
    observed = sum(p.score for p in informative)  # S, in units of 1 / RESOLUTION nats
    if observed <= 0:
        return 1.0
    big = len(informative) * observed > _EXACT_WORK
    if big and (bound := _chernoff(informative, observed)) < _NEGLIGIBLE:
        return bound
    top = observed
    # dist[x]: null probability that the partial sum is x (x < top) or >= top (x == top)
    dist = [1.0] + [0.0] * top
    reach = 0  # highest index holding mass, below top
    for pair in informative:
        _, law = _null(pair.base_correct + pair.now_correct, pair.base_runs, pair.now_runs)
        new = [0.0] * (top + 1)
        new[top] = dist[top]
        span = reach + 1
        for score, prob in law:
            keep = max(0, min(span, top - score))  # x + score < top
            for x in range(keep):
                new[x + score] += prob * dist[x]
            if keep < span:
                new[top] += prob * math.fsum(dist[keep:span])
        dist = new
        reach = min(top - 1, reach + law[-1][0])
    return min(1.0, dist[top])


def _chernoff(informative: Sequence[Pair], observed: int) -> float:
    """``min_λ e^{-λ S_obs} Π E[e^{λ s_i}]`` over a grid of λ: an upper bound on the tail."""
    strata = Counter((p.base_correct + p.now_correct, p.base_runs, p.now_runs) for p in informative)
    laws = [(_null(*key)[1], count) for key, count in strata.items()]
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
    """``a_i ∝ 1 / K_i + 1 / L_i`` in integers, rounded when large (still an exact test)."""
    fractions = [Fraction(1, p.base_runs) + Fraction(1, p.now_runs) for p in informative]
    common = math.lcm(*(f.denominator for f in fractions))
    numerators = [int(f * common) for f in fractions]
    divisor = math.gcd(*numerators)
    weights = [x // divisor for x in numerators]
    if max(weights) > _MAX_WEIGHT:
        top = max(fractions)
        weights = [max(1, round(_MAX_WEIGHT * f / top)) for f in fractions]
    return weights


def _convolve(a: _Law, b: _Law) -> _Law:
    """The law of the sum of two independent laws ``(offset, pmf)``, at most ``_DROPPED``
    of mass cut at each end (each p-value within ``1e-15`` of exact, a law ~20 sd wide)."""
    (start, x), (shift, y) = (a, b) if len(a[1]) >= len(b[1]) else (b, a)
    out = [0.0] * (len(x) + len(y) - 1)
    for j, q in enumerate(y):
        if q:
            out[j : j + len(x)] = [o + q * v for o, v in zip(out[j : j + len(x)], x, strict=True)]
    # the running sums only grow: those within _DROPPED are a prefix (one value stays)
    low = sum(mass <= _DROPPED for mass in itertools.accumulate(out[:-1]))
    high = len(out) - sum(mass <= _DROPPED for mass in itertools.accumulate(out[:low:-1]))
    return start + shift + low, out[low:high]


def _sum_law(laws: Iterable[tuple[int, Sequence[float]]]) -> _Law:
    """The law of ``Σ a X``: each distinct law raised to its count by squaring, summed
    smallest first (one by one, 1,319 problems with 100 runs a side took hours)."""
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
    """The rate statistic's exact conditional ``(P(U* <= U_obs), P(U* >= U_obs))``."""
    informative = _informative(pairs)
    if _mcnemar(informative):
        # one run a side: U is Binomial(m, 1/2) over the m discordant pairs (McNemar)
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
    """Statistic 1's p (``flip``), statistic 2's tails; ``p`` is the gate's."""

    flip: float
    drop: float
    rise: float
    mcnemar: bool = False

    @property
    def p(self) -> float:
        if self.mcnemar:
            return self.drop
        return min(1.0, self.flip / FLIP_SHARE, self.drop / (1.0 - FLIP_SHARE))


def _mcnemar(pairs: Iterable[Pair]) -> bool:
    return all(p.base_runs == p.now_runs == 1 for p in pairs)


def evidence(pairs: Sequence[Pair]) -> Evidence:
    """Both statistics' exact conditional p-values (docs/baselines.md)."""
    drop, rise = rate_p_values(pairs)
    if _mcnemar(pairs):
        return Evidence(drop, drop, rise, mcnemar=True)
    return Evidence(flip_p_value(pairs), drop, rise)


def difference(pairs: Sequence[Pair]) -> tuple[float, float, float]:
    """Candidate minus baseline mean rate and its interval: Newcombe's with one run a side,
    else the normal one of the mean per-problem difference (problems the unit)."""
    n = len(pairs)
    if n == 0:
        return 0.0, -1.0, 1.0
    if _mcnemar(pairs):
        cells = Counter((p.base_correct, p.now_correct) for p in pairs)
        return paired_difference_interval(cells[1, 1], cells[1, 0], cells[0, 1], cells[0, 0])
    deltas = [p.now_rate - p.base_rate for p in pairs]
    diff = math.fsum(deltas) / n
    if n < 2:
        return diff, -1.0, 1.0
    var = math.fsum((x - diff) ** 2 for x in deltas) / (n * (n - 1))
    half = Z95 * math.sqrt(var)
    return diff, max(-1.0, diff - half), min(1.0, diff + half)


@dataclass(frozen=True)
class Reach:
    """The spread drop detected with :data:`POWER`; the candidate repeats for one point."""

    problems: float
    points: float
    repeats_for_one_point: int | None


def reach(pairs: Sequence[Pair], alpha: float) -> Reach:
    """The smallest drop detected with :data:`POWER` at ``alpha``, in the worst shape."""
    n = len(pairs)
    if n == 0:
        return Reach(0.0, 0.0, None)
    level = alpha if _mcnemar(pairs) else (1.0 - FLIP_SHARE) * alpha
    z = NormalDist().inv_cdf(1.0 - level) + NormalDist().inv_cdf(POWER)
    base_share = now_share = 0.0
    for pair in pairs:
        runs, total = pair.base_runs + pair.now_runs, pair.base_correct + pair.now_correct
        v = total * (runs - total) / (runs * (runs - 1))
        base_share += v / pair.base_runs
        now_share += v / pair.now_runs
    before, after = max(p.base_runs for p in pairs), max(p.now_runs for p in pairs)

    def drop(now_share: float, after: int) -> float:
        # m problems failing every candidate run from K of K alone: p = C(K + L, L)^-m
        alone = math.ceil(
            math.log(1.0 / level) / -math.log(hypergeometric_pmf(before, before, after)[0])
        )
        return max(z * math.sqrt(base_share + now_share), float(alone))

    problems = drop(now_share, after)
    plain = now_share * after  # Σ v_i at one candidate run
    enough = next((r for r in range(1, MAX_REPEATS + 1) if drop(plain / r, r) <= n / 100), None)
    return Reach(problems, 100 * problems / n, enough)
