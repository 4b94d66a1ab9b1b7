"""Simulation of the baseline gates under serving noise: false alarms and power.

A script, not a test. A population of GSM8K problems, most stable (always right or always
wrong) and a share flipping at random from run to run (serving noise), is run as a baseline
recorded ``K`` times per problem and a candidate run once, many times over. Per row it
prints how often each gate FAILs: the false-alarm rate for an unchanged model, the power for
a true drop (stable-correct problems now always wrong):

* the noise-aware gate (core/calibrated.py, ``NoiseAware(alpha, max_drop=0)``: the default
  gate against a baseline), beside the drop it says it detects with 80% power
  (:func:`~pytest_gsm8k.core.calibrated.detectable_drop`, median over the first reruns);
* the old default ``--gsm8k-max-drop 0`` (any drop fails), exact McNemar at
  ``--gsm8k-alpha 0.05`` and vLLM's rule (accuracy >= baseline accuracy - 0.08, the absolute
  tolerance of its tests/evals/gsm8k/test_gsm8k_correctness.py), each on the baseline's first
  run against the candidate, as a single-run baseline holds.

    python benchmarks/bench_gate.py [--reruns 1000] [--check 10] [--quick] [--alpha 0.01]
                                    [--weights squared|linear|count] [--seed 2026]

It ends with the targets (full split, 10% of problems flipping at p = 0.5), each PASS or
FAIL, and exits 1 on a miss.

Speed: the real ``p_value`` is an exact capped convolution in pure Python, 20-170 ms per
rerun of the full split (the Pairs built, the drop rows with 20% noise the slowest), so the
table's 48,000 reruns take half an hour of CPU; the twin below, under 2 ms. With one candidate
run per problem (``L = 1``) the test's statistic depends only on ``(m_t, f_t)`` for ``t =
1..K``: how many informative problems have ``t`` successes over their ``K + 1`` runs, and how
many of those failed now. Each such failure scores ``z_t = round(16 ln² q_t)`` with ``q_t =
P(D = 0 | t) = (K + 1 - t) / (K + 1)``, so the null law of ``S`` is a sum of ``K`` scaled
binomials, ``Σ z_t Bin(m_t, q_t)``: :func:`twin_p_value` convolves them with numpy (exact
rational binomial probabilities, one rounding each). ``--check N`` rebuilds the first ``N``
reruns of every row as :class:`~pytest_gsm8k.core.calibrated.Pair` lists and requires the
real ``NoiseAware(alpha).verdict`` to give the same verdict and p-value, and
:func:`~pytest_gsm8k.core.calibrated.statistic` the same ``S``; any difference stops the
script with an error. Only public names of the package are used: the per-problem score is
recomputed from :func:`~pytest_gsm8k.core.stats.hypergeometric_pmf` with the module's
``RESOLUTION`` and checked against ``Pair.score`` for every ``(K, t)``.

``--weights`` reproduces the comparison in core/calibrated.py's docstring: ``linear`` scores
a failure ``round(16 u)`` (Fisher's combination, ``u = -ln q_t``), ``count`` scores it 1 (a
plain count of failures, weighted alike); both are exact conditional tests too, but only the
default ``squared`` is the gate, so ``--check`` covers the squared twin only. A section at
the end compares the three at ``K = 5`` by default.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any, Literal

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytest_gsm8k.core.calibrated import (
    RESOLUTION,
    Pair,
    detectable_drop,
    statistic,
)
from pytest_gsm8k.core.gates import NoiseAware, max_drop_count
from pytest_gsm8k.core.stats import hypergeometric_pmf, mcnemar_one_sided

Weights = Literal["squared", "linear", "count"]

N = 1319
LIMIT = 200
#: vLLM's tests/evals/gsm8k: accuracy >= accuracy_threshold - tolerance (default 0.08)
VLLM_TOLERANCE = 0.08
MCNEMAR_ALPHA = 0.05
#: share of the stable problems the model gets right (GSM8K's range for a good small model)
ACCURACY = 0.75
#: true drops in points of the split: 13, 26 and 53 problems of 1,319; 2, 4, 8 of 200
DROP_POINTS = (1, 2, 4)
REPEATS = (1, 2, 3, 5)


@dataclass(frozen=True)
class Row:
    """One simulated setting: ``size`` problems, ``noisy`` of them flipping at ``rate``, the
    rest split into stable-correct and stable-wrong; ``drop`` stable-correct problems always
    wrong in the candidate; the baseline run ``repeats`` times, the candidate once."""

    size: int
    noise: float
    repeats: int
    drop: int
    rate: float = 0.5

    @property
    def noisy(self) -> int:
        return round(self.noise * self.size)

    @property
    def stable_correct(self) -> int:
        return round(ACCURACY * (self.size - self.noisy))

    @property
    def stable_wrong(self) -> int:
        return self.size - self.noisy - self.stable_correct

    @property
    def label(self) -> str:
        split = "full" if self.size == N else f"limit {self.size}"
        drop = (
            "unchanged"
            if self.drop == 0
            else f"drop {self.drop} ({100 * self.drop / self.size:.1f} pt)"
        )
        return f"{100 * self.noise:.0f}% noisy | {split} | K={self.repeats} | {drop}"


def _unit_score(q: float, weights: Weights) -> int:
    """A failure's integer score given ``q = P(D = 0 | t)``, as ``calibrated._scores``
    writes it for ``squared`` (checked against ``Pair.score`` by :func:`check_scores`)."""
    if weights == "count":
        return 1
    if weights == "linear":
        return round(RESOLUTION * -math.log(min(1.0, q)))
    return round(RESOLUTION * math.log(min(1.0, q)) ** 2)


@cache
def fail_score(repeats: int, total: int, weights: Weights = "squared") -> int:
    """``z_t``: the score of a problem with ``total`` successes over ``repeats + 1`` runs
    whose candidate run failed."""
    return _unit_score(hypergeometric_pmf(total, repeats, 1)[0], weights)


@cache
def _binomial(count: int, repeats: int, total: int) -> Any:
    """``P(Bin(count, q) = j)`` for ``q = (K + 1 - t) / (K + 1)``: exact integers, one
    rounding per term (``q`` is rational)."""
    good, bad, whole = repeats + 1 - total, total, (repeats + 1) ** count
    return np.array(
        [math.comb(count, j) * good**j * bad ** (count - j) / whole for j in range(count + 1)]
    )


@lru_cache(maxsize=200_000)
def twin_p_value(
    repeats: int, strata: tuple[tuple[int, int], ...], weights: Weights = "squared"
) -> tuple[float, int]:
    """``(p, S)`` of the noise-aware test from the strata ``((m_t, f_t) for t = 1..K)``:
    ``P(Σ z_t Bin(m_t, q_t) >= S_obs)`` with ``S_obs = Σ z_t f_t`` (1.0 when ``S_obs <=
    0``, as ``p_value``)."""
    observed = sum(fail_score(repeats, t, weights) * f for t, (_, f) in enumerate(strata, 1))
    if observed <= 0:
        return 1.0, observed
    dist = np.ones(1)
    for t, (m, _) in enumerate(strata, 1):
        z = fail_score(repeats, t, weights)
        if m == 0 or z == 0:
            continue
        spread = np.zeros(m * z + 1)
        spread[::z] = _binomial(m, repeats, t)
        dist = np.convolve(dist, spread)
    return min(1.0, math.fsum(dist[observed:].tolist())), observed


@dataclass
class Reruns:
    """One row's simulated reruns (arrays over reruns, or over reruns and noisy problems)."""

    row: Row
    base_runs: Any  # (reruns, noisy, K) bool: the noisy problems' baseline runs
    now: Any  # (reruns, noisy) bool: their candidate run

    def strata(self, rerun: int) -> tuple[tuple[int, int], ...]:
        c = self.base_runs[rerun].sum(axis=1)
        d = self.now[rerun]
        k = self.row.repeats
        out = []
        for t in range(1, k + 1):
            m = int(np.count_nonzero(c + d == t))
            f = int(np.count_nonzero((c == t) & ~d))
            if t == k:  # the dropped problems: right K of K, wrong now
                m, f = m + self.row.drop, f + self.row.drop
            out.append((m, f))
        return tuple(out)

    def pairs(self, rerun: int) -> list[Pair]:
        """The rerun as the gate sees it: one Pair per problem."""
        row, k = self.row, self.row.repeats
        c = self.base_runs[rerun].sum(axis=1)
        d = self.now[rerun]
        pairs = [Pair(f"n{i}", int(c[i]), k, int(d[i]), 1) for i in range(row.noisy)]
        pairs += [
            Pair(f"c{i}", k, k, 0 if i < row.drop else 1, 1) for i in range(row.stable_correct)
        ]
        pairs += [Pair(f"w{i}", 0, k, 0, 1) for i in range(row.stable_wrong)]
        return pairs


def simulate(row: Row, reruns: int, rng: np.random.Generator) -> Reruns:
    base = rng.random((reruns, row.noisy, row.repeats)) < row.rate
    now = rng.random((reruns, row.noisy)) < row.rate
    return Reruns(row, base, now)


@dataclass
class Result:
    """FAIL shares over the reruns, and the p-values of the noise-aware test."""

    row: Row
    reruns: int
    noise_aware: float
    max_drop: float
    mcnemar: float
    vllm: float
    predicted: float  # median detectable_drop at 80% power, in problems
    p_values: Any  # (reruns,) float
    drop_units: Any  # (reruns,) int: K * size * (mean baseline rate - mean candidate rate)


def run_row(
    row: Row, reruns: int, alpha: float, weights: Weights, seed: int, check: int, predict: int
) -> Result:
    sim = simulate(row, reruns, np.random.default_rng(seed))
    k = row.repeats
    p = np.empty(reruns)
    stats = np.empty(reruns, dtype=np.int64)
    for r in range(reruns):
        p[r], stats[r] = twin_p_value(k, sim.strata(r), weights)
    # the noise-aware gate's drop clause (max_drop 0): mean baseline rate above the candidate's
    base_sum = sim.base_runs.sum(axis=(1, 2)) + k * row.stable_correct
    now_sum = sim.now.sum(axis=1) + row.stable_correct - row.drop
    drop_units = base_sum - k * now_sum
    fail = (p < alpha) & (drop_units > 0)
    # the single-run gates read the baseline's first run
    first = sim.base_runs[:, :, 0]
    baseline = first.sum(axis=1) + row.stable_correct
    candidate = now_sum
    failing = (first & ~sim.now).sum(axis=1) + row.drop
    passing = (~first & sim.now).sum(axis=1)
    max_drop = vllm = mc = 0
    for b, x, f, g in zip(
        baseline.tolist(), candidate.tolist(), failing.tolist(), passing.tolist(), strict=True
    ):
        max_drop += x < max_drop_count(b, row.size, 0.0)
        vllm += not x / row.size >= b / row.size - VLLM_TOLERANCE
        mc += not _mcnemar_passes(f, g)
    for r in range(min(check, reruns)) if weights == "squared" else ():
        _check(sim, r, alpha, float(p[r]), int(stats[r]), bool(fail[r]))
    drops = [detectable_drop(sim.pairs(r), alpha, 0.8) for r in range(min(predict, reruns))]
    predicted = float(np.median(drops)) if drops else math.nan
    return Result(
        row,
        reruns,
        float(fail.mean()),
        max_drop / reruns,
        mc / reruns,
        vllm / reruns,
        predicted,
        p,
        drop_units,
    )


@lru_cache(maxsize=100_000)
def _mcnemar_passes(failing: int, passing: int) -> bool:
    """The old gate ``--gsm8k-alpha 0.05`` gave a single-run baseline: the exact one-sided
    McNemar test (counts repeat: cached)."""
    return bool(mcnemar_one_sided(failing, passing) >= MCNEMAR_ALPHA)


class TwinMismatch(AssertionError):
    """The numpy twin and the real test disagree: the figures would be about another test."""


def _check(sim: Reruns, rerun: int, alpha: float, p: float, s: int, fail: bool) -> None:
    pairs = sim.pairs(rerun)
    real = NoiseAware(alpha).verdict(pairs)
    real_s = statistic(pairs)
    real_p = real.value
    assert real_p is not None
    where = f"{sim.row.label}, rerun {rerun}"
    if real_s != s:
        raise TwinMismatch(f"{where}: statistic {s} (twin) != {real_s} (calibrated.statistic)")
    if real.passed == fail:
        raise TwinMismatch(
            f"{where}: twin says {'FAIL' if fail else 'PASS'}, NoiseAware says {real.word} "
            f"(p {p!r} vs {real_p!r})"
        )
    if not p_values_agree(p, real_p):
        raise TwinMismatch(f"{where}: p-value {p!r} (twin) != {real_p!r} (NoiseAware)")


def p_values_agree(twin: float, real: float) -> bool:
    """Equal to 1e-9 relative, or both below 1e-12 (where ``p_value`` may return its
    Chernoff bound instead of the exact tail: the verdict is the same)."""
    if twin < 1e-12 and real < 1e-12:
        return True
    return abs(twin - real) <= 1e-9 * max(abs(real), 1e-300)


def check_scores(max_repeats: int = 8) -> None:
    """The twin's per-failure scores are ``Pair.score`` for every ``K`` and ``t``."""
    for k in range(1, max_repeats + 1):
        for t in range(1, k + 1):
            real = Pair("x", t, k, 0, 1).score
            if real != fail_score(k, t):
                raise TwinMismatch(f"K={k}, t={t}: score {fail_score(k, t)} != Pair.score {real}")


def rows(quick: bool) -> list[Row]:
    out = []
    for noise, sizes in ((0.10, (N, LIMIT)), (0.20, (N,))):
        for size in sizes:
            for k in REPEATS:
                for points in (0, *DROP_POINTS):
                    out.append(Row(size, noise, k, round(points * size / 100)))
    if quick:
        out = [r for r in out if r.repeats in (1, 5) and r.drop <= round(2 * r.size / 100)]
    return out


def _se(rate: float, reruns: int) -> float:
    return math.sqrt(rate * (1.0 - rate) / reruns)


def _table(results: Sequence[Result], alpha: float, weights: Weights) -> list[str]:
    gate = "noise-aware" + ("" if weights == "squared" else f" ({weights} weights)")
    lines = [
        f"| noise | split | K | candidate | {gate} {alpha:g} | detects (80%) "
        f"| max-drop 0 | McNemar {MCNEMAR_ALPHA:g} | vLLM -{VLLM_TOLERANCE:g} |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        noise, split, k, cand = res.row.label.split(" | ")
        pts = 100 * res.predicted / res.row.size
        lines.append(
            f"| {noise} | {split} | {k} | {cand} | {res.noise_aware:.3f} "
            f"| {res.predicted:g} ({pts:.1f} pt) | {res.max_drop:.3f} | {res.mcnemar:.3f} "
            f"| {res.vllm:.3f} |"
        )
    return lines


def _honesty_section(
    results: Sequence[Result], reruns: int, alpha: float, weights: Weights, seed: int
) -> list[str]:
    """Per noise, split and K: the power at the drop the unchanged row's reruns predict."""
    lines = [
        "| noise | split | K | says it detects (80%) | simulated power there |",
        "|---|---|---|---|---|",
    ]
    for i, res in enumerate(r for r in results if r.row.drop == 0):
        if math.isnan(res.predicted):
            continue
        drop = min(math.ceil(res.predicted), res.row.stable_correct)
        row = Row(res.row.size, res.row.noise, res.row.repeats, drop, res.row.rate)
        power = run_row(row, reruns, alpha, weights, seed + i, 0, 0).noise_aware
        noise, split, k, _ = res.row.label.split(" | ")
        lines.append(
            f"| {noise} | {split} | {k} | {drop} ({100 * drop / row.size:.1f} pt) "
            f"| {power:.3f} +- {_se(power, reruns):.3f} |"
        )
    return lines


def _weights_section(reruns: int, seed: int, alpha: float) -> list[str]:
    """K = 5, full split, 10% noisy: the three weightings on the same reruns; the test alone
    (``p < level``) and the gate at ``alpha`` (the test and a mean drop above 0)."""
    levels = sorted({0.001, alpha})
    lines = [
        "| weights | candidate | "
        + " | ".join(f"test p < {a:g}" for a in levels)
        + f" | gate at {alpha:g} |",
        "|---|---|" + "---|" * (len(levels) + 1),
    ]
    for weights in ("count", "linear", "squared"):
        for drop in (0, round(N / 100)):
            res = run_row(Row(N, 0.10, 5, drop), reruns, alpha, weights, seed + drop, 0, 0)
            cells = [f"{float((res.p_values < a).mean()):.3f}" for a in levels]
            cells.append(f"{res.noise_aware:.3f}")
            cand = "unchanged" if drop == 0 else f"drop {drop} (1 pt)"
            lines.append(f"| {weights} | {cand} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reruns", type=int, default=1000)
    parser.add_argument("--quick", action="store_true", help="fewer rows, 100 reruns: a smoke")
    parser.add_argument("--alpha", type=float, default=0.01, help="the noise-aware gate's level")
    parser.add_argument(
        "--weights",
        choices=("squared", "linear", "count"),
        default="squared",
        help="the main table's scores (squared: the gate; the others for comparison)",
    )
    parser.add_argument(
        "--check",
        type=int,
        default=10,
        help="reruns per row replayed through the real NoiseAware (default 10)",
    )
    parser.add_argument(
        "--predict",
        type=int,
        default=20,
        help="reruns per row whose detectable_drop makes the median shown (default 20)",
    )
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args(argv)
    reruns = min(args.reruns, 100) if args.quick else args.reruns
    predict = min(args.predict, 3) if args.quick else args.predict
    weights: Weights = args.weights
    started = time.perf_counter()
    check_scores()
    results = []
    for i, row in enumerate(rows(args.quick)):
        results.append(
            run_row(row, reruns, args.alpha, weights, args.seed + i, args.check, predict)
        )
        print(f"  {row.label}: {time.perf_counter() - started:.0f} s", file=sys.stderr)
    # detectable_drop speaks for the squared scores (the gate's): the others have no figure
    honesty = (
        _honesty_section(results, reruns, args.alpha, weights, args.seed + 20_000)
        if weights == "squared"
        else ["(the gate's own scores only: run without --weights)"]
    )
    weight_lines = _weights_section(reruns, args.seed + 10_000, args.alpha)
    elapsed = time.perf_counter() - started
    print(
        f"{reruns} reruns per row; stable problems {100 * ACCURACY:g}% right; noisy ones right "
        f"with p = 0.5 in each run; baseline K runs per problem, candidate one; "
        f"FAIL share = false alarms (unchanged) or power (drop); {elapsed:.0f} s"
    )
    print()
    print(*_table(results, args.alpha, weights), sep="\n")
    print()
    print(
        "The drop the gate says it detects with 80% power (detectable_drop, the median over "
        "the unchanged row's reruns), simulated:"
    )
    print()
    print(*honesty, sep="\n")
    print()
    print(
        "Weights (10% noisy, full split, K=5, the same reruns for each): FAIL share of the "
        "noise-aware test alone and of the gate (the test and a mean drop above 0)"
    )
    print()
    print(*weight_lines, sep="\n")
    print()
    print("targets (full split, 10% noisy at p = 0.5):")
    missed = 0
    by_row = {res.row: res for res in results}
    bound = args.alpha + 2 * _se(args.alpha, reruns)
    for k in REPEATS:
        res = by_row.get(Row(N, 0.10, k, 0))
        if res is None:
            continue
        ok = res.noise_aware <= bound
        missed += not ok
        print(
            f"  unchanged, K={k}: false alarms {res.noise_aware:.4f} (target <= alpha + 2 SE "
            f"= {bound:.4f}): {'PASS' if ok else 'FAIL'}"
        )
    for points, least in ((1, 0.95), (2, 0.999)):
        res = by_row.get(Row(N, 0.10, 5, round(points * N / 100)))
        if res is None:
            continue
        ok = res.noise_aware >= least
        missed += not ok
        print(
            f"  {points}-point drop ({res.row.drop} problems), K=5: power {res.noise_aware:.4f} "
            f"+- {_se(res.noise_aware, reruns):.4f} (target >= {least:g}): "
            f"{'PASS' if ok else 'FAIL'}"
        )
    if args.check and weights == "squared":
        print(
            f"  every row's first {min(args.check, reruns)} reruns replayed through NoiseAware: "
            "identical verdicts, statistics and p-values"
        )
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
