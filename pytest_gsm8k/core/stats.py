"""Statistics for turning GSM8K pass/fail counts into defensible claims.

GSM8K's test split has only 1,319 problems, so a one-point accuracy change is
about 13 problems and frequently within noise.  A regression gate that
compares raw accuracies would flap; these helpers quantify the noise instead:

* :func:`wilson_interval` -- confidence interval for one accuracy;
* :func:`clustered_interval` -- the same for a mean over repeated answers per problem;
* :func:`pass_at_k` -- unbiased pass@k from n samples per problem;
* :func:`mcnemar_one_sided` -- exact test for "the new run is worse" using
  only the problems whose outcome changed;
* :func:`paired_difference_interval` -- confidence interval for the accuracy
  change between two runs on the same problems (Newcombe's method 10).

Pure logic, standard library only, no pytest imports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

__all__ = [
    "accuracy_interval",
    "clustered_interval",
    "hypergeometric_pmf",
    "mcnemar_one_sided",
    "paired_difference_interval",
    "pass_at_k",
    "wilson_interval",
]


def _z_value(confidence: float) -> float:
    """Two-sided standard-normal quantile for ``confidence`` (1.96 for 0.95)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    return NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)


def _wilson(k: float, n: float, z: float) -> tuple[float, float]:
    """Wilson score interval for ``k`` successes out of ``n > 0`` at quantile ``z``."""
    p = k / n
    z2 = z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2.0 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    # The exact interval endpoints at k == 0 and k == n are 0 and 1; pin them so
    # floating-point noise cannot report e.g. an upper bound of 0.9999999999.
    low = 0.0 if k == 0 else max(0.0, centre - half)
    high = 1.0 if k == n else min(1.0, centre + half)
    return low, high


def wilson_interval(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score confidence interval for an accuracy of ``k`` out of ``n``.

    Wilson rather than the textbook Wald interval because Wald collapses to a
    zero-width interval at 0% or 100% accuracy and undercovers near the
    extremes, which is exactly where small smoke-test subsets live.

    ``n == 0`` gives the uninformative ``(0.0, 1.0)``: with no problems run we
    know nothing.  Raises ``ValueError`` unless ``0 <= k <= n`` and
    ``0 < confidence < 1``.
    """
    if n < 0 or not 0 <= k <= max(n, 0):
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    z = _z_value(confidence)
    if n == 0:
        return 0.0, 1.0
    return _wilson(k, n, z)


def clustered_interval(
    rates: Sequence[float], runs: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Interval for the mean of per-problem rates (``--gsm8k-repeats``: each problem right
    in some of its ``runs`` answers), the problems being the unit.

    The answers of one problem are not independent draws of the accuracy (a problem right
    at rate 0.9 is one problem, not nine tenths of ``runs`` of them), so a Wilson interval
    over every answer would be too narrow. The variance of the mean over problems,
    ``V = Σ (r_i - p)² / n²``, gives the effective sample size ``n_eff = p (1 - p) / V``
    (Kish's, between ``n`` and ``n · runs``), and the interval is Wilson's at ``n_eff``:
    Korn & Graubard (1998), "Confidence intervals for proportions with small expected
    number of positive counts estimated from survey data", Survey Methodology 24:193-201;
    compared in Dean & Pagano (2015), "Evaluating confidence interval methods for binomial
    proportions in clustered surveys", J. Survey Stat. Methodol. 3:484-503. With one run
    per problem ``n_eff = n`` and it is exactly :func:`wilson_interval`.
    """
    n = len(rates)
    z = _z_value(confidence)
    if n == 0:
        return 0.0, 1.0
    p = math.fsum(rates) / n
    var = math.fsum((r - p) ** 2 for r in rates) / (n * n)
    most = n * max(1, runs)
    effective = most if var <= 0.0 or p in (0.0, 1.0) else min(most, p * (1.0 - p) / var)
    return _wilson(p * effective, effective, z)


def accuracy_interval(rates: Sequence[float], runs: int) -> tuple[float, float]:
    """The interval of an accuracy that is the mean of per-problem ``rates`` (each right in
    a share of its ``runs`` answers): Wilson's on the count with one run, else
    :func:`clustered_interval`. The headline's and both sides' of a baseline comparison, so
    the same problems' accuracy has the same interval wherever it is shown."""
    if runs <= 1:
        return wilson_interval(round(math.fsum(rates)), len(rates))
    return clustered_interval(rates, runs)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate from ``n`` samples of which ``c`` are correct.

    This is the estimator of Chen et al. 2021 ("Evaluating Large Language
    Models Trained on Code"), ``1 - C(n-c, k) / C(n, k)``: the probability
    that at least one of ``k`` samples drawn without replacement from the
    ``n`` is correct.  Simply using ``c/n`` for k=1 is the same thing; for
    k>1, the naive ``1-(1-c/n)**k`` is biased.  It is evaluated as the product
    ``1 - prod(1 - k/i for i in n-c+1..n)`` from the paper's snippet, which
    never forms the huge binomial coefficients.

    Returns 1.0 when ``n - c < k`` (every size-k draw must contain a correct
    sample).  Raises ``ValueError`` unless ``0 <= c <= n`` and ``1 <= k <= n``.
    """
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got n={n}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mcnemar_one_sided(newly_failing: int, newly_passing: int) -> float:
    """Exact one-sided McNemar p-value for "the new run is worse than the baseline".

    Problems that both runs pass or both fail carry no information about which
    run is better; only the ``m = newly_failing + newly_passing`` discordant
    problems do.  Under the null hypothesis (equal accuracy) each discordant
    problem is equally likely to go either way, so ``newly_failing`` is
    Binomial(m, 1/2) and the p-value is ``P(X >= newly_failing)``.

    The tail is summed with exact integers (``math.comb``) and divided by
    ``2**m`` only at the end; Python's int/int division is correctly rounded,
    so the result is exact to float precision even for thousands of
    discordant pairs, where a float binomial pmf would under/overflow.

    ``m == 0`` gives 1.0 (no evidence of anything).  Raises ``ValueError`` for
    negative counts.
    """
    if newly_failing < 0 or newly_passing < 0:
        raise ValueError(
            "counts must be non-negative, got "
            f"newly_failing={newly_failing}, newly_passing={newly_passing}"
        )
    m = newly_failing + newly_passing
    if m == 0:
        return 1.0
    # C(m, i+1) = C(m, i) (m-i) / (i+1): O(m) small-integer steps for the whole tail
    term = math.comb(m, newly_failing)
    tail = 0
    for i in range(newly_failing, m + 1):
        tail += term
        term = term * (m - i) // (i + 1)
    return tail / (1 << m)


def hypergeometric_pmf(total: int, before: int, after: int) -> tuple[float, ...]:
    """``P(D = d)`` for ``d = 0..after``: how many of ``total`` successes fall among the
    last ``after`` of ``before + after`` exchangeable runs.

    The null law of the noise-aware baseline gate (core/calibrated.py): a problem
    answered correctly ``total`` times over ``before`` baseline runs and ``after``
    candidate runs, all with the same success rate, puts its successes on the runs
    uniformly at random, whatever that rate is. Exact integers (``math.comb``), one
    division per term. Raises ``ValueError`` unless ``0 <= total <= before + after``.
    """
    if before < 0 or after < 0 or not 0 <= total <= before + after:
        raise ValueError(f"need 0 <= total <= before + after, got {total}, {before}, {after}")
    whole = math.comb(before + after, after)
    return tuple(
        math.comb(total, d) * math.comb(before + after - total, after - d) / whole
        for d in range(after + 1)
    )


def paired_difference_interval(
    both_correct: int,
    baseline_only: int,
    current_only: int,
    both_wrong: int,
    confidence: float = 0.95,
) -> tuple[float, float, float]:
    """Accuracy change (current - baseline) on paired problems, with a confidence interval.

    The arguments are the four cells of the paired 2x2 table: problems both
    runs solve, only the baseline solves (newly failing), only the current run
    solves (newly passing), and neither solves.  All four are needed, not just
    the discordant counts, because the interval depends on the two marginal
    accuracies and on their correlation.

    The point estimate is ``(current_only - baseline_only) / n``.  The interval
    is Newcombe's method 10 (Newcombe 1998, "Improved confidence intervals for
    the difference between binomial proportions based on paired data",
    Stat. Med. 17:2635-2650): Wilson score intervals ``(l1, u1)`` and
    ``(l2, u2)`` for the current and baseline accuracies ``p1``, ``p2`` are
    combined by "square and add", corrected for the correlation of paired
    data::

        low  = d - sqrt((p1-l1)**2 - 2*phi*(p1-l1)*(u2-p2) + (u2-p2)**2)
        high = d + sqrt((p2-l2)**2 - 2*phi*(p2-l2)*(u1-p1) + (u1-p1)**2)

    where ``phi`` is the phi coefficient of the table with Newcombe's
    continuity correction: with ``A = both_correct*both_wrong -
    baseline_only*current_only``, ``phi = (A - n/2)/sqrt(...)`` if ``A > n/2``,
    ``0`` if ``0 <= A <= n/2``, ``A/sqrt(...)`` if ``A < 0``, and ``0`` when any
    margin is empty.  Unlike a Wald interval it stays inside [-1, 1] and does
    not collapse to zero width when no problem changed outcome.

    Returns ``(diff, low, high)``.  ``n == 0`` gives ``(0.0, -1.0, 1.0)``.
    Raises ``ValueError`` for negative counts or a confidence outside (0, 1).
    """
    cells = (both_correct, baseline_only, current_only, both_wrong)
    if any(x < 0 for x in cells):
        raise ValueError(f"cell counts must be non-negative, got {cells}")
    z = _z_value(confidence)
    n = sum(cells)
    if n == 0:
        return 0.0, -1.0, 1.0

    current_correct = both_correct + current_only
    baseline_correct = both_correct + baseline_only
    p1 = current_correct / n
    p2 = baseline_correct / n
    diff = (current_only - baseline_only) / n
    l1, u1 = _wilson(current_correct, n, z)
    l2, u2 = _wilson(baseline_correct, n, z)

    # Margins of the table, rows = current run (correct, wrong), columns =
    # baseline (correct, wrong).  Exact integers until the final division.
    margins = (
        current_correct,
        n - current_correct,
        baseline_correct,
        n - baseline_correct,
    )
    if 0 in margins:
        phi = 0.0
    else:
        a = both_correct * both_wrong - baseline_only * current_only
        root = math.sqrt(math.prod(margins))
        if 2 * a > n:
            phi = (a - n / 2) / root
        elif a >= 0:
            phi = 0.0
        else:
            phi = a / root

    d_low1, d_up2 = p1 - l1, u2 - p2
    d_low2, d_up1 = p2 - l2, u1 - p1
    low = diff - math.sqrt(max(0.0, d_low1**2 - 2 * phi * d_low1 * d_up2 + d_up2**2))
    high = diff + math.sqrt(max(0.0, d_low2**2 - 2 * phi * d_low2 * d_up1 + d_up1**2))
    return diff, max(-1.0, low), min(1.0, high)
