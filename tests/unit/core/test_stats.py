"""Unit tests for pytest_gsm8k.core.stats."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest

from pytest_gsm8k.core.stats import (
    accuracy_interval,
    mcnemar_one_sided,
    paired_difference_interval,
    pass_at_k,
    wilson_interval,
)

# --------------------------------------------------------------------------- wilson_interval


@pytest.mark.parametrize(
    ("k", "n", "low", "high"),
    [
        (81, 100, 0.7222, 0.8749),
        (5, 10, 0.2366, 0.7634),
        (0, 10, 0.0, 0.2775),  # upper = z^2 / (n + z^2)
        (10, 10, 0.7225, 1.0),
        (1, 1, 0.2065, 1.0),
        (1319, 1319, 0.9971, 1.0),
    ],
)
def test_wilson_known_values(k: int, n: int, low: float, high: float) -> None:
    lo, hi = wilson_interval(k, n)
    assert lo == pytest.approx(low, abs=1e-4)
    assert hi == pytest.approx(high, abs=1e-4)


def test_wilson_extremes_are_exact() -> None:
    assert wilson_interval(0, 50)[0] == 0.0
    assert wilson_interval(50, 50)[1] == 1.0


def test_wilson_empty_is_uninformative() -> None:
    assert wilson_interval(0, 0) == (0.0, 1.0)


def test_wilson_is_symmetric_under_complement() -> None:
    lo, hi = wilson_interval(30, 100)
    clo, chi = wilson_interval(70, 100)
    assert lo == pytest.approx(1 - chi)
    assert hi == pytest.approx(1 - clo)


def test_the_repeats_interval_is_wilsons_95_at_the_effective_size() -> None:
    """Every interval is 95% (core/stats.py's Z95), --gsm8k-repeats' too: rates 1, 1/2, 0 of
    2 runs give p = 1/2, V = 1/18, n_eff = 4.5, so Wilson's for 2.25 of 4.5 at z = 1.96 (a 90%
    interval would be [0.19, 0.81])."""
    low, high = accuracy_interval([1.0, 0.5, 0.0], 2)
    assert (low, high) == pytest.approx((0.16069, 0.83931), abs=1e-4)


@pytest.mark.parametrize(("k", "n"), [(-1, 10), (11, 10), (1, -1)])
def test_wilson_rejects_bad_arguments(k: int, n: int) -> None:
    with pytest.raises(ValueError, match="need 0 <= k <= n"):
        wilson_interval(k, n)


# --------------------------------------------------------------------------- pass_at_k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 1, 0.3),  # pass@1 is c/n
        (10, 0, 5, 0.0),
        (10, 10, 1, 1.0),
        (5, 2, 4, 1.0),  # n - c = 3 < k = 4
        (4, 1, 4, 1.0),
        (6, 2, 3, 0.8),  # 1 - C(4,3)/C(6,3) = 1 - 4/20
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_binomial_formula() -> None:
    for n in range(1, 21):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
                assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n() -> None:
    # C(1000, 500) overflows a float; the product form must not.
    value = pass_at_k(1000, 10, 500)
    exact = 1 - Fraction(math.comb(990, 500), math.comb(1000, 500))
    assert value == pytest.approx(float(exact), rel=1e-9)


@pytest.mark.parametrize(
    ("n", "c", "k", "needle"),
    [
        (4, 5, 1, "need 0 <= c <= n"),
        (4, -1, 1, "need 0 <= c <= n"),
        (4, 1, 0, "need 1 <= k <= n"),
        (4, 1, 5, "need 1 <= k <= n"),
        (0, 0, 1, "need 1 <= k <= n"),
    ],
)
def test_pass_at_k_rejects_bad_arguments(n: int, c: int, k: int, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        pass_at_k(n, c, k)


# --------------------------------------------------------------------------- mcnemar_one_sided


@pytest.mark.parametrize(
    ("newly_failing", "newly_passing", "expected"),
    [
        (3, 0, 0.125),  # 1/8
        (3, 1, 0.3125),  # (C(4,3)+C(4,4))/16 = 5/16
        (0, 3, 1.0),  # P(X >= 0)
        (1, 1, 0.75),  # (2+1)/4
        (2, 2, 11 / 16),  # (6+4+1)/16
        (5, 0, 1 / 32),
        (4, 1, 6 / 32),
        (0, 0, 1.0),
    ],
)
def test_mcnemar_hand_computed(newly_failing: int, newly_passing: int, expected: float) -> None:
    assert mcnemar_one_sided(newly_failing, newly_passing) == pytest.approx(expected, abs=1e-15)


def test_mcnemar_is_exact_for_large_m() -> None:
    # m = 2000, k = 1000: P(X >= m/2) = 1/2 + C(2000, 1000) / 2**2001 exactly.
    expected = Fraction(1, 2) + Fraction(math.comb(2000, 1000), 2**2001)
    assert mcnemar_one_sided(1000, 1000) == pytest.approx(float(expected), rel=1e-14)
    # 2**-1000 is representable; a float pmf of C(1000, k) * 0.5**1000 would overflow.
    assert mcnemar_one_sided(1000, 0) == 2.0**-1000


def test_mcnemar_tails_are_complementary() -> None:
    # P(X >= b) + P(X <= b - 1) = 1, and P(X <= b - 1) = P(m - X >= c + 1).
    for b, c in [(700, 600), (10, 3), (1, 0), (50, 50)]:
        total = mcnemar_one_sided(b, c) + mcnemar_one_sided(c + 1, b - 1)
        assert total == pytest.approx(1.0, abs=1e-12)


def test_mcnemar_more_regressions_is_more_significant() -> None:
    ps = [mcnemar_one_sided(f, 10) for f in range(0, 30)]
    assert all(a > b for a, b in itertools.pairwise(ps))


@pytest.mark.parametrize(("f", "p"), [(-1, 0), (0, -1)])
def test_mcnemar_rejects_negative(f: int, p: int) -> None:
    with pytest.raises(ValueError, match="counts must be non-negative"):
        mcnemar_one_sided(f, p)


# --------------------------------------------------------------------------- paired difference


def _newcombe_by_hand(
    a: int, b: int, c: int, d: int, z: float = 1.959963984540054
) -> tuple[float, float, float]:
    """Independent transcription of Newcombe's method 10 (current = row, baseline = column).

    a = both correct, b = baseline only, c = current only, d = both wrong.
    """
    n = a + b + c + d

    def wilson(x: int) -> tuple[float, float]:
        p = x / n
        centre = 2 * n * p + z * z
        spread = z * math.sqrt(z * z + 4 * n * p * (1 - p))
        return (centre - spread) / (2 * (n + z * z)), (centre + spread) / (2 * (n + z * z))

    p1, p2 = (a + c) / n, (a + b) / n
    l1, u1 = wilson(a + c)
    l2, u2 = wilson(a + b)
    e, f, g, h = a + c, b + d, a + b, c + d
    big_a = a * d - b * c
    if 0 in (e, f, g, h):
        phi = 0.0
    elif big_a > n / 2:
        phi = (big_a - n / 2) / math.sqrt(e * f * g * h)
    elif big_a >= 0:
        phi = 0.0
    else:
        phi = big_a / math.sqrt(e * f * g * h)
    theta = p1 - p2
    lo = theta - math.sqrt((p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2)
    hi = theta + math.sqrt((p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2)
    return theta, lo, hi


@pytest.mark.parametrize(
    "cells",
    [
        (36, 2, 12, 0),  # Newcombe (1998) example: 36, 12, 2, 0
        (59, 16, 6, 80),  # Cavo et al. 2012, as in Fagerland et al.
        (1, 7, 1, 12),  # Bentur et al. 2009, as in Fagerland et al.
        (5, 5, 5, 5),  # phi = 0 branch (ad - bc = 0)
        (40, 1, 2, 40),  # strongly positive correlation
        (0, 10, 10, 0),  # negative correlation
        (900, 40, 60, 319),  # GSM8K-sized
    ],
)
def test_paired_interval_matches_independent_transcription(
    cells: tuple[int, int, int, int],
) -> None:
    diff, lo, hi = paired_difference_interval(*cells)
    e_diff, e_lo, e_hi = _newcombe_by_hand(*cells)
    assert diff == pytest.approx(e_diff, abs=1e-12)
    assert lo == pytest.approx(max(-1.0, e_lo), abs=1e-9)
    assert hi == pytest.approx(min(1.0, e_hi), abs=1e-9)


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        # Regression values (4 d.p.) computed from the formula above.
        ((36, 2, 12, 0), (0.2, 0.0569, 0.3404)),
        ((59, 16, 6, 80), (-0.0621, -0.1186, -0.0046)),
        ((1, 7, 1, 12), (-0.2857, -0.5069, -0.0256)),
    ],
)
def test_paired_interval_regression_values(
    cells: tuple[int, int, int, int], expected: tuple[float, float, float]
) -> None:
    got = paired_difference_interval(*cells)
    assert got == pytest.approx(expected, abs=1e-4)


def test_paired_interval_point_estimate_and_containment() -> None:
    diff, lo, hi = paired_difference_interval(900, 40, 60, 319)
    assert diff == pytest.approx(20 / 1319)
    assert -1.0 <= lo < diff < hi <= 1.0


def test_paired_interval_is_antisymmetric() -> None:
    diff, lo, hi = paired_difference_interval(30, 12, 4, 54)
    rdiff, rlo, rhi = paired_difference_interval(30, 4, 12, 54)
    assert rdiff == pytest.approx(-diff)
    assert rlo == pytest.approx(-hi)
    assert rhi == pytest.approx(-lo)


def test_paired_interval_no_change_still_has_width() -> None:
    diff, lo, hi = paired_difference_interval(60, 0, 0, 40)
    assert diff == 0.0
    assert lo < 0.0 < hi
    assert lo == pytest.approx(-hi)


def test_paired_interval_stays_in_range_at_extremes() -> None:
    diff, lo, hi = paired_difference_interval(0, 0, 20, 0)  # baseline 0%, current 100%
    assert diff == 1.0
    assert -1.0 <= lo < 1.0
    assert hi == pytest.approx(1.0)
    assert paired_difference_interval(0, 0, 0, 0) == (0.0, -1.0, 1.0)


def test_paired_interval_coverage_by_simulation() -> None:
    # Correlated paired outcomes, true difference 0.05; 95% intervals should
    # cover it roughly 95% of the time (Newcombe reports ~0.95 mean coverage).
    rng = random.Random(20240601)
    probs = {"a": 0.55, "b": 0.05, "c": 0.10, "d": 0.30}  # true diff = c - b = 0.05
    cells = list(probs)
    weights = list(probs.values())
    n, reps, covered = 150, 1500, 0
    for _ in range(reps):
        draw = rng.choices(cells, weights=weights, k=n)
        counts = [draw.count(x) for x in cells]
        _, lo, hi = paired_difference_interval(*counts)
        covered += lo <= 0.05 <= hi
    assert 0.92 <= covered / reps <= 0.98


def test_paired_interval_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="cell counts must be non-negative"):
        paired_difference_interval(-1, 0, 0, 1)
