"""Simulation of the noise-aware baseline gate under serving noise: false alarms, power, claims.

A script, not a test. Three families of per-problem success rates (serving noise as it is,
not as the gate was built around), three shapes of regression, baselines recorded K = 1, 3,
5 and 10 times per problem, candidates run once or 5 times, 1,000 reruns per cell:

* families: ``half-0.5`` (10% of problems right at 0.5, the rest stable, 75% of them
  right); ``uniform`` (two thirds always right, an eighth always wrong, a fifth at rates
  uniform over (0.05, 0.95)); ``beta`` (65% Beta(30, 0.3), 15% Beta(0.3, 30), 20%
  Beta(1, 1): hardly any problem exactly stable, many right K of K without being certain);
* shapes, each a drop of 1 and 2 points of the split: ``stable`` (the most reliable
  problems turn always wrong), ``spread`` (every noisy problem's rate, 0.01 < r < 0.99,
  lowered by the same amount), ``both`` (half each).

Per cell it prints the gate's FAIL share (``NoiseAware(alpha)``: false alarms for an
unchanged model, power for a drop) beside the known-variance z-test's (``Σ (c/K - d/L) >
z sqrt(Σ r (1 - r) (1/K + 1/L))`` with the true rates: the benchmark the issue names), and per
family, K and L the drop the gate says it detects with 80% power (:func:`reach`, median over
the unchanged cell's reruns) beside the power simulated at 0.8, 1 and 1.2 times it
(``spread``, the least favourable shape) and the 80%-power drop interpolated from them.

    python benchmarks/bench_gate.py [--reruns 1000] [--alpha 0.01] [--check 3] [--quick]
                                    [--family F] [--k K] [--l L]

``--family``, ``--k`` and ``--l`` (repeatable) run a subset, drawing the full table's reruns.

It ends with the targets, each PASS or FAIL, and exits 1 on a miss.

The twin. The real test (core/calibrated.py) is an exact convolution in pure Python, 5-250
ms per rerun; 240,000 reruns need a vectorised twin. With every problem run K and L times the
test depends only on, per total ``t`` of successes over the ``K + L`` runs, how many
problems ``m_t`` have it, their summed flip scores and their summed candidate successes. The
null law of each statistic is then ``Π_t law_t^{m_t}`` (a convolution power per stratum),
computed for a chunk of reruns at once through the discrete Fourier transform: ``exp(m @ log
rfft(law_t))`` then one inverse transform per rerun. The per-stratum laws are built from the
package's own ``Pair.score`` and ``hypergeometric_pmf``; ``--check N`` replays the first N
reruns of every cell through the real :func:`evidence` and :func:`reach` and stops with an
error on any difference above 1e-9 (the Fourier transform's rounding).

Speed: 1,103 s for the whole table (240 cells of 1,000 reruns) on 2 shared cores under load
(load average 6-15; 2,423 s at another time); `--quick` (100 reruns, K 1 and 5) under 2
minutes.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from statistics import NormalDist
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytest_gsm8k.core.calibrated import FLIP_SHARE, Pair, evidence, reach
from pytest_gsm8k.core.stats import hypergeometric_pmf

N = 1319
REPEATS = (1, 3, 5, 10)
CANDIDATE = (1, 5)
POINTS = (1, 2)
SHAPES = ("stable", "spread", "both")
#: the rates counted as noisy by the spread shape
NOISY = (0.01, 0.99)
CHUNK = 50


def _half(rng: np.random.Generator) -> Any:
    noisy = round(0.10 * N)
    right = round(0.75 * (N - noisy))
    return np.concatenate([np.ones(right), np.zeros(N - noisy - right), np.full(noisy, 0.5)])


def _uniform(rng: np.random.Generator) -> Any:
    noisy, wrong = round(N / 5), round(N / 8)
    right = N - noisy - wrong
    return np.concatenate([np.ones(right), np.zeros(wrong), rng.uniform(0.05, 0.95, noisy)])


def _beta(rng: np.random.Generator) -> Any:
    high, low = round(0.65 * N), round(0.15 * N)
    return np.concatenate(
        [rng.beta(30, 0.3, high), rng.beta(0.3, 30, low), rng.beta(1, 1, N - high - low)]
    )


FAMILIES: dict[str, Callable[[np.random.Generator], Any]] = {
    "half-0.5": _half,
    "uniform": _uniform,
    "beta": _beta,
}


def regress(rates: Any, shape: str, problems: float) -> Any:
    """The candidate's rates: ``problems`` (in problems of the split) taken off in ``shape``."""
    out = rates.copy()
    stable = problems if shape == "stable" else problems / 2 if shape == "both" else 0.0
    if stable:
        top = np.argsort(-rates, kind="stable")[: round(stable)]
        out[top] = 0.0
    spread = problems - stable
    if spread:
        noisy = (out > NOISY[0]) & (out < NOISY[1])
        if out[noisy].sum() < spread:
            raise ValueError(f"cannot spread {spread:.1f} problems over the noisy ones")
        low, high = 0.0, 1.0  # bisection on the common shift
        for _ in range(60):
            mid = (low + high) / 2
            if (out[noisy] - np.maximum(out[noisy] - mid, 0.0)).sum() < spread:
                low = mid
            else:
                high = mid
        out[noisy] = np.maximum(out[noisy] - high, 0.0)
    return out


@cache
def tables(k: int, ell: int) -> tuple[Any, Any]:
    """Per total ``t``: the flip score of each candidate count ``d`` (``Pair.score``, the
    package's own) and the null pmf of ``d`` (``hypergeometric_pmf``)."""
    scores = np.zeros((k + ell + 1, ell + 1), dtype=np.int64)
    pmf = np.zeros((k + ell + 1, ell + 1))
    for t in range(k + ell + 1):
        pmf[t] = hypergeometric_pmf(t, k, ell)
        for d in range(ell + 1):
            if 0 <= t - d <= k:
                scores[t, d] = Pair("x", t - d, k, d, ell).score
    return scores, pmf


def _power_laws(counts: Any, laws: Sequence[tuple[Any, Any]], size: int) -> Any:
    """Per rerun, the law of ``Σ_t`` of ``counts[:, t]`` iid draws from ``laws[t]`` (values,
    probabilities), on ``0..size-1``: ``exp(counts @ log rfft(law_t))``, inverted."""
    logs = np.zeros((len(laws), size // 2 + 1), dtype=complex)
    for t, (values, probs) in enumerate(laws):
        law = np.zeros(size)
        np.add.at(law, values, probs)
        spectrum = np.fft.rfft(law)
        logs[t] = np.log(np.maximum(np.abs(spectrum), 1e-300)) + 1j * np.angle(spectrum)
    return np.maximum(np.fft.irfft(np.exp(counts @ logs), size, axis=1), 0.0)


def twin(base: Any, now: Any, k: int, ell: int) -> tuple[Any, Any, Any]:
    """``(flip, drop, rise)`` p-values of reruns ``base`` (reruns x problems, correct of
    ``k``) and ``now`` (correct of ``ell``)."""
    scores, pmf = tables(k, ell)
    total = base + now
    informative = (total > 0) & (total < k + ell)
    strata = range(1, k + ell)
    counts = np.stack([(total == t).sum(axis=1) for t in strata], axis=1).astype(float)
    flip_obs = np.where(informative, scores[total, now], 0).sum(axis=1)
    succ_obs = np.where(informative, now, 0).sum(axis=1)
    d = np.arange(ell + 1)
    rate_laws = [(d, pmf[t]) for t in strata]
    size = 1 << int(ell * counts.sum(axis=1).max() + 2).bit_length()
    law = _power_laws(counts, rate_laws, size)
    below = np.cumsum(law, axis=1)
    rows = np.arange(len(base))
    drop = np.minimum(below[rows, succ_obs], 1.0)
    rise = np.minimum(1.0 - np.where(succ_obs > 0, below[rows, succ_obs - 1], 0.0), 1.0)
    if k == 1 and ell == 1:
        return drop, drop, rise
    flip_laws = [(scores[t], pmf[t]) for t in strata]
    mean = np.array([(s * p).sum() for s, p in flip_laws])
    var = np.array([(s * s * p).sum() for s, p in flip_laws]) - mean**2
    reach_ = counts @ mean + 14 * np.sqrt(counts @ var) + 20 * scores.max()
    size = 1 << int(reach_.max()).bit_length()
    law = _power_laws(counts, flip_laws, size)
    above = np.cumsum(law[:, ::-1], axis=1)[:, ::-1]
    clipped = np.minimum(flip_obs, size - 1)
    flip = np.where(flip_obs < size, np.minimum(above[rows, clipped], 1.0), 0.0)
    return flip, drop, rise


def combined(flip: Any, drop: Any, k: int, ell: int) -> Any:
    if k == 1 and ell == 1:
        return drop
    return np.minimum(1.0, np.minimum(flip / FLIP_SHARE, drop / (1.0 - FLIP_SHARE)))


def claims(base: Any, now: Any, k: int, ell: int, alpha: float) -> Any:
    """:func:`reach` in problems, per rerun (the normal part and the floor, as there)."""
    level = alpha if k == ell == 1 else (1.0 - FLIP_SHARE) * alpha
    z = NormalDist().inv_cdf(1.0 - level) + NormalDist().inv_cdf(0.8)
    runs = k + ell
    total = base + now
    v = total * (runs - total) / (runs * (runs - 1))
    normal = z * np.sqrt(v.sum(axis=1) * (1.0 / k + 1.0 / ell))
    alone = math.ceil(math.log(1.0 / level) / math.log(math.comb(runs, ell)))
    return np.maximum(normal, alone)


@dataclass
class Cell:
    family: str
    k: int
    ell: int
    shape: str
    problems: float
    gate: float
    ztest: float
    claim: float  # median reach() over the reruns, in problems


class TwinMismatch(AssertionError):
    """The numpy twin and the real test disagree: the figures would be about another test."""


def run_cell(
    family: str, rates: Any, k: int, ell: int, shape: str, problems: float, args: Any, seed: int
) -> Cell:
    rng = np.random.default_rng(seed)
    after = regress(rates, shape, problems) if problems else rates
    z = NormalDist().inv_cdf(1.0 - args.alpha)
    sd = math.sqrt(float((rates * (1 - rates)).sum()) * (1.0 / k + 1.0 / ell))
    fails = ztests = 0
    claimed: list[Any] = []
    for start in range(0, args.reruns, CHUNK):
        size = min(CHUNK, args.reruns - start)
        base = rng.binomial(k, rates, (size, N))
        now = rng.binomial(ell, after, (size, N))
        flip, drop, rise = twin(base, now, k, ell)
        p = combined(flip, drop, k, ell)
        delta = base.sum(axis=1) / k - now.sum(axis=1) / ell
        fails += int(((p < args.alpha) & (delta > 0)).sum())
        ztests += int((delta > z * sd).sum())
        claimed.append(claims(base, now, k, ell, args.alpha))
        if start == 0:
            for r in range(min(args.check, size)):
                _check(base[r], now[r], k, ell, (flip[r], drop[r], rise[r]), args.alpha)
    return Cell(
        family,
        k,
        ell,
        shape,
        problems,
        fails / args.reruns,
        ztests / args.reruns,
        float(np.median(np.concatenate(claimed))),
    )


def _check(base: Any, now: Any, k: int, ell: int, twin_p: Sequence[float], alpha: float) -> None:
    pairs = [
        Pair(str(i), int(c), k, int(d), ell) for i, (c, d) in enumerate(zip(base, now, strict=True))
    ]
    real = evidence(pairs)
    reals = (real.flip, real.drop, real.rise)
    for name, mine, theirs in zip(("flip", "drop", "rise"), twin_p, reals, strict=True):
        if abs(mine - theirs) > 1e-9 and not (mine < 1e-12 and theirs < 1e-12):
            raise TwinMismatch(f"K={k}, L={ell}: {name} p {mine!r} (twin) != {theirs!r} (real)")
    mine_claim = float(claims(base[None], now[None], k, ell, alpha)[0])
    real_claim = reach(pairs, alpha).problems
    if abs(mine_claim - real_claim) > 1e-9:
        raise TwinMismatch(f"K={k}, L={ell}: reach {mine_claim!r} (twin) != {real_claim!r}")


def _se(rate: float, reruns: int) -> float:
    return math.sqrt(rate * (1.0 - rate) / reruns)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reruns", type=int, default=1000)
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--check", type=int, default=3, help="reruns per cell replayed for real")
    parser.add_argument("--quick", action="store_true", help="100 reruns, K 1 and 5: a smoke")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument(
        "--family", action="append", choices=list(FAMILIES), help="only these (repeatable)"
    )
    parser.add_argument("--k", type=int, action="append", help="only these baseline K")
    parser.add_argument("--l", type=int, action="append", help="only these candidate L")
    args = parser.parse_args(argv)
    if args.quick:
        args.reruns = min(args.reruns, 100)
    repeats = args.k or ((1, 5) if args.quick else REPEATS)
    candidate = args.l or CANDIDATE
    started = time.perf_counter()
    cells: list[Cell] = []
    honesty: list[tuple[Cell, list[float]]] = []
    seed = args.seed
    for family, make in FAMILIES.items():
        if family not in (args.family or FAMILIES):
            continue
        rates = make(np.random.default_rng(args.seed))
        for k, ell in itertools.product(repeats, candidate):
            seed = args.seed + _CELLS * _block(family, k, ell)
            null = run_cell(family, rates, k, ell, "none", 0.0, args, seed := seed + 1)
            cells.append(null)
            for shape in SHAPES:
                for points in POINTS:
                    cells.append(
                        run_cell(
                            family,
                            rates,
                            k,
                            ell,
                            shape,
                            points * N / 100,
                            args,
                            seed := seed + 1,
                        )
                    )
            powers = [
                run_cell(
                    family, rates, k, ell, "spread", f * null.claim, args, seed := seed + 1
                ).gate
                for f in (0.8, 1.0, 1.2)
            ]
            honesty.append((null, powers))
            print(
                f"  {family} K={k} L={ell}: {time.perf_counter() - started:.0f} s",
                file=sys.stderr,
            )
    print(
        f"{args.reruns} reruns per cell, n={N}, alpha {args.alpha:g}; FAIL share of the gate "
        f"(false alarms when unchanged, power otherwise) | the known-variance z-test's; "
        f"{time.perf_counter() - started:.0f} s"
    )
    print()
    print(*table(cells), sep="\n")
    print()
    print(*honesty_table(honesty), sep="\n")
    print()
    return targets(cells, honesty, args)


#: reruns seeded per (family, K, L) block: the unchanged cell, 3 shapes x 2 sizes, 3 claims
_CELLS = 1 + len(SHAPES) * len(POINTS) + 3


def _block(family: str, k: int, ell: int) -> int:
    """The block's place in a full run, so that a subset (``--family``, ``--k``, ``--l``)
    draws the same reruns as the full table's rows (a K or L outside it comes after)."""
    ks = list(REPEATS) + ([k] if k not in REPEATS else [])
    ls = list(CANDIDATE) + ([ell] if ell not in CANDIDATE else [])
    return (list(FAMILIES).index(family) * len(ks) + ks.index(k)) * len(ls) + ls.index(ell)


def table(cells: Sequence[Cell]) -> list[str]:
    head = ["family", "K", "L", "unchanged"] + [f"{s} {p} pt" for s in SHAPES for p in POINTS]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by = {(c.family, c.k, c.ell, c.shape, round(c.problems)): c for c in cells}
    for family in FAMILIES:
        for k in sorted({c.k for c in cells}):  # a --k or --l outside the defaults too
            for ell in sorted({c.ell for c in cells}):
                null = by.get((family, k, ell, "none", 0))
                if null is None:
                    continue
                row = [family, str(k), str(ell), f"{null.gate:.3f}"]
                for shape in SHAPES:
                    for points in POINTS:
                        c = by[(family, k, ell, shape, round(points * N / 100))]
                        row.append(f"{c.gate:.2f} \\| {c.ztest:.2f}")
                lines.append("| " + " | ".join(row) + " |")
    return lines


def interpolate(claim: float, powers: Sequence[float]) -> str:
    xs = [0.8 * claim, claim, 1.2 * claim]
    points = list(zip(xs, powers, strict=True))
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if y0 <= 0.8 <= y1 and y1 > y0:
            return f"{100 * (x0 + (0.8 - y0) * (x1 - x0) / (y1 - y0)) / N:.2f}"
    return "< 0.8x" if powers[0] > 0.8 else "> 1.2x"


def honesty_table(honesty: Sequence[tuple[Cell, list[float]]]) -> list[str]:
    lines = [
        "| family | K | L | says it detects (80%) | power at 0.8x, 1x, 1.2x | simulated 80% drop |",
        "|---|---|---|---|---|---|",
    ]
    for null, powers in honesty:
        lines.append(
            f"| {null.family} | {null.k} | {null.ell} | {100 * null.claim / N:.2f} pt "
            f"| {' / '.join(f'{p:.2f}' for p in powers)} | {interpolate(null.claim, powers)} pt |"
        )
    return lines


def targets(cells: Sequence[Cell], honesty: Sequence[tuple[Cell, list[float]]], args: Any) -> int:
    missed = 0
    bound = args.alpha + 2 * _se(args.alpha, args.reruns)
    worst = max((c for c in cells if c.shape == "none"), key=lambda c: c.gate)
    ok = worst.gate <= bound
    missed += not ok
    print(
        f"  false alarms: at most {worst.gate:.4f} ({worst.family} K={worst.k} L={worst.ell}; "
        f"target <= alpha + 2 SE = {bound:.4f}): {'PASS' if ok else 'FAIL'}"
    )
    spread = [c for c in cells if c.shape == "spread"]
    gap = max(spread, key=lambda c: c.ztest - c.gate)
    ok = gap.ztest - gap.gate <= 0.10
    missed += not ok
    print(
        f"  spread shifts: power at most {100 * (gap.ztest - gap.gate):.1f} points below the "
        f"z-test's ({gap.family} K={gap.k} L={gap.ell} {round(100 * gap.problems / N)} pt: "
        f"{gap.gate:.3f} vs {gap.ztest:.3f}; target <= 10): {'PASS' if ok else 'FAIL'}"
    )
    stable = [c for c in cells if c.shape == "stable" and c.k == 5 and round(c.problems) == 13]
    for c in stable:
        ok = c.gate >= 0.95
        missed += not ok
        print(
            f"  1-point stable break, {c.family} K=5 L={c.ell}: caught {c.gate:.3f} "
            f"(target >= 0.95): {'PASS' if ok else 'FAIL'}"
        )
    for null, powers in honesty:
        ok = powers[0] <= 0.8 <= powers[2]
        missed += not ok
        if not ok:
            print(
                f"  claim, {null.family} K={null.k} L={null.ell}: 80% power not within "
                f"+-20% of {100 * null.claim / N:.2f} pt (power {powers}): FAIL"
            )
    within = sum(p[0] <= 0.8 <= p[2] for _, p in honesty)
    print(f"  claims within +-20% of the simulated 80%-power drop: {within} of {len(honesty)}")
    if args.check:
        print(
            f"  the first {args.check} reruns of every cell replayed through evidence() and "
            "reach(): identical"
        )
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
