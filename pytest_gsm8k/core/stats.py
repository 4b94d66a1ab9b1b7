"""Intervals and exact tests that turn pass/fail counts into defensible claims (a point on
GSM8K is 13 problems, often within noise); exact integers where a float would overflow. Pure."""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

#: every interval is a 95% one: the two-sided standard-normal quantile (1.96)
Z95 = NormalDist().inv_cdf(0.975)


def wilson_interval(k: float, n: float) -> tuple[float, float]:
    """Wilson's 95% score interval for ``k`` of ``n`` (Wald's collapses at 0% and 100%, where
    small smoke subsets live): the exact ends at 0 and n; ``(0, 1)`` for ``n == 0``."""
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return 0.0, 1.0
    p, z2 = k / n, Z95 * Z95
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2.0 * n)) / denom
    half = Z95 * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    return (
        0.0 if k == 0 else max(0.0, centre - half),
        1.0 if k == n else min(1.0, centre + half),
    )


def accuracy_interval(rates: Sequence[float], runs: int) -> tuple[float, float]:
    """The one interval of an accuracy, wherever it is shown: Wilson's with one run per
    problem; with ``--gsm8k-repeats``, problems the unit (one problem's answers are not
    independent draws), Wilson's at Kish's effective size ``n_eff = p (1 - p) / V``,
    ``V = Σ (r_i - p)² / n²`` (Korn & Graubard 1998, Survey Methodology 24:193-201)."""
    n = len(rates)
    if runs <= 1 or n == 0:
        return wilson_interval(round(math.fsum(rates)), n)
    p = math.fsum(rates) / n
    var = math.fsum((r - p) ** 2 for r in rates) / (n * n)
    effective = n * runs if var <= 0.0 or p in (0.0, 1.0) else min(n * runs, p * (1 - p) / var)
    return wilson_interval(p * effective, effective)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples, ``c`` correct: ``1 - C(n-c, k) / C(n, k)``
    (Chen et al. 2021), as the paper's product, which never forms the huge coefficients."""
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mcnemar_one_sided(newly_failing: int, newly_passing: int) -> float:
    """Exact one-sided McNemar p for "the new run is worse": ``P(X >= newly_failing)``,
    ``X ~ Binomial(m, 1/2)`` over the ``m`` discordant problems, summed in integers and
    divided once (int/int is correctly rounded). 1.0 when ``m == 0``."""
    if newly_failing < 0 or newly_passing < 0:
        raise ValueError(f"counts must be non-negative, got {newly_failing=}, {newly_passing=}")
    m = newly_failing + newly_passing
    # C(m, i+1) = C(m, i) (m-i) / (i+1): O(m) small-integer steps for the whole tail
    term, tail = math.comb(m, newly_failing), 0
    for i in range(newly_failing, m + 1):
        tail += term
        term = term * (m - i) // (i + 1)
    return tail / (1 << m)


def hypergeometric_pmf(total: int, before: int, after: int) -> tuple[float, ...]:
    """``P(D = d)`` for ``d = 0..after``: how many of ``total`` successes fall among the
    last ``after`` of ``before + after`` exchangeable runs (core/calibrated.py's null)."""
    whole = math.comb(before + after, after)
    return tuple(
        math.comb(total, d) * math.comb(before + after - total, after - d) / whole
        for d in range(after + 1)
    )


def paired_difference_interval(
    both_correct: int, baseline_only: int, current_only: int, both_wrong: int
) -> tuple[float, float, float]:
    """``(diff, low, high)``: the accuracy change (current - baseline) on the paired 2x2
    table, with Newcombe's method 10 interval (Newcombe 1998, Stat. Med. 17:2635-2650): the
    two Wilson intervals combined by "square and add", corrected by the table's phi with
    Newcombe's continuity correction (0 when a margin is empty). Unlike Wald's it stays in
    [-1, 1] and keeps a width when nothing changed."""
    cells = (both_correct, baseline_only, current_only, both_wrong)
    if any(x < 0 for x in cells):
        raise ValueError(f"cell counts must be non-negative, got {cells}")
    n = sum(cells)
    if n == 0:
        return 0.0, -1.0, 1.0
    current, baseline = both_correct + current_only, both_correct + baseline_only
    p1, p2 = current / n, baseline / n
    diff = (current_only - baseline_only) / n
    (l1, u1), (l2, u2) = wilson_interval(current, n), wilson_interval(baseline, n)
    margins = (current, n - current, baseline, n - baseline)
    a = both_correct * both_wrong - baseline_only * current_only
    phi = 0.0
    if 0 not in margins and (2 * a > n or a < 0):
        phi = (a - n / 2 if 2 * a > n else a) / math.sqrt(math.prod(margins))
    d_low1, d_up2, d_low2, d_up1 = p1 - l1, u2 - p2, p2 - l2, u1 - p1
    low = diff - math.sqrt(max(0.0, d_low1**2 - 2 * phi * d_low1 * d_up2 + d_up2**2))
    high = diff + math.sqrt(max(0.0, d_low2**2 - 2 * phi * d_low2 * d_up1 + d_up1**2))
    return diff, max(-1.0, low), min(1.0, high)
