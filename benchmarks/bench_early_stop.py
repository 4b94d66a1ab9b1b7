"""Simulation benchmark of early stopping: how early, and how often wrong.

A script, not a test. For outcome vectors of N=1319 problems with a given full-split
accuracy, it runs early stopping over many uniformly random orders (the seeded run order's
distribution) in both modes and prints Markdown tables: the full run's verdict, the rate at
which the early verdict disagrees with it (the worst case over the grid beside alpha, with
its standard error), and the median and 90th percentile of the number of problems run
before a verdict (N when the run never stops early).

    python benchmarks/bench_early_stop.py [--orders 10000] [--check 100] [--quick] [--jobs 2]

Speed: the real ``pytest_gsm8k.core.early_stop.EarlyStop`` costs milliseconds per order
near a threshold, so 10,000 orders on the whole grid would take hours. The simulation
therefore runs a numpy twin of its test (``_VecTest``: the same IEEE operations in the same
order, one array lane per order) and replays the first ``--check`` orders of every row and
mode through the real class, failing loudly unless stop and verdict agree exactly. Orders
come from ``numpy.random.default_rng(seed).permuted`` (the protocol's SHA-256 order is one
such uniformly random permutation). numpy is installed with ``datasets``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytest_gsm8k.core import early_stop as es_mod
from pytest_gsm8k.core.early_stop import EarlyStop
from pytest_gsm8k.core.gates import MinAcc, min_acc_count

N = 1319
#: (accuracy, min_acc, mode, most problems as the median over orders): the targets
_TARGETS = (
    (0.0, 0.85, "certain", 198),
    (0.0, 0.85, "sequential", 20),
    (0.56, 0.85, "sequential", 60),
    (0.95, 0.85, "sequential", 150),
    (0.56, 0.45, "sequential", 250),
)
#: orders simulated at once (memory: about 30 bytes per order and problem)
_CHUNK = 20000
IDS = [str(i) for i in range(N)]


class _VecTest:
    """``early_stop._WorTest`` (binary, scale 1) over many orders at once: the same float
    operations, in the same order, on numpy arrays (one lane per order), so every lane's
    capital is bit-for-bit the scalar test's. ``--check`` replays orders through the real
    class to prove it."""

    def __init__(self, lanes: int, size: int, null: int, up: bool, alpha: float) -> None:
        self.size, self.null, self.up = size, null, up
        self.threshold = 1.0 / alpha
        total = sum(w for _, w in es_mod._BINARY_MIX)
        self.mix = [d for d, _ in es_mod._BINARY_MIX]
        self.caps = [np.full(lanes, w / total) for _, w in es_mod._BINARY_MIX]
        self.t = 0
        self.seen = np.zeros(lanes, dtype=np.int64)
        self.rejected = np.zeros(lanes, dtype=bool)

    def update(self, value: Any) -> Any:
        num = self.null - self.seen
        den = self.size - self.t
        active = ~self.rejected & (num > 0) & (num < den)
        if active.any():
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                mu = num / den
                y = value / 1  # as _WorTest: value / scale, at scale 1
                var = mu * (1.0 - mu)
                if self.up:
                    dev = y - mu
                    limit = es_mod._MAX_FRACTION / mu
                else:
                    dev = mu - y
                    limit = es_mod._MAX_FRACTION / (1.0 - mu)
                capital = np.zeros_like(mu)
                for j, delta in enumerate(self.mix):
                    lam = np.minimum(delta / var, limit)
                    self.caps[j] = np.where(active, self.caps[j] * (1.0 + lam * dev), self.caps[j])
                    capital = capital + self.caps[j]
            self.rejected |= active & (capital >= self.threshold)
        self.t += 1
        self.seen += value
        return self.rejected


def _simulate(mode: str, spec: dict[str, Any], perms: Any, alpha: float) -> tuple[Any, Any]:
    """Stop times and FAIL flags of every order (one lane each), vectorised over the orders."""
    x = np.array([int(spec["outcomes"][pid]) for pid in IDS], dtype=np.int64)
    need = min_acc_count(spec["min_acc"], N)
    xs = np.ascontiguousarray(x[perms].T)  # (N, orders)
    lanes = perms.shape[0]
    seen = np.arange(1, N + 1)[:, None]
    if mode == "certain":
        correct = np.cumsum(xs, axis=0)
        fail = correct + N - seen < need
        decided = (correct >= need) | fail
        first = decided.argmax(axis=0)
        return first + 1, fail[first, np.arange(lanes)]
    fail_test = _VecTest(lanes, N, need, False, alpha)
    pass_test = _VecTest(lanes, N, need - 1, True, alpha)
    stop = np.full(lanes, -1)
    is_fail = np.zeros(lanes, dtype=bool)
    correct = np.zeros(lanes, dtype=np.int64)
    for t in range(N):
        correct += xs[t]
        cert_pass = correct >= need
        cert_fail = correct + N - (t + 1) < need
        failed = fail_test.update(xs[t])
        passed = pass_test.update(xs[t])
        fail_now = cert_fail | (~cert_pass & failed)
        new = (stop < 0) & (cert_pass | fail_now | passed)
        stop[new] = t + 1
        is_fail[new] = fail_now[new]
        if (stop >= 0).all():
            break
    return stop, is_fail


def _replay(mode: str, spec: dict[str, Any], perm: Any, alpha: float) -> tuple[int, bool]:
    """One order through the real ``EarlyStop``: (problems to the decision, FAIL?). Its own
    seeded order's t-th problem is given the outcome of ``perm``'s t-th (min-acc only counts)."""
    es = EarlyStop(IDS, [MinAcc(spec["min_acc"])], mode=mode, alpha=alpha)  # type: ignore[arg-type]
    decision = es.decision
    for pid, i in zip(es.order, perm, strict=True):
        if decision is not None:
            break
        decision = es.observe(pid, "correct" if spec["outcomes"][IDS[i]] else "wrong")
    if decision is None:  # cannot happen: the last outcome makes every verdict certain
        raise AssertionError("undecided after the full run")
    return decision.after, "FAIL" in decision.verdicts.values()


def _case(job: tuple[str, dict[str, Any], int, int, float, int]) -> dict[str, Any]:
    """Run one population over ``orders`` random orders in one mode; replay ``check`` of
    them through the real class and insist on the very same stop and verdict."""
    mode, spec, orders, seed, alpha, check = job
    stop_parts, fail_parts = [], []
    for chunk, start in enumerate(range(0, orders, _CHUNK)):
        lanes = min(_CHUNK, orders - start)
        perms = np.random.default_rng([seed, chunk]).permuted(
            np.tile(np.arange(N, dtype=np.int16), (lanes, 1)), axis=1
        )
        stops, fails = _simulate(mode, spec, perms, alpha)
        for k in range(min(check - start, lanes)):
            real = _replay(mode, spec, perms[k], alpha)
            if real != (int(stops[k]), bool(fails[k])):
                raise AssertionError(
                    f"{spec['label']} {mode}, order {start + k}: vectorised "
                    f"{stops[k]}/{fails[k]} != EarlyStop {real}"
                )
        stop_parts.append(stops)
        fail_parts.append(fails)
    stops, fails = np.concatenate(stop_parts), np.concatenate(fail_parts)
    full_fail = spec["full"] == "FAIL"
    wrong = int((fails != full_fail).sum())
    return {
        "mode": mode,
        "label": spec["label"],
        "full": spec["full"],
        "wrong": wrong / orders,
        "median": float(np.median(stops)),
        "p90": int(np.sort(stops)[min(orders - 1, math.ceil(0.9 * orders) - 1)]),
        "key": spec["key"],
    }


def min_acc_specs(quick: bool) -> list[dict[str, Any]]:
    specs = []
    for threshold in (0.85, 0.45):
        need = min_acc_count(threshold, N)
        counts = {round(k * 0.05 * N) for k in range(21)} | {round(0.56 * N)}
        if quick:
            counts = {round(a * N) for a in (0.0, 0.3, 0.56, 0.8, 0.95, 1.0)}
        # at and within one point (13 problems) of the threshold
        counts |= {need - 13, need - 7, need - 1, need, need + 1, need + 7, need + 13}
        for correct in sorted(counts):
            outcomes = {pid: i < correct for i, pid in enumerate(IDS)}
            specs.append(
                {
                    "label": f"{correct / N:.4f} ({correct}) | {threshold:g}",
                    "key": (0, threshold, correct),
                    "outcomes": outcomes,
                    "min_acc": threshold,
                    "full": "PASS" if correct >= need else "FAIL",
                }
            )
    return specs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=10000)
    parser.add_argument("--quick", action="store_true", help="fewer accuracies, 500 orders")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=0.05)
    parser.add_argument(
        "--check",
        type=int,
        default=100,
        help="orders per row and mode replayed through the real EarlyStop (default 100)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TEXT",
        help="only the rows whose label contains TEXT (repeatable), e.g. '(1121) | 0.85'",
    )
    args = parser.parse_args()
    orders = min(args.orders, 500) if args.quick else args.orders
    specs = min_acc_specs(args.quick)
    if args.only:
        specs = [s for s in specs if any(text in s["label"] for text in args.only)]
    jobs = [
        (mode, spec, orders, 1000 + i, args.alpha, args.check)
        for i, spec in enumerate(specs)
        for mode in ("certain", "sequential")
    ]
    # the long ones (near a threshold) first, so the pool ends together
    jobs.sort(key=lambda j: (j[0] == "certain", j[1]["key"]))
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(_case, jobs, chunksize=1))
    elapsed = time.perf_counter() - started
    by_key: dict[tuple[Any, ...], dict[str, dict[str, Any]]] = {}
    labels: dict[tuple[Any, ...], tuple[str, str]] = {}
    for res in results:
        by_key.setdefault(res["key"], {})[res["mode"]] = res
        labels[res["key"]] = (res["label"], res["full"])
    print(
        f"N={N}, alpha={args.alpha:g}, {orders} random orders per row, {args.jobs} processes, "
        f"{elapsed:.0f} s; 'problems' = median / 90th percentile of problems run to a verdict "
        f"(the full run: {N})"
    )
    worst, worst_label = 0.0, ""
    print()
    print("#### min-acc gate")
    print()
    print(
        "| accuracy (correct) | min_acc | full run | certain: problems | sequential: problems "
        "| sequential: disagreement |"
    )
    print("|---|---|---|---|---|---|")
    for key in sorted(by_key):
        label, full = labels[key]
        cert = by_key[key]["certain"]
        seq = by_key[key]["sequential"]
        if cert["wrong"]:
            raise AssertionError(f"certain mode disagreed with the full run: {label}")
        if seq["wrong"] > worst:
            worst, worst_label = seq["wrong"], label
        print(
            f"| {label} | {full} | {cert['median']:g} / {cert['p90']} | "
            f"{seq['median']:g} / {seq['p90']} | {seq['wrong']:.4f} |"
        )
    print()
    print()
    print("targets:")
    missed = 0
    for correct, threshold, mode, most in _TARGETS:
        target = by_key.get((0, threshold, round(correct * N)), {}).get(mode)
        if target is None:
            continue
        ok = target["median"] <= most
        missed += not ok
        print(
            f"  {mode}: accuracy {correct:g} vs min_acc {threshold:g}: median "
            f"{target['median']:g} problems (target <= {most}): {'OK' if ok else 'MISS'}"
        )
    ok = worst <= args.alpha
    missed += not ok
    se = math.sqrt(worst * (1 - worst) / orders)
    print(
        f"worst sequential disagreement over all rows: {worst:.4f} +- {se:.4f} (one standard "
        f"error, {orders} orders) at {worst_label.replace(' | ', ' vs ')} (alpha {args.alpha:g}); "
        f"{'OK' if ok else 'MISS'}; certain mode: 0 everywhere"
    )
    if args.check:
        print(
            f"  every row's first {min(args.check, orders)} orders per mode replayed through "
            "EarlyStop: identical stops and verdicts"
        )
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
