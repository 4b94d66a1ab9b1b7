"""Simulation benchmark of early stopping (issue 13): how early, and how often wrong.

A script, not a test. For outcome vectors of N=1319 problems with a given full-split
accuracy, it runs the real ``pytest_gsm8k.core.early_stop.EarlyStop`` over many uniformly
random orders (the seeded run order's distribution) in both modes and prints Markdown
tables: the full run's verdict, the rate at which the early verdict disagrees with it (the
worst case over the grid beside alpha), and the median and 90th percentile of the number of
problems run before a verdict (N when the run never stops early).

    python benchmarks/bench_early_stop.py [--orders 10000] [--quick] [--jobs 2]

Standard library only. Orders are drawn with ``random.Random(seed)`` per order (the
protocol's SHA-256 order is one such permutation; hashing 1319 ids per order would only
slow the simulation down).
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from pytest_gsm8k.core.early_stop import (  # noqa: E402
    EarlyStop,
    max_drop_count,
    min_acc_count,
)

N = 1319
IDS = [str(i) for i in range(N)]


def _case(job: tuple[str, dict[str, Any], int, int, float]) -> dict[str, Any]:
    """Run one population over ``orders`` random orders in one mode."""
    mode, spec, orders, seed, alpha = job
    outcomes = spec["outcomes"]
    kwargs = spec["gate"]
    full = spec["full"]
    stops: list[int] = []
    wrong = 0
    rng = random.Random(seed)
    for _ in range(orders):
        order = IDS[:]
        rng.shuffle(order)
        es = EarlyStop(IDS, mode=mode, alpha=alpha, order=order, **kwargs)
        decision = es.decision
        if decision is None:
            for pid in order:
                decision = es.observe(pid, outcomes[pid])
                if decision is not None:
                    break
        if decision is None:  # cannot happen: the last outcome makes every verdict certain
            raise AssertionError("undecided after the full run")
        stops.append(decision.after)
        verdict = "FAIL" if "FAIL" in decision.verdicts.values() else "PASS"
        wrong += verdict != full
    stops.sort()
    return {
        "mode": mode,
        "label": spec["label"],
        "full": full,
        "wrong": wrong / orders,
        "median": statistics.median(stops),
        "p90": stops[min(len(stops) - 1, math.ceil(0.9 * len(stops)) - 1)],
        "key": spec["key"],
    }


def min_acc_specs(quick: bool) -> list[dict[str, Any]]:
    specs = []
    for threshold in (0.85, 0.45):
        need = min_acc_count(threshold, N)
        counts = {round(k * 0.05 * N) for k in range(21)}
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
                    "gate": {"min_acc": threshold},
                    "full": "PASS" if correct >= need else "FAIL",
                }
            )
    return specs


def baseline_specs() -> list[dict[str, Any]]:
    """Paired populations: baseline 0.80, a given number of newly failing / passing problems."""
    specs = []
    base_correct = round(0.80 * N)
    for max_drop, failing, passing in (
        (0.02, 66, 66),
        (0.02, 150, 18),
        (0.02, 92, 66),
        (0.02, 93, 66),
        (0.05, 200, 40),
        (0.0, 30, 60),
    ):
        b = [1] * base_correct + [0] * (N - base_correct)
        x = b[:]
        for i in range(failing):
            x[i] = 0
        for i in range(passing):
            x[base_correct + i] = 1
        baseline = dict(zip(IDS, b, strict=True))
        outcomes = {pid: bool(v) for pid, v in zip(IDS, x, strict=True)}
        need = max_drop_count(base_correct, N, max_drop)
        drop = (failing - passing) / N
        specs.append(
            {
                "label": f"drop {drop:+.4f} (-{failing}/+{passing}) | {max_drop:g}",
                "key": (1, max_drop, failing - passing),
                "outcomes": outcomes,
                "gate": {"baseline": baseline, "max_drop": max_drop},
                "full": "PASS" if sum(x) >= need else "FAIL",
            }
        )
    return specs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=10000)
    parser.add_argument("--quick", action="store_true", help="fewer accuracies, 500 orders")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--alpha", type=float, default=0.05)
    args = parser.parse_args()
    orders = min(args.orders, 500) if args.quick else args.orders
    specs = min_acc_specs(args.quick) + baseline_specs()
    jobs = [
        (mode, spec, orders, 1000 + i, args.alpha)
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
    worst = 0.0
    for section, title, head in (
        (0, "min-acc gate", "accuracy (correct) | min_acc"),
        (
            1,
            "baseline max-drop gate, baseline accuracy 0.80",
            "drop (newly failing/passing) | max_drop",
        ),
    ):
        print()
        print(f"#### {title}")
        print()
        print(
            f"| {head} | full run | certain: problems | sequential: problems "
            "| sequential: disagreement |"
        )
        print("|---|---|---|---|---|---|")
        for key in sorted(k for k in by_key if k[0] == section):
            label, full = labels[key]
            cert = by_key[key]["certain"]
            seq = by_key[key]["sequential"]
            if cert["wrong"]:
                raise AssertionError(f"certain mode disagreed with the full run: {label}")
            worst = max(worst, seq["wrong"])
            print(
                f"| {label} | {full} | {cert['median']:g} / {cert['p90']} | "
                f"{seq['median']:g} / {seq['p90']} | {seq['wrong']:.4f} |"
            )
    print()
    print(
        f"worst sequential disagreement over all rows: {worst:.4f} (alpha {args.alpha:g}); "
        "certain mode: 0 everywhere"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
