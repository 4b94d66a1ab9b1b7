"""Early stopping: exact bounds, the WoR capital process, validity by enumeration."""

from __future__ import annotations

import itertools
import math
import random
from decimal import Decimal
from fractions import Fraction

import pytest

from pytest_gsm8k.core.calibrated import Pair, evidence
from pytest_gsm8k.core.dataset import Split
from pytest_gsm8k.core.early_stop import (
    FLOOR,
    CountSpec,
    Decision,
    EarlyStop,
    Mode,
    _WorTest,
    run_order,
)
from pytest_gsm8k.core.gates import (
    MaxShare,
    MinAcc,
    NoiseAware,
    ToleranceFloor,
    count_certain,
    min_acc_count,
)
from pytest_gsm8k.core.outcome import error_record
from pytest_gsm8k.core.plan import Endpoint, GateSpecs, PlanGroup, RunPlan
from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.core.stats import mcnemar_one_sided
from pytest_gsm8k.core.tally import Tally
from pytest_gsm8k.core.types import Problem
from pytest_gsm8k.core.vllm_config import VllmConfig

IDS10 = [f"p{i}" for i in range(10)]
PROBLEM = Problem(index=3, split="test", question="q?", answer="#### 1", gold=Decimal(1))


def word(correct: bool) -> str:
    return "correct" if correct else "wrong"


def feed(
    es: EarlyStop, outcomes: dict[str, bool], order: list[str] | None = None
) -> Decision | None:
    for pid in order or es.order:
        decision = es.observe(pid, word(outcomes[pid]))
        if decision is not None:
            return decision
    return None


# -- thresholds --------------------------------------------------------------------------------


def test_min_acc_count_hand_values() -> None:
    assert min_acc_count(0.85, 1319) == 1122  # 0.85 * 1319 = 1121.15
    assert min_acc_count(0.85, 20) == 17  # exactly at the threshold passes
    assert min_acc_count(0.7, 10) == 7
    assert min_acc_count(0.0, 10) == 0
    assert min_acc_count(1.0, 10) == 10
    assert min_acc_count(1.5, 10) == 11  # nothing passes


@pytest.mark.parametrize("threshold", [0.1, 0.3, 0.45, 0.5, 0.7, 0.85, 0.9, 0.95, 1 / 3])
def test_min_acc_count_matches_the_gates_float_comparison(threshold: float) -> None:
    for n in range(1, 400):
        c = min_acc_count(threshold, n)
        assert c == n + 1 or c / n >= threshold
        assert c == 0 or (c - 1) / n < threshold


def test_mcnemar_p_is_the_exact_binomial_tail() -> None:
    for f in range(0, 40):
        for g in range(0, 40, 3):
            m = f + g
            exact = sum(Fraction(math.comb(m, i), 2**m) for i in range(f, m + 1)) if m else 1
            assert mcnemar_one_sided(f, g) == float(exact)
    assert mcnemar_one_sided(3, 0) == 0.125


# -- run order ---------------------------------------------------------------------------------


def test_run_order_is_seeded_stable_and_input_order_free() -> None:
    ids = [f"test-{i}" for i in range(50)]
    order = run_order(ids, 7)
    assert sorted(order) == sorted(ids)
    assert run_order(list(reversed(ids)), 7) == order
    assert run_order(ids, 8) != order
    # protocol identity: the order must never change between versions
    assert run_order(["a", "b", "c", "d"], 0) == run_order(["d", "c", "b", "a"], 0)
    import hashlib

    expected = sorted(
        ["a", "b", "c", "d"], key=lambda p: hashlib.sha256(f"0:{p}".encode()).digest()
    )
    assert run_order(["a", "b", "c", "d"], 0) == expected


def test_run_order_rejects_duplicates() -> None:
    with pytest.raises(ValueError, match="problem ids must be unique"):
        run_order(["a", "a"], 0)


# -- certain mode ------------------------------------------------------------------------------


def test_certain_min_acc_fail_when_unreachable() -> None:
    es = EarlyStop(IDS10, [MinAcc(0.7)], mode="certain")
    for pid in IDS10[:3]:
        assert es.observe(pid, "wrong") is None  # 7 of 10 still reachable
    decision = es.observe(IDS10[3], "wrong")  # at most 6 of 10
    assert decision is not None
    assert decision.after == 4
    assert decision.verdicts == {"min-acc": "FAIL"}
    assert es.to_json()["gates"]["min-acc"]["how"] == "certain"
    assert "at most 0.6000 reachable" in es.headline()


def test_certain_min_acc_pass_exactly_at_threshold() -> None:
    es = EarlyStop(IDS10, [MinAcc(0.7)], mode="certain")
    for pid in IDS10[:6]:
        assert es.observe(pid, "correct") is None
    decision = es.observe(IDS10[6], "correct")  # 7/10 == 0.7 passes
    assert decision is not None
    assert decision.verdicts == {"min-acc": "PASS"}
    assert set(decision.verdicts.values()) == {"PASS"}


@pytest.mark.parametrize(("threshold", "tolerance"), [(0.9, 0.08), (0.75, 0.08), (0.7, 0.0)])
def test_certain_floor_agrees_with_vllms_comparison_for_every_outcome_vector(
    threshold: float, tolerance: float
) -> None:
    """A vLLM config's floor decided early is the final comparison's verdict, for every
    outcome vector of 8 problems and every stopping point (exhaustive)."""
    floor = ToleranceFloor("c", threshold, tolerance)
    ids = [f"p{i}" for i in range(8)]
    for outcomes in itertools.product([False, True], repeat=8):
        final = floor.verdict(sum(outcomes), 8, "x").word
        es = EarlyStop(ids, [floor], mode="certain")
        decision = feed(es, dict(zip(ids, outcomes, strict=True)), ids)
        assert decision is not None  # decided at the last outcome at the latest
        assert decision.verdicts == {FLOOR: final}
        # not a problem later than needed: one outcome earlier it was still open
        if decision.after > 1:
            seen = outcomes[: decision.after - 1]
            assert count_certain(sum(seen), len(seen), 8, floor.need(8)) is None


def test_the_floor_and_min_acc_are_two_gates_of_one_stop() -> None:
    floor = ToleranceFloor("c", 0.5, 0.1)  # need 4 of 10
    es = EarlyStop(IDS10, [MinAcc(0.8), floor], mode="certain")
    for pid in IDS10[:4]:
        assert es.observe(pid, "correct") is None  # the floor passes; min-acc (8 of 10) is open
    assert "vllm-threshold verdict PASS is certain" in es.headline()
    for pid in IDS10[4:7]:
        assert es.observe(pid, "correct") is None
    decision = es.observe(IDS10[7], "correct")
    assert decision is not None
    assert decision.verdicts == {"min-acc": "PASS", FLOOR: "PASS"}
    assert es.to_json()["gates"][FLOOR]["threshold"] == floor.floor


def test_certain_zero_accuracy_stops_by_198_of_1319() -> None:
    ids = [str(i) for i in range(1319)]
    es = EarlyStop(ids, [MinAcc(0.85)], mode="certain")
    decision = feed(es, dict.fromkeys(ids, False))
    # FAIL is certain as soon as not-correct > 0.15 * 1319 = 197.85
    assert decision is not None
    assert decision.after == 198
    assert decision.verdicts["min-acc"] == "FAIL"


def test_certain_several_gates_wait_for_all_or_stop_at_a_fail() -> None:
    # every baseline answer right, alpha 0.05: 5 newly failing give p = 1/32 (FAIL whatever
    # follows); 6 right leave at most 4 to fail, p >= 1/16 (PASS)
    gates: list[CountSpec | NoiseAware] = [MinAcc(0.3), NoiseAware(0.05)]
    baseline = dict.fromkeys(IDS10, (1, 1))
    es = EarlyStop(IDS10, gates, mode="certain", baseline=baseline)
    for pid in IDS10[:3]:
        es.observe(pid, "correct")
    # min-acc PASS is certain (3/10), the baseline needs 6 right: not yet
    assert es.decision is None
    assert es.to_json()["verdicts"] == {"min-acc": "PASS", "baseline": None}
    for pid in IDS10[3:5]:
        assert es.observe(pid, "correct") is None
    decision = es.observe(IDS10[5], "correct")
    assert decision is not None
    assert decision.verdicts == {"min-acc": "PASS", "baseline": "PASS"}

    es = EarlyStop(IDS10, gates, mode="certain", baseline=baseline)
    for pid in IDS10[:4]:
        assert es.observe(pid, "wrong") is None
    decision = es.observe(IDS10[4], "wrong")  # baseline FAIL; min-acc (3 of 5 left) open
    assert decision is not None
    assert decision.verdicts == {"min-acc": None, "baseline": "FAIL"}
    assert set(decision.verdicts.values()) != {"PASS"}


def test_certain_noise_aware_single_run_is_mcnemar() -> None:
    ids = ["a", "b", "c"]
    baseline = dict.fromkeys(ids, (1, 1))
    # alpha 0.2: 3 newly failing of 3 gives p = 1/8 (FAIL); 2 of 2 gives 1/4 (PASS)
    es = EarlyStop(ids, [NoiseAware(0.2)], mode="certain", baseline=baseline)
    assert es.observe("a", "wrong") is None
    assert es.observe("b", "wrong") is None
    decision = es.observe("c", "wrong")
    assert decision is not None
    assert decision.verdicts == {"baseline": "FAIL"}
    es = EarlyStop(ids, [NoiseAware(0.2)], mode="certain", baseline=baseline)
    decision = es.observe("a", "correct")
    assert decision is not None
    assert decision.verdicts == {"baseline": "PASS"}
    assert "noise-aware p reachable" in es.headline()


def test_certain_noise_aware_calibrated_agrees_with_full_run() -> None:
    """Against a K=5 baseline the early verdict, whenever one is given, is the full run's
    (random small cases; each outcome checked, no throttle below 100 problems)."""
    rng = random.Random(7)
    for _ in range(40):
        ids = [f"p{i}" for i in range(12)]
        base = {pid: rng.choice([0, 2, 3, 5, 5, 5]) for pid in ids}
        now = {pid: rng.random() < base[pid] / 5 + 0.1 for pid in ids}
        rule = NoiseAware(0.1)
        pairs = [Pair(p, base[p], 5, int(now[p]), 1) for p in ids]
        full = rule.verdict(pairs, evidence(pairs)).word
        es = EarlyStop(ids, [rule], mode="certain", baseline={p: (base[p], 5) for p in ids})
        decision = None
        for pid in es.order:
            decision = es.observe(pid, word(now[pid]))
            if decision is not None:
                break
        assert decision is not None  # decided at the last outcome at the latest
        assert decision.verdicts["baseline"] == full


def test_noise_aware_waits_with_repeats_and_is_throttled() -> None:
    ids = [f"p{i:03d}" for i in range(300)]
    base = dict.fromkeys(ids, (5, 5))
    # a candidate with repeats: p is not monotone in its outcomes, so no early verdict
    es = EarlyStop(ids, [NoiseAware(0.01)], mode="certain", baseline=base, repeats=3)
    for pid in es.order:
        assert es.observe(pid, "wrong") is None
    assert "waits for the end" in es.headline()
    # single runs: checked every 3 outcomes (1% of 300). Two stable flips already give
    # p = 1/36 < 0.05 whatever follows; the FAIL is seen at the next check, the third
    es = EarlyStop(ids, [NoiseAware(0.05)], mode="certain", baseline=base)
    decisions = [es.observe(pid, "wrong") for pid in es.order[:3]]
    assert decisions[:2] == [None, None]
    assert decisions[2] is not None
    assert decisions[2].verdicts == {"baseline": "FAIL"}


def test_settled_before_any_outcome() -> None:
    es = EarlyStop(IDS10, [MinAcc(1.5)], mode="certain")
    assert es.decision is not None
    assert es.decision.after == 0
    assert es.decision.verdicts == {"min-acc": "FAIL"}


@pytest.mark.parametrize("mode", ["certain", "sequential"])
def test_a_gate_that_cannot_fail_is_never_settled(mode: Mode) -> None:
    """Rule 2 (issue 31): min-acc 0, a floor at or below 0, a health gate at rate 1 and a
    baseline test whose smallest p is not below alpha were "certain" to PASS before the first
    outcome, and the run stopped with a PASS after one problem. A gate no outcome can fail
    is no verdict: the early stop leaves it open to the end of the run."""
    six = IDS10[:6]
    for gates in (
        [MinAcc(0.0)],
        [ToleranceFloor("cfg", 0.05, 0.08)],
        [MaxShare("error", 1.0)],
        [NoiseAware(0.01)],
    ):
        baseline = dict.fromkeys(six, (1, 1))
        es = EarlyStop(six, gates, mode=mode, baseline=baseline)
        assert es.decision is None, gates
        for pid in six:
            assert es.observe(pid, "wrong") is None, gates
        assert None in es.to_json()["verdicts"].values()


def test_errors() -> None:
    """Nothing to decide (no gate, a baseline sharing no problem) is for_group's None (its
    test); a mode but certain or sequential is the settings' refusal (test_settings.py)."""
    es = EarlyStop(IDS10, [MinAcc(0.5)], mode="sequential")
    with pytest.raises(KeyError):
        es.observe("nope", "correct")
    # a problem is observed once: the session observes only a record Tally.add_record calls
    # fresh, and a second record of a problem (a rerun, another test's) is not
    tally, record = Tally(0.0), error_record(PROBLEM, "no answer")
    assert tally.add_record(record, "t::a")
    assert not tally.add_record(record, "t::a")
    assert not tally.add_record(record, "t::b")


def _group_of(specs: GateSpecs, config: VllmConfig | None = None) -> tuple[RunPlan, PlanGroup]:
    """A plan of one group (a config's, with its floor) asking for ``specs``'s gates."""
    group = PlanGroup("", Protocol(), (), {"seed": None}, config=config)
    split = Split("x", "main", "test", (), "f")
    plan = RunPlan(
        "x", Settings(early_stop="certain"), split, (), Endpoint(None, "m"), specs, (group,)
    )
    return plan, group


def test_for_group_builds_the_groups_gates_from_its_specs() -> None:
    """One builder for a run and a config: the specs in the order the verdict shows them,
    the baseline only when it shares a problem (with --gsm8k-require-baseline only when it
    holds every one), None with nothing to decide."""
    specs = GateSpecs(MinAcc(0.5), NoiseAware(0.05), False, (MaxShare("error", 0.1),))
    config = VllmConfig(
        name="cfg",
        source="cfg.yaml",
        model_name="m",
        accuracy_threshold=0.6,
        num_questions=10,
        num_fewshot=0,
        tolerance=0.1,
    )
    stored = {pid: {"outcome": "correct"} for pid in IDS10[:4]}
    es = EarlyStop.for_group(IDS10, *_group_of(specs, config), stored)
    assert es is not None
    assert list(es.to_json()["verdicts"]) == ["min-acc", FLOOR, "baseline", "max-error"]
    assert es.to_json()["gates"][FLOOR]["threshold"] == pytest.approx(0.5)
    required = GateSpecs(MinAcc(0.5), NoiseAware(0.05), True)
    es = EarlyStop.for_group(IDS10, *_group_of(required), stored)
    assert es is not None
    assert list(es.to_json()["verdicts"]) == ["min-acc"]
    alone = GateSpecs(None, NoiseAware(0.05), False)
    assert EarlyStop.for_group(IDS10, *_group_of(alone), None) is None
    assert EarlyStop.for_group(IDS10, *_group_of(alone), {"zz": "correct"}) is None
    assert EarlyStop.for_group([], *_group_of(specs, config), None) is None


# -- the WoR capital process -------------------------------------------------------------------


def test_capital_process_by_hand_n4() -> None:
    # population of 4, null total 2, betting up; observed 1, 1
    test = _WorTest(size=4, scale=1, null=2, up=True, alpha=0.5)  # scale 1: binary
    # t=1: mu = 2/4, v = 1/4, lam_j = 4 delta_j (cap 0.98/0.5 = 1.96): factors 1 + 2 delta_j,
    # the 0.6 bet capped at 1 + 1.96 * 0.5 = 1.98
    assert not test.update(1)
    factors1 = [1.1, 1.16, 1.24, 1.36, 1.6, 1.98]
    weights = [2, 3, 3, 2, 1, 1]
    expected1 = sum(w * f for w, f in zip(weights, factors1, strict=True)) / 12
    assert sum(test.caps) == pytest.approx(expected1)
    assert expected1 == pytest.approx(15.7 / 12)
    # t=2: mu = (2 - 1)/3 = 1/3, v = 2/9, lam_j = 4.5 delta_j (cap 2.94): factors 1 + 3 delta_j
    assert test.update(1)  # capital 24.6772 / 12 = 2.0564 >= 1/alpha = 2
    factors2 = [1.15, 1.24, 1.36, 1.54, 1.9, 2.8]
    expected2 = sum(w * a * b for w, a, b in zip(weights, factors1, factors2, strict=True)) / 12
    assert expected2 == pytest.approx(24.6772 / 12)
    assert sum(test.caps) == pytest.approx(expected2)


def _distinct_orders(values: list[int]) -> list[tuple[int, ...]]:
    return sorted(set(itertools.permutations(values)))


@pytest.mark.parametrize(
    ("values", "up", "null", "scale"),  # scale 1: the binary test
    [
        ([1, 1, 1, 0, 0, 0], True, 3, 1),
        ([1, 1, 1, 0, 0, 0], False, 3, 1),
        ([1, 1, 0, 0, 0, 0], False, 2, 1),
        ([2, 1, 1, 1, 0, 2], True, 7, 2),
        ([2, 1, 1, 1, 0, 2], False, 7, 2),
    ],
)
def test_capital_is_a_martingale_under_the_boundary_null(
    values: list[int], up: bool, null: int, scale: int
) -> None:
    """E[K_t] = 1 for every t when the population total equals the null (exact enumeration)."""
    assert sum(values) == null
    orders = _distinct_orders(values)
    for t in range(1, len(values) + 1):
        total = 0.0
        for order in orders:
            test = _WorTest(len(values), scale, null, up, alpha=1e-9)
            for v in order[:t]:
                test.update(v)
            total += sum(test.caps)
        assert total / len(orders) == pytest.approx(1.0, abs=1e-12)


def test_capital_at_the_boundary_is_a_supermartingale_inside_the_null() -> None:
    values = [1, 1, 0, 0, 0, 0]  # total 2 <= null 3: betting up
    orders = _distinct_orders(values)
    means = []
    for t in range(1, 7):
        caps = []
        for order in orders:
            test = _WorTest(6, 1, 3, True, alpha=1e-9)
            for v in order[:t]:
                test.update(v)
            caps.append(sum(test.caps))
        means.append(sum(caps) / len(caps))
    assert all(m <= 1.0 + 1e-12 for m in means)
    assert means[-1] < 0.9  # it does lose money against a false-side population


# -- sequential validity by enumeration ---------------------------------------------------------


def _wrong_rate_min_acc(n: int, correct: int, min_acc: float, alpha: float) -> tuple[float, float]:
    ids = [str(i) for i in range(n)]
    population = [1] * correct + [0] * (n - correct)
    full = "PASS" if correct / n >= min_acc else "FAIL"
    wrong = early = 0
    orders = _distinct_orders(population)
    for values in orders:
        outcomes = {pid: bool(v) for pid, v in zip(ids, values, strict=True)}
        es = EarlyStop(ids, [MinAcc(min_acc)], mode="sequential", alpha=alpha)
        decision = feed(es, outcomes)
        assert decision is not None
        wrong += decision.verdicts["min-acc"] != full
        early += es.to_json()["gates"]["min-acc"]["how"] == "sequential"
    return wrong / len(orders), early / len(orders)


@pytest.mark.parametrize("min_acc", [0.25, 0.5, 0.625, 0.75])
def test_sequential_wrong_verdict_rate_at_most_alpha_n8(min_acc: float) -> None:
    alpha = 0.3
    worst = 0.0
    any_early = 0.0
    for correct in range(9):
        wrong, early = _wrong_rate_min_acc(8, correct, min_acc, alpha)
        assert wrong <= alpha + 1e-12, (correct, wrong)
        worst = max(worst, wrong)
        any_early += early
    assert any_early > 0  # the statistics did decide something early: the check bites


def test_sequential_wrong_rate_bites_near_threshold_n10() -> None:
    # a population one below the threshold: early PASSes happen, and stay under alpha
    wrong, early = _wrong_rate_min_acc(10, 4, 0.5, 0.5)
    assert 0 < wrong <= 0.5
    assert early > 0


def test_sequential_decides_a_broken_model_quickly() -> None:
    ids = [str(i) for i in range(1319)]
    es = EarlyStop(ids, [MinAcc(0.85)], mode="sequential", seed=3)
    decision = feed(es, dict.fromkeys(ids, False))
    assert decision is not None
    assert decision.verdicts["min-acc"] == "FAIL"
    assert decision.after <= 20
    data = es.to_json()
    assert data["gates"]["min-acc"]["interval"][1] < 0.85
    assert data["gates"]["min-acc"]["interval"][0] == 0.0


def test_sequential_interval_contains_the_truth_and_agrees_with_verdict() -> None:
    ids = [str(i) for i in range(400)]
    rng = random.Random(5)
    for seed in range(5):
        outcomes = {pid: rng.random() < 0.6 for pid in ids}
        truth = sum(outcomes.values()) / 400
        es = EarlyStop(ids, [MinAcc(0.75)], mode="sequential", seed=seed)
        decision = feed(es, outcomes)
        assert decision is not None
        assert decision.verdicts["min-acc"] == "FAIL"
        lo, hi = es.to_json()["gates"]["min-acc"]["interval"]
        assert lo <= truth <= hi < 0.75


def test_two_gates_split_alpha() -> None:
    ids = [str(i) for i in range(100)]
    es = EarlyStop(ids, [MinAcc(0.5), MaxShare("error", 0.1)], mode="sequential", alpha=0.1)
    assert es.gate_alpha == pytest.approx(0.05)
    es = EarlyStop(
        ids,
        [MinAcc(0.5), NoiseAware(0.05)],
        mode="sequential",
        alpha=0.1,
        baseline=dict.fromkeys(ids, (1, 1)),
    )
    assert es.gate_alpha == pytest.approx(0.1)  # the noise-aware test has no sequential test


# -- out-of-order arrivals ---------------------------------------------------------------------


def test_out_of_order_feeds_the_seeded_prefix() -> None:
    ids = [str(i) for i in range(300)]
    outcomes = {pid: int(pid) % 5 == 0 for pid in ids}  # accuracy 0.2
    in_order = EarlyStop(ids, [MinAcc(0.85)], mode="sequential", seed=11)
    expected = feed(in_order, outcomes)
    assert expected is not None

    es = EarlyStop(ids, [MinAcc(0.85)], mode="sequential", seed=11)
    first = es.order[0]
    for pid in reversed(es.order[1:60]):
        assert es.observe(pid, word(outcomes[pid])) is None  # nothing fed until the first arrives
    assert es.observed == 0
    decision = es.observe(first, word(outcomes[first]))
    assert decision == expected
    assert es.observed == expected.after


def test_certain_mode_uses_every_arrival_at_once() -> None:
    es = EarlyStop(IDS10, [MinAcc(0.7)], mode="certain")
    for pid in reversed(es.order[-4:]):
        es.observe(pid, "wrong")
    assert es.decision is not None
    assert es.observed == 4


# -- report shapes -----------------------------------------------------------------------------


def test_to_json_and_headline_shapes() -> None:
    ids = [str(i) for i in range(1319)]
    es = EarlyStop(ids, [MinAcc(0.85)], mode="sequential", seed=0)
    assert es.headline().startswith("not stopped early (0 of 1319 problems): min-acc undecided")
    outcomes = {pid: int(pid) % 2 == 0 for pid in ids}
    decision = feed(es, outcomes)
    assert decision is not None
    data = es.to_json()
    assert set(data) == {
        "mode",
        "alpha",
        "gate_alpha",
        "seed",
        "n_total",
        "observed",
        "decided_after",
        "verdicts",
        "gates",
    }
    assert data["mode"] == "sequential"
    assert data["decided_after"] == decision.after
    assert data["verdicts"] == {"min-acc": "FAIL"}
    gate = data["gates"]["min-acc"]
    lo, hi = gate["interval"]
    b_lo, b_hi = gate["bounds"]
    assert b_lo <= lo <= hi <= b_hi
    line = es.headline()
    assert line.startswith(
        f"stopped after {decision.after} of 1319 problems: min-acc verdict "
        "FAIL at alpha 0.05 (accuracy of the full split in ["
    )
    assert f"{hi:.4f}]" in line

    es = EarlyStop(ids, [MinAcc(0.85)], mode="certain")
    feed(es, outcomes)
    assert es.to_json()["alpha"] is None
    assert "interval" not in es.to_json()["gates"]["min-acc"]
    assert es.headline().endswith("min-acc verdict FAIL is certain (at most 0.8499 reachable)")


def test_fraction_threshold_exactness() -> None:
    # 0.1 + 0.2 style decimals: the count threshold follows the gate's float test
    n = 30
    c = min_acc_count(0.3, n)
    assert c == 9
    assert math.isclose(9 / 30, 0.3)
    assert Fraction(9, 30) == Fraction(3, 10)


# -- the answer-format health gates -------------------------------------------------------------


def feed_outcomes(es: EarlyStop, outcomes: dict[str, str]) -> Decision | None:
    """Feed each problem's outcome word (``correct`` counts as correct) in the run order."""
    for pid in es.order:
        decision = es.observe(pid, outcomes[pid])
        if decision is not None:
            return decision
    return None


def test_certain_health_gate_fails_once_the_count_exceeds_the_full_runs_allowance() -> None:
    """max-truncated 0.05 over 1319 problems allows 65: the 66th truncated answer fails
    the gate, whatever the rest would be."""
    ids = [str(i) for i in range(1319)]
    es = EarlyStop(ids, [MaxShare("truncated", 0.05)], mode="certain", seed=1)
    decision = feed_outcomes(es, dict.fromkeys(ids, "truncated"))
    assert decision is not None
    assert decision.verdicts == {"max-truncated": "FAIL"}
    assert decision.after == 66
    gate = es.to_json()["gates"]["max-truncated"]
    assert (gate["count"], gate["allowed"], gate["observed"]) == (66, 65, 66)
    assert "max-truncated verdict FAIL is certain (66 truncated already, 65 allowed)" in (
        es.headline()
    )


def test_certain_health_gate_passes_only_when_the_unseen_cannot_exceed_it() -> None:
    """Every answer clean: PASS is certain once even all unseen problems truncated stay
    within the allowance (10 problems at 0.2: 2 allowed, so after 8)."""
    ids = [f"p{i}" for i in range(10)]
    es = EarlyStop(ids, [MaxShare("truncated", 0.2)], mode="certain")
    decision = feed_outcomes(es, dict.fromkeys(ids, "wrong"))  # wrong is not truncated
    assert decision is not None
    assert decision.verdicts == {"max-truncated": "PASS"}
    assert decision.after == 8


def test_certain_health_gate_counts_only_its_own_outcome() -> None:
    ids = [f"p{i}" for i in range(10)]
    outcomes = dict.fromkeys(ids, "unparsed")
    es = EarlyStop(ids, [MaxShare("truncated", 0.0), MaxShare("unparsed", 0.1)], mode="certain")
    decision = feed_outcomes(es, outcomes)
    assert decision is not None
    # unparsed allows 1 of 10: the second fails it; truncated is still open (not settled)
    assert decision.verdicts == {"max-truncated": None, "max-unparsed": "FAIL"}
    assert decision.after == 2


def test_each_health_gate_is_given_once() -> None:
    """The early stop keeps one verdict per gate name: the options state each gate once."""
    settings = Settings(max_error=0.5, max_unparsed=0.5, max_truncated=0.5, early_stop="certain")
    specs = GateSpecs.from_settings(settings)
    names = [g.name for g in specs.health]
    assert sorted(names) == sorted(set(names)) == ["max-error", "max-truncated", "max-unparsed"]
    es = EarlyStop.for_group(IDS10, *_group_of(specs), None)
    assert es is not None
    assert list(es.to_json()["verdicts"]) == ["max-unparsed", "max-truncated", "max-error"]


def test_health_gates_take_their_share_of_the_sequential_alpha() -> None:
    ids = [str(i) for i in range(100)]
    gates: list[CountSpec] = [MinAcc(0.5), MaxShare("truncated", 0.05), MaxShare("error", 0.01)]
    es = EarlyStop(ids, gates, mode="sequential", alpha=0.1)
    assert es.gate_alpha == pytest.approx(0.1 / 3)


def test_sequential_health_gate_passes_a_clean_run_early() -> None:
    """No answer truncated of 1319 against 0.05: the sequential test settles PASS long
    before the certain bound would (after 1254), and its interval holds the truth, 0."""
    ids = [str(i) for i in range(1319)]
    es = EarlyStop(ids, [MaxShare("truncated", 0.05)], mode="sequential", seed=2)
    decision = feed_outcomes(es, dict.fromkeys(ids, "correct"))
    assert decision is not None
    assert decision.verdicts == {"max-truncated": "PASS"}
    assert es.to_json()["gates"]["max-truncated"]["how"] == "sequential"
    assert decision.after < 200
    lo, hi = es.to_json()["gates"]["max-truncated"]["interval"]
    assert lo == 0.0
    assert hi < 0.05
    assert "max-truncated verdict PASS at alpha 0.05 (truncated share of the full split" in (
        es.headline()
    )


def test_sequential_health_gate_wrong_verdict_rate_at_most_alpha() -> None:
    """Every order of every population of 8 problems (k truncated), rate 0.25 (2 allowed):
    the early verdict differs from the full run's in at most alpha of the orders."""
    n, alpha = 8, 0.3
    ids = [str(i) for i in range(n)]
    any_early = 0
    for bad in range(n + 1):
        population = [1] * bad + [0] * (n - bad)
        full = "PASS" if bad <= 2 else "FAIL"
        wrong = 0
        orders = _distinct_orders(population)
        for values in orders:
            outcomes = {
                pid: "truncated" if v else "correct" for pid, v in zip(ids, values, strict=True)
            }
            es = EarlyStop(ids, [MaxShare("truncated", 0.25)], mode="sequential", alpha=alpha)
            decision = feed_outcomes(es, outcomes)
            assert decision is not None
            wrong += decision.verdicts["max-truncated"] != full
            any_early += es.to_json()["gates"]["max-truncated"]["how"] == "sequential"
        assert wrong / len(orders) <= alpha + 1e-12, (bad, wrong)
    assert any_early > 0  # the statistics decided something early: the check bites


def test_with_repeats_min_acc_counts_every_answer() -> None:
    """--gsm8k-repeats 3: the early stop decides min-acc on the mean over every answer, as
    the end of the run does (issue 32). Four problems right 2 of 3 times: their majorities
    are all right (1.0) but test@1 is 2/3, below 0.7 for certain after all four."""
    stop = EarlyStop(["a", "b", "c", "d"], [MinAcc(0.7)], mode="certain", repeats=3)
    answers = ["correct", "correct", "wrong"]
    decisions = [stop.observe(pid, "correct", answers) for pid in "abcd"]
    assert decisions[2] is None
    decision = decisions[3]
    assert decision is not None
    assert decision.verdicts["min-acc"] == "FAIL"
    assert stop.to_json()["gates"]["min-acc"]["bounds"] == [8 / 12, 8 / 12]
