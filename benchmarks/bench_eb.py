"""Research prototype (issue 32): an empirical-Bayes null for the noise-aware gate's flip part.

A script, not a test, and nothing in the package uses it. The question: with a baseline
recorded K times per problem and ONE candidate run, can a null for "problems right K of K
times that fail now" estimated from the baseline's count histogram catch a 1-point stable
break (13 of 1,319 reliable problems turn always wrong) more often than today's exact
conditional test, at the same false alarms?

The prototype ("EB"), for a candidate run once (``L = 1``):

* fit a prior ``g`` over the success rates to the baseline's histogram of counts (``K + 1``
  numbers) by its NPMLE: EM on a grid of ``GRID`` rates, dense near 0 and 1, from the uniform
  weights, ``FIT_STEPS`` steps;
* the statistic is ``F``, the number of problems right in all K baseline runs that fail now;
  under the null, given the histogram, ``F ~ Binomial(n_K, q)`` with ``q = E_g[(1 - θ) θ^K] /
  E_g[θ^K]`` (exact when the rates are drawn from ``g``; for fixed rates the law is less
  spread, so it errs on the safe side);
* ``g``'s estimation error: a parametric bootstrap of the histogram (``BOOT`` multinomial
  draws from the fitted cell probabilities, each refitted ``BOOT_STEPS`` EM steps from the
  fit), the basic bootstrap's ``q_b = 2 q̂ - q*_b``, and the p-value averaged over them,
  ``p_EB = mean_b P(Binomial(n_K, q_b) >= F)``;
* the gate: ``min(1, p_EB / FLIP_SHARE, p_drop / (1 - FLIP_SHARE))`` with today's exact rate
  statistic ``p_drop`` (bench_gate's twin), the split the gate uses. ``K = 1``: the histogram
  says nothing about ``E[θ^2]``, so EB falls back to today's test (McNemar).

Beside it: today's gate (bench_gate's twin; on the three tuned families the same reruns,
seeds and figures as bench_gate's table), the known-variance z-test, ``oracle-g``: the
same gate with the flip null known exactly (``F``'s law from the true rates, a
Poisson-binomial of ``θ^K (1 - θ)``), the best any test built on ``F`` can do at the split
(the broken problems look like every other K-of-K problem that fails), and ``ceiling``:
``F`` against that law at the whole alpha. ``EB null mean / true`` is the EB null's mean
``n_K q̂`` over the reruns divided by the true null mean of ``F``: its bias, which the data
cannot fix (the K baseline runs identify ``E[θ^j]`` for ``j <= K`` only; ``F`` needs
``E[θ^(K+1)]``, which EM extrapolates from its grid and starting point). In the unchanged
cells, the EB flip p-value's own false alarms at ``CALIBRATION`` (its share of alpha, and
two larger levels).

Results and the verdict (not adopted): benchmarks/eb_results.md.

Families: bench_gate's three (imported), and two the prototype was not tuned on: ``mix2``
(75% Beta(8, 0.4), 25% Beta(0.5, 2)) and ``point97`` (a tenth of problems right at exactly
0.97, 70% always right, 20% always wrong).

    nice -n 19 python benchmarks/bench_eb.py [--reruns 1000] [--alpha 0.01] [--seed 2026]
                                             [--family F] [--k K]
                                             [--cells all|null|power|stable]
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench_gate, which adds the repo

import bench_gate as bg  # the sibling script: families, generators, the twin

from pytest_gsm8k.core.calibrated import FLIP_SHARE

#: rates of the grid the prior lives on: (1 - cos(π x)) / 2, dense near 0 and 1
GRID = 61
FIT_STEPS = 2000
BOOT = 20
BOOT_STEPS = 200
N = bg.N
#: levels at which the EB flip p-value's own false alarms are counted (alpha / 4 is its share)
CALIBRATION = (0.0025, 0.01, 0.05)


def _mix2(rng: np.random.Generator) -> Any:
    high = round(0.75 * N)
    return np.concatenate([rng.beta(8, 0.4, high), rng.beta(0.5, 2, N - high)])


def _point97(rng: np.random.Generator) -> Any:
    odd, right = round(0.10 * N), round(0.70 * N)
    return np.concatenate([np.full(odd, 0.97), np.ones(right), np.zeros(N - odd - right)])


UNTUNED: dict[str, Callable[[np.random.Generator], Any]] = {"mix2": _mix2, "point97": _point97}
FAMILIES = {**bg.FAMILIES, **UNTUNED}
#: bench_gate's order of the cells in a (family, K, L) block: the unchanged one first
OFFSET = {("none", 0): 1, ("stable", 1): 2, ("stable", 2): 3, ("spread", 1): 4, ("spread", 2): 5}


@cache
def _design(k: int) -> tuple[Any, Any]:
    """``(A, θ)``: ``A[c, j] = P(c of k | θ_j)`` on the grid."""
    theta = (1.0 - np.cos(np.pi * np.linspace(0.0, 1.0, GRID))) / 2.0
    c = np.arange(k + 1)[:, None]
    comb = np.array([math.comb(k, int(x)) for x in range(k + 1)], dtype=float)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        a = comb * theta[None, :] ** c * (1.0 - theta[None, :]) ** (k - c)
    return np.nan_to_num(a, nan=1.0), theta


def fit(hist: Any, k: int, steps: int, start: Any = None) -> Any:
    """NPMLE weights (rows x GRID) of the prior for each row of count histograms ``hist``
    (rows x (k + 1)), by EM from ``start`` (uniform if None)."""
    a, _ = _design(k)
    n = hist.sum(axis=1, keepdims=True)
    w = np.full((len(hist), GRID), 1.0 / GRID) if start is None else start.copy()
    for _ in range(steps):
        pi = w @ a.T
        w = w * ((hist / np.maximum(pi, 1e-300)) @ a) / n
    return w


def failure_rate(w: Any, k: int) -> Any:
    """``q = E_g[(1 - θ) θ^k] / E_g[θ^k]``: the null chance that a problem right k of k fails
    a candidate run."""
    _, theta = _design(k)
    return (w @ (theta**k * (1.0 - theta))) / np.maximum(w @ theta**k, 1e-300)


@cache
def _log_factorial(n: int) -> Any:
    return np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])


def binomial_above(observed: Any, trials: Any, q: Any, window: int = 400) -> Any:
    """``P(Binomial(trials, q) >= observed)``, elementwise (broadcast arrays); the sum runs
    over ``window`` values from ``observed`` up (the null means here are below 100)."""
    lf = _log_factorial(N)
    obs, n, p = np.broadcast_arrays(observed, trials, q)
    x = obs[..., None] + np.arange(window)
    p = np.clip(p, 1e-15, 1.0 - 1e-15)[..., None]
    n_ = n[..., None]
    keep = x <= n_
    xs = np.where(keep, x, 0)
    nx = np.where(keep, n_ - x, 0)
    log = lf[np.where(keep, n_, 0)] - lf[xs] - lf[nx] + xs * np.log(p) + nx * np.log1p(-p)
    return np.minimum(np.where(keep, np.exp(log), 0.0).sum(axis=-1), 1.0)


def eb_flip(base: Any, now: Any, k: int, rng: np.random.Generator) -> tuple[Any, Any]:
    """``(p_EB, F̂)`` per rerun (L = 1): the bootstrap-averaged p-value of ``F`` and the
    fitted null mean ``n_K q̂``."""
    rows = len(base)
    hist = np.stack([(base == c).sum(axis=1) for c in range(k + 1)], axis=1).astype(float)
    w = fit(hist, k, FIT_STEPS)
    q_hat = failure_rate(w, k)
    a, _ = _design(k)
    pi = w @ a.T
    pi = pi / pi.sum(axis=1, keepdims=True)
    boot = rng.multinomial(N, pi[:, None, :], size=(rows, BOOT)).reshape(rows * BOOT, k + 1)
    w_boot = fit(boot.astype(float), k, BOOT_STEPS, np.repeat(w, BOOT, axis=0))
    q_star = failure_rate(w_boot, k).reshape(rows, BOOT)
    q_b = np.clip(2.0 * q_hat[:, None] - q_star, 1e-12, 1.0)
    n_k = hist[:, k].astype(int)
    f = ((base == k) & (now == 0)).sum(axis=1)
    p = binomial_above(f[:, None], n_k[:, None], q_b).mean(axis=1)
    return p, n_k * q_hat


@cache
def oracle_law(family: str, k: int, seed: int) -> Any:
    """``P(F >= f)`` for ``f = 0..N`` under the null with the true rates (Poisson-binomial)."""
    rates = FAMILIES[family](np.random.default_rng(seed))
    probs = rates**k * (1.0 - rates)
    law = np.array([1.0])
    for p in probs[probs > 1e-15]:
        law = np.convolve(law, [1.0 - p, p])
    law = np.concatenate([law, np.zeros(N + 2 - len(law))])
    return np.cumsum(law[::-1])[::-1]


@dataclass
class Cell:
    family: str
    k: int
    shape: str
    points: int
    today: float
    eb: float
    oracle: float
    ceiling: float  # F against its true null law at the whole alpha, no rate statistic
    ztest: float
    bias: float  # mean EB null mean / true null mean of F (unchanged cells)
    calibration: tuple[float, ...]  # share of p_EB below CALIBRATION (the flip part alone)


def run_cell(family: str, k: int, shape: str, points: int, args: Any, seed: int) -> Cell:
    rates = FAMILIES[family](np.random.default_rng(args.seed))
    after = bg.regress(rates, shape, points * N / 100) if points else rates
    rng = np.random.default_rng(seed)
    boot_rng = np.random.default_rng(seed + 7_777_777)
    z = NormalDist().inv_cdf(1.0 - args.alpha)
    sd = math.sqrt(float((rates * (1 - rates)).sum()) * (1.0 + 1.0 / k))
    above = oracle_law(family, k, args.seed)
    true_mean = float((rates**k * (1.0 - rates)).sum())
    today = eb = oracle = ceiling = ztest = 0
    fitted: list[Any] = []
    below = np.zeros(len(CALIBRATION))
    for start in range(0, args.reruns, bg.CHUNK):
        size = min(bg.CHUNK, args.reruns - start)
        base = rng.binomial(k, rates, (size, N))
        now = rng.binomial(1, after, (size, N))
        flip, drop, _ = bg.twin(base, now, k, 1)
        delta = base.sum(axis=1) / k - now.sum(axis=1)
        down = delta > 0
        today += int(((bg.combined(flip, drop, k, 1) < args.alpha) & down).sum())
        ztest += int((delta > z * sd).sum())
        f = ((base == k) & (now == 0)).sum(axis=1)
        p_or = above[np.minimum(f, N + 1)]
        split = np.minimum(p_or / FLIP_SHARE, drop / (1.0 - FLIP_SHARE))
        oracle += int(((split < args.alpha) & down).sum())
        ceiling += int(((p_or < args.alpha) & down).sum())
        if k == 1:
            eb += int(((bg.combined(flip, drop, k, 1) < args.alpha) & down).sum())
            continue
        p_eb, mean = eb_flip(base, now, k, boot_rng)
        fitted.append(mean)
        below += [(p_eb < level).sum() for level in CALIBRATION]
        split = np.minimum(p_eb / FLIP_SHARE, drop / (1.0 - FLIP_SHARE))
        eb += int(((split < args.alpha) & down).sum())
    bias = float(np.concatenate(fitted).mean()) / true_mean if fitted and true_mean else math.nan
    r = args.reruns
    return Cell(
        family,
        k,
        shape,
        points,
        today / r,
        eb / r,
        oracle / r,
        ceiling / r,
        ztest / r,
        bias,
        tuple(float(b) / r for b in below),
    )


def seed_of(family: str, k: int, shape: str, points: int, args: Any) -> int:
    """bench_gate's seed for its cells (the same reruns); the untuned families after them."""
    if family in bg.FAMILIES and k in bg.REPEATS:
        return int(args.seed) + bg._CELLS * bg._block(family, k, 1) + OFFSET[(shape, points)]
    index = list(FAMILIES).index(family) * 100 + k * 10 + OFFSET[(shape, points)]
    return int(args.seed) + 1_000_000 + index


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--reruns", type=int, default=1000)
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--family", action="append", choices=list(FAMILIES))
    parser.add_argument("--k", type=int, action="append", help="baseline K (default 1 3 5 10)")
    parser.add_argument(
        "--cells",
        choices=("all", "null", "power", "stable"),
        default="all",
        help="the unchanged cells, the stable 1 pt / spread 1 and 2 pt cells, both, or the "
        "stable 1 pt cells alone",
    )
    args = parser.parse_args(argv)
    started = time.perf_counter()
    shapes = [("none", 0)] if args.cells in ("all", "null") else []
    if args.cells in ("all", "power"):
        shapes += [("stable", 1), ("spread", 1), ("spread", 2)]
    if args.cells == "stable":
        shapes = [("stable", 1)]
    cells: list[Cell] = []
    for family in args.family or FAMILIES:
        for k in args.k or bg.REPEATS:
            for shape, points in shapes:
                if shape != "none" and (k == 1 or family in UNTUNED):
                    continue  # K = 1 is today's test; power is measured on the tuned three
                seed = seed_of(family, k, shape, points, args)
                cell = run_cell(family, k, shape, points, args, seed)
                cells.append(cell)
                print(
                    f"  {family} K={k} {shape} {points}: today {cell.today:.3f} EB {cell.eb:.3f}"
                    f" oracle-g {cell.oracle:.3f} ceiling {cell.ceiling:.3f} z {cell.ztest:.3f}"
                    f" bias {cell.bias:.2f} calibration {cell.calibration}"
                    f" ({time.perf_counter() - started:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    print(
        f"{args.reruns} reruns per cell, n={N}, alpha {args.alpha:g}, L=1, seed {args.seed}; "
        f"FAIL share: today | EB | oracle-g (| z-test); {time.perf_counter() - started:.0f} s"
    )
    print()
    print(
        "| family | K | shape | today | EB | oracle-g | ceiling (F alone at alpha) | z-test "
        "| EB null mean / true | EB flip p below 0.0025 / 0.01 / 0.05 |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        what = "unchanged" if c.shape == "none" else f"{c.shape} {c.points} pt"
        print(
            f"| {c.family} | {c.k} | {what} | {c.today:.3f} | {c.eb:.3f} | {c.oracle:.3f} "
            f"| {c.ceiling:.3f} "
            f"| {c.ztest:.3f} | {c.bias:.2f} | {' / '.join(f'{b:.4f}' for b in c.calibration)} |"
        )
    nulls = [c for c in cells if c.shape == "none"]
    if not nulls:
        return 0
    print()
    rows: list[tuple[str, float, list[tuple[float, Cell]]]] = [
        ("the gate", args.alpha, [(c.eb, c) for c in nulls])
    ]
    for i, level in enumerate(CALIBRATION):
        rows.append(("EB flip p", level, [(c.calibration[i], c) for c in nulls if c.k > 1]))
    for name, level, shares in rows:
        if not shares:
            continue
        bound = level + 2 * math.sqrt(level * (1 - level) / args.reruns)
        share, worst = max(shares, key=lambda x: x[0])
        verdict = "PASS" if share <= bound else "FAIL"
        print(
            f"  false alarms, {name} at {level:g}: at most {share:.4f} ({worst.family} "
            f"K={worst.k}; level + 2 SE = {bound:.4f}): {verdict}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
