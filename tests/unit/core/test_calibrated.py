"""The noise-aware baseline test, checked exactly against brute force on small cases."""

from __future__ import annotations

import itertools
import math
import random
import time

import pytest

from pytest_gsm8k.core.calibrated import (
    RESOLUTION,
    Pair,
    detectable_drop,
    null_moments,
    p_value,
    statistic,
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
    observed = statistic(pairs)
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
    assert p_value(pairs) == pytest.approx(_brute_p(pairs), rel=1e-9, abs=1e-12)


@pytest.mark.parametrize(
    ("failing", "passing"), [(0, 0), (1, 0), (3, 1), (7, 0), (20, 9), (60, 40)]
)
def test_single_runs_give_exactly_mcnemar(failing: int, passing: int) -> None:
    pairs = [Pair(f"f{i}", 1, 1, 0, 1) for i in range(failing)]
    pairs += [Pair(f"p{i}", 0, 1, 1, 1) for i in range(passing)]
    pairs += [Pair("same1", 1, 1, 1, 1), Pair("same0", 0, 1, 0, 1)]
    assert p_value(pairs) == pytest.approx(mcnemar_one_sided(failing, passing), rel=1e-12)


def test_a_stable_problem_that_fails_weighs_more_than_a_noisy_one() -> None:
    stable = Pair("s", 5, 5, 0, 1)
    noisy = Pair("n", 3, 5, 0, 1)
    rare = Pair("r", 1, 5, 0, 1)
    assert stable.score == round(RESOLUTION * math.log(6) ** 2)
    assert noisy.score == round(RESOLUTION * math.log(2) ** 2)
    assert stable.score > noisy.score > rare.score > 0
    assert Pair("ok", 5, 5, 1, 1).score == 0
    assert p_value([stable] * 3) < p_value([noisy] * 3)


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
            assert p_value(lower) <= p_value(higher) + 1e-12


def test_null_moments_match_the_exact_law() -> None:
    pairs = [Pair("a", 3, 5, 0, 1), Pair("b", 2, 3, 1, 2), Pair("c", 5, 5, 0, 1)]
    mean, var = null_moments(pairs)
    # enumerate the same law by brute force
    laws = []
    for pair in pairs:
        total = pair.base_correct + pair.now_correct
        row = []
        for d in range(pair.now_runs + 1):
            prob = _hypergeom(total, pair.base_runs, pair.now_runs, d)
            if prob > 0:
                row.append(
                    (
                        Pair("x", total - d, pair.base_runs, d, pair.now_runs).score / RESOLUTION,
                        prob,
                    )
                )
        laws.append(row)
    m1 = m2 = 0.0
    for combo in itertools.product(*laws):
        prob = math.prod(p for _, p in combo)
        s = sum(v for v, _ in combo)
        m1 += prob * s
        m2 += prob * s * s
    assert mean == pytest.approx(m1)
    assert var == pytest.approx(m2 - m1 * m1)


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
        rejections += p_value(pairs) < alpha
    assert rejections / trials <= alpha + 2 * math.sqrt(alpha * (1 - alpha) / trials)


def test_a_collapse_is_decided_by_a_bound_below_the_exact_tail() -> None:
    pairs = [Pair(str(i), 5, 5, 0, 1) for i in range(900)] + [
        Pair(f"n{i}", 2, 5, i % 2, 1) for i in range(300)
    ]
    started = time.perf_counter()
    p = p_value(pairs)
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
    assert p_value(pairs) < 1e-6
    assert time.perf_counter() - started < 20


def test_detectable_drop_single_runs_needs_a_handful() -> None:
    pairs = [Pair(str(i), 1, 1, 1, 1) for i in range(1000)]
    # nothing informative: only failures alone can reach alpha: 2^-m < 0.01 -> 7
    assert detectable_drop(pairs, 0.01) == 7
    noisy = pairs + [Pair(f"n{i}", i % 2, 1, 1 - i % 2, 1) for i in range(100)]
    assert detectable_drop(noisy, 0.01) > 7


def test_detectable_drop_has_the_power_it_claims_against_single_runs() -> None:
    """Single runs make the test exact McNemar, whose power is simulated here directly.

    1,000 stable-right problems and 132 flipping at p = 0.5 in every run: the drop the
    function names must be caught in about 80% of reruns. A flipped problem is a discordant
    pair the null expects to fall either way half the time, so it adds half its weight over
    the null mean (the first version counted all of it, named 13 and had 15% power)."""
    rng = random.Random(7)

    def rerun() -> list[tuple[bool, bool]]:
        return [(rng.random() < 0.5, rng.random() < 0.5) for _ in range(132)]

    def unchanged() -> list[Pair]:
        pairs = [Pair(f"n{i}", int(b), 1, int(n), 1) for i, (b, n) in enumerate(rerun())]
        return pairs + [Pair(f"s{i}", 1, 1, 1, 1) for i in range(1000)]

    def caught(drop: int) -> bool:
        noise = rerun()
        failing = sum(b and not n for b, n in noise) + drop
        passing = sum(n and not b for b, n in noise)
        return mcnemar_one_sided(failing, passing) < 0.01

    named = sorted(detectable_drop(unchanged(), 0.01) for _ in range(9))[4]
    assert 25 <= named <= 35
    assert 700 <= sum(caught(named) for _ in range(1000)) <= 900


def test_the_gate_fails_a_significant_drop_and_names_the_stable_flips() -> None:
    from pytest_gsm8k.core.gates import NoiseAware

    pairs = [Pair(f"s{i}", 5, 5, 0, 1) for i in range(6)] + [
        Pair(f"k{i}", 5, 5, 1, 1) for i in range(100)
    ]
    verdict = NoiseAware(0.01).verdict(pairs)
    assert not verdict.passed
    assert verdict.rule == "noise-aware"
    assert "6 always-right problems failing now" in verdict.detail
    assert verdict.value is not None
    assert verdict.value < 0.01
    # the same flips within an allowed drop of 10 points pass
    assert NoiseAware(0.01, max_drop=0.1).verdict(pairs).passed


def test_single_run_gate_is_mcnemar_and_says_so() -> None:
    from pytest_gsm8k.core.gates import NoiseAware

    pairs = [Pair(f"f{i}", 1, 1, 0, 1) for i in range(7)] + [Pair("x", 1, 1, 1, 1)]
    verdict = NoiseAware(0.01).verdict(pairs)
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
        outcomes.add(gate.verdict(full).word)
    if claim is not None:
        assert outcomes == {claim}
    if not unseen:
        assert claim is not None


def _noisy_run(
    rng: random.Random, n: int, before: int, drop: int, noisy: float = 0.1
) -> list[Pair]:
    """A model right on 90% of its problems, ``noisy`` of them flipping at p = 0.5 in every
    run; the candidate is one run with ``drop`` always-right problems turned wrong."""
    pairs = []
    flipped = 0
    for i in reversed(range(n)):
        if i < noisy * n:
            base = sum(rng.random() < 0.5 for _ in range(before))
            now = int(rng.random() < 0.5)
        elif i % 10 == 9:
            base, now = 0, 0
        else:
            base, now = before, int(flipped >= drop)
            flipped += 1 - now
        pairs.append(Pair(f"p{i}", base, before, now, 1))
    assert flipped == drop
    return pairs


@pytest.mark.parametrize("before", [1, 5])
def test_detectable_drop_has_about_the_power_it_claims(before: int) -> None:
    """The drop detectable_drop names is caught in about 80% of simulated reruns at its
    alpha (the test itself, not its approximation), and half of it clearly less often: the
    number printed is neither optimistic nor far too cautious. For one run a side the
    formula once left out a flip's own null mean and printed half the drop McNemar needs."""
    rng = random.Random(2024)
    n, alpha = 400, 0.05
    drop = detectable_drop(_noisy_run(rng, n, before, 0), alpha)
    assert 2 <= drop <= 40

    def power(m: int, reruns: int = 150) -> float:
        hits = sum(p_value(_noisy_run(rng, n, before, m)) < alpha for _ in range(reruns))
        return hits / reruns

    assert 0.65 <= power(drop) <= 0.97
    assert power(max(1, drop // 2)) < 0.6


def test_detectable_drop_at_the_issues_numbers() -> None:
    """n = 1319, alpha 0.01, 10% of problems noisy at p = 0.5: about 30 problems for a
    single-run baseline (McNemar's own power), 8 with K = 5."""
    rng = random.Random(1)
    single = detectable_drop(_noisy_run(rng, 1319, 1, 0), 0.01)
    calibrated = detectable_drop(_noisy_run(rng, 1319, 5, 0), 0.01)
    assert 25 <= single <= 36
    assert 6 <= calibrated <= 10
