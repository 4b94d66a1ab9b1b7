"""The noise-aware baseline test, checked exactly against brute force on small cases."""

from __future__ import annotations

import itertools
import math
import random
import time

import pytest

from pytest_gsm8k.core.calibrated import (
    FLIP_SHARE,
    RESOLUTION,
    Pair,
    difference,
    evidence,
    flip_p_value,
    rate_p_values,
    reach,
)
from pytest_gsm8k.core.stats import mcnemar_one_sided


def _hypergeom(total: int, before: int, after: int, d: int) -> float:
    """Written apart from core/stats.py: choose which ``after`` of the runs are the candidate's."""
    runs = before + after
    hits = 0
    combos = 0
    for chosen in itertools.combinations(range(runs), after):
        combos += 1
        # the first ``total`` runs are the successes (exchangeable: any fixed set will do)
        hits += sum(1 for r in chosen if r < total) == d
    return hits / combos


def _brute_p(pairs: list[Pair]) -> float:
    """P(S* >= S_obs) by enumerating every candidate outcome with the same totals."""
    observed = sum(pair.score for pair in pairs)  # S
    options = []
    for pair in pairs:
        total = pair.base_correct + pair.now_correct
        row = []
        for d in range(pair.now_runs + 1):
            prob = _hypergeom(total, pair.base_runs, pair.now_runs, d)
            if prob > 0:
                other = Pair(pair.problem_id, total - d, pair.base_runs, d, pair.now_runs)
                row.append((other.score, prob))
        options.append(row)
    tail = 0.0
    for combo in itertools.product(*options):
        if sum(score for score, _ in combo) >= observed:
            tail += math.prod(prob for _, prob in combo)
    return tail


def _random_pairs(rng: random.Random, count: int, before: int, after: int) -> list[Pair]:
    pairs = []
    for i in range(count):
        k = rng.randint(1, before)
        ell = rng.randint(1, after)
        pairs.append(Pair(f"p{i}", rng.randint(0, k), k, rng.randint(0, ell), ell))
    return pairs


@pytest.mark.parametrize("seed", range(40))
def test_p_value_equals_brute_force_enumeration(seed: int) -> None:
    rng = random.Random(seed)
    pairs = _random_pairs(rng, rng.randint(1, 6), 5, 3)
    assert flip_p_value(pairs) == pytest.approx(_brute_p(pairs), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    ("failing", "passing"), [(0, 0), (1, 0), (3, 1), (7, 0), (20, 9), (60, 40)]
)
def test_single_runs_give_exactly_mcnemar(failing: int, passing: int) -> None:
    pairs = [Pair(f"f{i}", 1, 1, 0, 1) for i in range(failing)]
    pairs += [Pair(f"p{i}", 0, 1, 1, 1) for i in range(passing)]
    pairs += [Pair("same1", 1, 1, 1, 1), Pair("same0", 0, 1, 0, 1)]
    assert evidence(pairs).p == pytest.approx(mcnemar_one_sided(failing, passing), rel=1e-12)


def test_a_stable_problem_that_fails_weighs_more_than_a_noisy_one() -> None:
    """Scores ``RESOLUTION u⁴ / u_max²`` by hand (K = 5, one candidate run, u_max = ln 6):
    right 5 of 5 and failing now, ``u = ln 6``: 16 ln² 6 = 51.4; 4 of 5, ``P(D = 0) = 2/6``:
    16 ln⁴ 3 / ln² 6 = 7.3; 3 of 5, ``P = 1/2``: 1.15; 1 of 5, ``P = 5/6``: 0.0001."""
    stable = Pair("s", 5, 5, 0, 1)
    four = Pair("f", 4, 5, 0, 1)
    noisy = Pair("n", 3, 5, 0, 1)
    rare = Pair("r", 1, 5, 0, 1)
    assert stable.score == round(RESOLUTION * math.log(6) ** 2) == 51
    assert four.score == round(RESOLUTION * math.log(3) ** 4 / math.log(6) ** 2) == 7
    assert noisy.score == round(RESOLUTION * math.log(2) ** 4 / math.log(6) ** 2) == 1
    assert rare.score == 0  # resolution lost, never validity: null and observed alike
    assert Pair("ok", 5, 5, 1, 1).score == 0
    assert flip_p_value([stable] * 3) < flip_p_value([noisy] * 3)


def test_flip_null_by_hand() -> None:
    """Three failing problems, K = 5, one candidate run: 5 of 5 (score 51, null P(D = 0 |
    t = 5) = 1/6), 4 of 5 (7, 1/3), 3 of 5 (1, 1/2). Only all three failing reach S = 59:
    p = 1/6 * 1/3 * 1/2 = 1/36. The stable one alone (51) is beyond the others' 8: 1/6."""
    pairs = [Pair("s", 5, 5, 0, 1), Pair("f", 4, 5, 0, 1), Pair("n", 3, 5, 0, 1)]
    assert sum(pair.score for pair in pairs) == 59
    assert flip_p_value(pairs) == pytest.approx(1 / 36, rel=1e-12)
    assert flip_p_value([Pair("s", 5, 5, 0, 1)]) == pytest.approx(1 / 6, rel=1e-12)
    alone = [Pair("s", 5, 5, 0, 1), Pair("f", 3, 5, 1, 1), Pair("n", 2, 5, 1, 1)]
    assert flip_p_value(alone) == pytest.approx(1 / 6, rel=1e-12)


def test_a_stable_break_is_not_drowned_by_the_noisy_strata() -> None:
    """A 1-point stable break on a model noisy the issue's way (K = 5, one candidate run,
    the strata of the benchmark's uniform family): 18 of the 53 problems with 5 of 6 runs
    right fail now (9 by noise, about 1 in 6, and the broken ones). The flip statistic is
    decided by them, not by how the 4-of-5 and 3-of-5 problems happened to fall (here the
    4-of-5 ones fail less than their null mean): the gate fails. The squared surprise gave
    those strata a third of a stable flip's weight and passed it (p = 0.031)."""
    pairs = []
    for t, m, f in ((5, 53, 18), (4, 42, 10), (3, 42, 21), (2, 42, 28), (1, 42, 35)):
        pairs += [Pair(f"t{t}f{i}", t, 5, 0, 1) for i in range(f)]
        pairs += [Pair(f"t{t}s{i}", t - 1, 5, 1, 1) for i in range(m - f)]
    pairs += [Pair(f"r{i}", 5, 5, 1, 1) for i in range(866)]
    pairs += [Pair(f"w{i}", 0, 5, 0, 1) for i in range(165)]
    seen = evidence(pairs)
    assert seen.drop > 0.2  # the rate statistic alone does not see it
    assert seen.p < 0.01


@pytest.mark.parametrize("seed", range(30))
def test_each_further_failure_can_only_lower_p(seed: int) -> None:
    """The early stop's premise with a single candidate run: p is monotone in every
    problem's outcome (proved in core/calibrated.py's docstring; with L > 1 it is not,
    and the early stop leaves that gate to the end of the run)."""
    rng = random.Random(1000 + seed)
    pairs = _random_pairs(rng, rng.randint(1, 7), 6, 1)
    for i, pair in enumerate(pairs):
        for d in range(pair.now_runs):
            lower = [
                *pairs[:i],
                Pair(pair.problem_id, pair.base_correct, pair.base_runs, d, pair.now_runs),
                *pairs[i + 1 :],
            ]
            higher = [
                *pairs[:i],
                Pair(pair.problem_id, pair.base_correct, pair.base_runs, d + 1, pair.now_runs),
                *pairs[i + 1 :],
            ]
            assert evidence(lower).p <= evidence(higher).p + 1e-12


def test_the_p_value_is_valid_under_the_null_by_simulation() -> None:
    """Unchanged model, noisy problems: P(p < alpha) <= alpha (within simulation error)."""
    rng = random.Random(7)
    rates = [1.0] * 150 + [0.0] * 30 + [0.5] * 20
    alpha = 0.1
    rejections = 0
    trials = 400
    for _ in range(trials):
        pairs = []
        for i, rate in enumerate(rates):
            c = sum(rng.random() < rate for _ in range(3))
            d = int(rng.random() < rate)
            pairs.append(Pair(str(i), c, 3, d, 1))
        rejections += evidence(pairs).p < alpha
    assert rejections / trials <= alpha + 2 * math.sqrt(alpha * (1 - alpha) / trials)


def test_a_collapse_is_decided_by_a_bound_below_the_exact_tail() -> None:
    pairs = [Pair(str(i), 5, 5, 0, 1) for i in range(900)] + [
        Pair(f"n{i}", 2, 5, i % 2, 1) for i in range(300)
    ]
    started = time.perf_counter()
    p = flip_p_value(pairs)
    assert 0.0 <= p < 1e-12
    assert time.perf_counter() - started < 10


def test_a_full_run_is_cheap() -> None:
    rng = random.Random(3)
    pairs = []
    for i in range(1319):
        rate = 0.5 if i % 2 else 1.0  # half the split noisy: a heavy case
        pairs.append(
            Pair(
                str(i),
                sum(rng.random() < rate for _ in range(5)),
                5,
                int(rng.random() < rate) * 0,
                1,
            )
        )
    started = time.perf_counter()
    assert evidence(pairs).p < 1e-6
    assert time.perf_counter() - started < 20


def test_the_gate_fails_a_significant_drop_and_names_the_stable_flips() -> None:
    from pytest_gsm8k.core.gates import NoiseAware

    pairs = [Pair(f"s{i}", 5, 5, 0, 1) for i in range(6)] + [
        Pair(f"k{i}", 5, 5, 1, 1) for i in range(100)
    ]
    verdict = NoiseAware(0.01).verdict(pairs, evidence(pairs))
    assert not verdict.passed
    assert verdict.rule == "noise-aware"
    assert "6 newly failing: 6 stable (right in all 5 baseline runs), 0 noisy" in verdict.detail
    assert verdict.value is not None
    assert verdict.value < 0.01
    # the same flips within an allowed drop of 10 points pass
    assert NoiseAware(0.01, max_drop=0.1).verdict(pairs, evidence(pairs)).passed


def test_single_run_gate_is_mcnemar_and_says_so() -> None:
    from pytest_gsm8k.core.gates import NoiseAware

    pairs = [Pair(f"f{i}", 1, 1, 0, 1) for i in range(7)] + [Pair("x", 1, 1, 1, 1)]
    verdict = NoiseAware(0.01).verdict(pairs, evidence(pairs))
    assert "exact McNemar" in verdict.detail
    assert verdict.value == pytest.approx(mcnemar_one_sided(7, 0))
    assert not verdict.passed


@pytest.mark.parametrize("seed", range(25))
def test_certain_agrees_with_every_completion(seed: int) -> None:
    """When certain() answers, every way the unseen problems could go gives that verdict."""
    from pytest_gsm8k.core.gates import NoiseAware

    rng = random.Random(50 + seed)
    gate = NoiseAware(rng.choice([0.05, 0.2, 0.5]), max_drop=rng.choice([0.0, 0.05]))
    seen = [
        Pair(f"s{i}", c, 3, rng.randint(0, 1), 1)
        for i, c in enumerate(rng.choices(range(4), k=rng.randint(1, 6)))
    ]
    unseen = [(f"u{i}", rng.randint(0, 3), 3) for i in range(rng.randint(0, 5))]
    claim = gate.certain(seen, unseen)
    outcomes = set()
    for ds in itertools.product((0, 1), repeat=len(unseen)):
        full = seen + [Pair(i, c, k, d, 1) for (i, c, k), d in zip(unseen, ds, strict=True)]
        outcomes.add(gate.verdict(full, evidence(full)).word)
    if claim is not None:
        assert outcomes == {claim}
    if not unseen:
        assert claim is not None


def test_rate_statistic_null_by_hand() -> None:
    """Three problems, K = 5, one candidate run: given its total ``t`` of 6 runs, a problem's
    candidate run is right with probability t/6. a: t = 3 (1/2), b: t = 5 (5/6), c: t = 3
    (1/2); one success observed (c). P(U <= 1) = P(U = 0) + P(U = 1) = 1/24 + (2/24 + 5/24)
    = 1/3, and the other tail P(U >= 1) = 1 - 1/24."""
    pairs = [Pair("a", 3, 5, 0, 1), Pair("b", 5, 5, 0, 1), Pair("c", 2, 5, 1, 1)]
    drop, rise = rate_p_values(pairs)
    assert drop == pytest.approx(1 / 3, rel=1e-12)
    assert rise == pytest.approx(23 / 24, rel=1e-12)
    seen = evidence(pairs)
    assert seen.p == pytest.approx(min(1.0, seen.flip / FLIP_SHARE, drop / (1 - FLIP_SHARE)))


def test_rate_statistic_with_repeats_on_both_sides_by_hand() -> None:
    """K = 2, L = 2, one problem with t = 2 of 4: D is hypergeometric, P(D = 0) = 1/6,
    P(1) = 4/6, P(2) = 1/6. Observed D = 0: drop p = 1/6, rise p = 1."""
    drop, rise = rate_p_values([Pair("a", 2, 2, 0, 2), Pair("same", 2, 2, 2, 2)])
    assert drop == pytest.approx(1 / 6, rel=1e-12)
    assert rise == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("seed", range(20))
def test_rate_p_values_equal_brute_force_enumeration(seed: int) -> None:
    """Mixed K and L (integer weights 1/K + 1/L): both tails by enumerating every
    candidate outcome with the same totals."""
    rng = random.Random(300 + seed)
    pairs = _random_pairs(rng, rng.randint(1, 5), 4, 3)

    def rate_drop(pp: list[Pair]) -> float:
        return sum(p.base_rate - p.now_rate for p in pp)

    observed = rate_drop(pairs)
    options = []
    for pair in pairs:
        total = pair.base_correct + pair.now_correct
        row = []
        for d in range(pair.now_runs + 1):
            prob = _hypergeom(total, pair.base_runs, pair.now_runs, d)
            if prob > 0:
                row.append((Pair("x", total - d, pair.base_runs, d, pair.now_runs), prob))
        options.append(row)
    low = high = 0.0
    for combo in itertools.product(*options):
        prob = math.prod(p for _, p in combo)
        value = rate_drop([x for x, _ in combo])
        low += prob * (value >= observed - 1e-9)  # a drop at least as large: U* <= U_obs
        high += prob * (value <= observed + 1e-9)
    drop, rise = rate_p_values(pairs)
    assert drop == pytest.approx(low, rel=1e-9, abs=1e-12)
    assert rise == pytest.approx(high, rel=1e-9, abs=1e-12)


def test_a_right_k_of_k_problem_is_not_certain() -> None:
    """The null must not treat 5 of 5 as certain: 20 problems right 5 of 5 times, one
    candidate miss among them (what a 0.97-rate problem does). Only that one is
    informative: t = 5 of 6, P(D = 0) = 1/6 for both statistics, so p = (1/6) / (3/4)."""
    pairs = [Pair(f"s{i}", 5, 5, int(i != 0), 1) for i in range(20)]
    assert evidence(pairs).p == pytest.approx(2 / 9, rel=1e-12)


def test_the_rate_statistic_sees_a_spread_drop_the_flips_miss() -> None:
    """400 noisy problems right 3 of 6 in the baseline; the candidate (6 runs) right 2 of 6
    on each: no stable problem breaks, the mean rate fell 16.7 points."""
    pairs = [Pair(f"n{i}", 3, 6, 2, 6) for i in range(400)]
    seen = evidence(pairs)
    assert seen.drop < 1e-6
    assert seen.p < 0.01
    assert seen.rise > 0.99


def test_a_rise_warns_and_does_not_fail() -> None:
    from pytest_gsm8k.core.gates import NoiseAware

    pairs = [Pair(f"n{i}", 1, 5, 1, 1) for i in range(60)] + [
        Pair(f"s{i}", 5, 5, 1, 1) for i in range(100)
    ]
    gate = NoiseAware(0.01)
    assert gate.verdict(pairs, evidence(pairs)).passed
    warning = gate.rise(pairs, evidence(pairs))
    assert warning is not None
    assert "changed prompt or extractor" in warning
    assert "contamination" in warning
    assert gate.rise(pairs[60:], evidence(pairs[60:])) is None


def test_single_run_words_have_no_stable_flips() -> None:
    """Against a single-run baseline there is no "always-right" and no stable flip; the
    counts of newly failing and newly passing are the McNemar table's."""
    from pytest_gsm8k.core.gates import NoiseAware

    pairs = [Pair(f"f{i}", 1, 1, 0, 1) for i in range(5)] + [Pair("p", 0, 1, 1, 1)]
    detail = NoiseAware(0.5).verdict(pairs, evidence(pairs)).detail
    assert "5 newly failing, 1 newly passing" in detail
    assert "stable" not in detail
    assert "always" not in detail
    assert not any(p.stable_flip for p in pairs)


def test_calibrated_counts_add_up() -> None:
    pairs = [Pair("s", 3, 3, 0, 1), Pair("n", 2, 3, 0, 1), Pair("w", 0, 3, 0, 1)]
    pairs += [Pair("ok", 3, 3, 1, 1)]
    from pytest_gsm8k.core.gates import failing_words

    assert failing_words(pairs) == (
        "2 newly failing: 1 stable (right in all 3 baseline runs), 1 noisy"
    )


def test_difference_is_the_mean_rates_with_one_interval() -> None:
    pairs = [Pair("a", 5, 5, 1, 2), Pair("b", 2, 5, 2, 2), Pair("c", 0, 5, 0, 2)]
    diff, low, high = difference(pairs)
    assert diff == pytest.approx(((0.5 - 1) + (1 - 0.4) + 0) / 3)
    assert low < diff < high
    # one run a side: Newcombe's paired interval, as core/stats.py computes it
    from pytest_gsm8k.core.stats import paired_difference_interval

    single = [Pair("a", 1, 1, 0, 1), Pair("b", 1, 1, 1, 1), Pair("c", 0, 1, 1, 1)]
    assert difference(single) == paired_difference_interval(1, 1, 1, 0)


def test_the_difference_with_repeats_is_a_95_percent_normal_interval() -> None:
    """Every interval is 95% (core/stats.py's Z95): deltas -0.5, 0.6, 0 have mean 1/30 and a
    standard error sqrt(0.60667 / 6) = 0.31798, so the half width is 1.96 x 0.31798."""
    pairs = [Pair("a", 5, 5, 1, 2), Pair("b", 2, 5, 2, 2), Pair("c", 0, 5, 0, 2)]
    assert difference(pairs) == pytest.approx((1 / 30, -0.58990, 0.65656), abs=1e-4)


def test_reach_by_hand_and_repeats_for_one_point() -> None:
    """One run a side, 100 discordant pairs (t = 1 of 2: v = 1/2) among 1,000: sigma² =
    100 * 1/2 * (1 + 1) = 100, so the drop seen with 80% power at 0.01 is (z_0.99 +
    z_0.8) * 10 = 31.7 problems, 3.17 points; 1 point (10 problems) needs L with
    (z_0.99 + z_0.8)² * 50 * (1 + 1/L) <= 100: never (the baseline's share alone is 50)."""
    from statistics import NormalDist

    z = NormalDist().inv_cdf(0.99) + NormalDist().inv_cdf(0.8)
    pairs = [Pair(f"d{i}", i % 2, 1, 1 - i % 2, 1) for i in range(100)]
    pairs += [Pair(f"s{i}", 1, 1, 1, 1) for i in range(900)]
    can = reach(pairs, 0.01)
    assert can.problems == pytest.approx(10 * z)
    assert can.points == pytest.approx(z)
    assert can.repeats_for_one_point is None
    # K = 10, 20 problems at t = 5 of 11 (v = 5*6/110): a 1-point drop needs few repeats
    calibrated = [Pair(f"n{i}", 5, 10, 0, 1) for i in range(20)]
    calibrated += [Pair(f"s{i}", 10, 10, 1, 1) for i in range(980)]
    want = next(
        ell
        for ell in range(1, 101)
        if max(
            z * math.sqrt(20 * 30 / 110 * (1 / 10 + 1 / ell)),
            math.ceil(math.log(1 / 0.0075) / math.log(math.comb(10 + ell, ell))),
        )
        <= 10
    )
    assert reach(calibrated, 0.01).repeats_for_one_point == want


def test_the_gate_says_when_it_cannot_fail() -> None:
    """Six problems, a single-run baseline right on all, the candidate wrong on all: the
    smallest p is 1/64 > 0.01, the gate cannot fail at this size and never passes."""
    from pytest_gsm8k.core.gates import NoiseAware

    pairs = [Pair(f"p{i}", 1, 1, 0, 1) for i in range(6)]
    gate = NoiseAware(0.01)
    assert gate.cannot_fail(pairs) is not None
    verdict = gate.verdict(pairs, evidence(pairs))
    assert not verdict.passed
    assert verdict.detail.startswith("not a verdict: the smallest p 6 problems can give")
    assert gate.cannot_fail(pairs * 2) is None


def test_one_run_a_side_is_linear_in_the_flips() -> None:
    """With one run a side the rate statistic is the exact McNemar test, O(m) in the m
    discordant pairs: 5,000 of them once took 9 s (40 s under load) through the O(m U_obs)
    convolution. The bound is generous (the shortcut takes milliseconds); the tails are
    McNemar's both ways."""
    pairs = [Pair(f"f{i}", 1, 1, 0, 1) for i in range(2600)]
    pairs += [Pair(f"p{i}", 0, 1, 1, 1) for i in range(2400)]
    pairs += [Pair("same", 1, 1, 1, 1)]
    started = time.perf_counter()
    seen = evidence(pairs)
    assert time.perf_counter() - started < 2.0
    assert seen.mcnemar
    assert seen.drop == pytest.approx(mcnemar_one_sided(2600, 2400), rel=1e-12)
    assert seen.rise == pytest.approx(mcnemar_one_sided(2400, 2600), rel=1e-12)
    assert seen.p == seen.drop < 0.01
