"""The gate simulation's numpy twin must stay the real noise-aware test.

benchmarks/bench_gate.py computes the noise-aware p-value of 1,000 reruns per row from
per-stratum counts (``twin_p_value``) instead of the real ``p_value``; these tests keep a
change to core/calibrated.py from silently leaving the published figures about another
test, and keep the script's output readable.
"""

from __future__ import annotations

import importlib.util
import random
import re
import sys
from types import ModuleType

import pytest
from helpers import REPO

from pytest_gsm8k.core.calibrated import Pair, p_value, statistic
from pytest_gsm8k.core.stats import mcnemar_one_sided

SCRIPT = REPO / "benchmarks" / "bench_gate.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gate", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_gate"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _pairs(repeats: int, strata: list[tuple[int, int]], rng: random.Random) -> list[Pair]:
    """Problems with these strata (``t`` successes over ``K + 1`` runs: ``f`` failed now),
    plus problems that are never or always right, which the test must ignore."""
    pairs = []
    for t, (m, f) in enumerate(strata, 1):
        pairs += [Pair(f"f{t}.{i}", t, repeats, 0, 1) for i in range(f)]
        pairs += [Pair(f"s{t}.{i}", t - 1, repeats, 1, 1) for i in range(m - f)]
    pairs += [Pair(f"r{i}", repeats, repeats, 1, 1) for i in range(rng.randint(0, 5))]
    pairs += [Pair(f"w{i}", 0, repeats, 0, 1) for i in range(rng.randint(0, 5))]
    rng.shuffle(pairs)
    return pairs


def test_twin_equals_the_real_p_value_on_random_small_cases(bench: ModuleType) -> None:
    rng = random.Random(22)
    for _ in range(300):
        repeats = rng.choice([1, 2, 3, 5])
        strata = []
        for _t in range(repeats):
            m = rng.randint(0, 8)
            strata.append((m, rng.randint(0, m)))
        pairs = _pairs(repeats, strata, rng)
        twin, observed = bench.twin_p_value(repeats, tuple(strata))
        assert observed == statistic(pairs), (repeats, strata)
        assert bench.p_values_agree(twin, p_value(pairs)), (repeats, strata, twin, p_value(pairs))


def test_twin_agrees_on_a_full_sized_drop(bench: ModuleType) -> None:
    """The size the bench runs at: 132 noisy problems and a 13-problem drop, K = 5."""
    rng = random.Random(5)
    strata = [(12, 2), (25, 9), (33, 14), (25, 12), (12 + 13, 2 + 13)]
    pairs = _pairs(5, strata, rng)
    twin, _ = bench.twin_p_value(5, tuple(strata))
    assert twin < 0.01
    assert bench.p_values_agree(twin, p_value(pairs))


@pytest.mark.parametrize("weights", ["squared", "linear", "count"])
def test_every_weighting_is_mcnemar_for_single_runs(bench: ModuleType, weights: str) -> None:
    """With K = 1 every informative problem weighs the same, whatever the weights: the
    linear and count twins, which no real test backs, are checked here."""
    for m in range(0, 40, 3):
        for f in range(m + 1):
            twin, _ = bench.twin_p_value(1, ((m, f),), weights)
            assert bench.p_values_agree(twin, mcnemar_one_sided(f, m - f)), (m, f, weights)


def test_a_disagreeing_twin_is_refused(bench: ModuleType) -> None:
    assert not bench.p_values_agree(0.0101, 0.0100)
    assert bench.p_values_agree(1e-14, 3e-13)  # both below what the Chernoff bound returns
    bench.check_scores()  # the twin's per-failure scores are Pair.score


def test_quick_run_prints_well_formed_rows_and_the_targets(
    bench: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    code = bench.main(["--quick", "--check", "2"])
    out = capsys.readouterr().out
    main_rows = [line for line in out.splitlines() if re.match(r"\| \d+% noisy \| ", line)]
    labels = {row.split(" | ")[1] for row in main_rows}
    assert labels == {"full", "limit 200"}
    for row in main_rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) in (5, 9), row  # the honesty table, the main table
        shares = [cells[4], *cells[6:]] if len(cells) == 9 else [cells[4].split()[0]]
        assert all(0.0 <= float(s) <= 1.0 for s in shares), row
    # an unchanged model is never failed by vLLM's 8-point tolerance, and a drop is a drop
    assert any("unchanged" in r and r.endswith("| 0.000 |") for r in main_rows)
    targets = [line for line in out.splitlines() if line.startswith("  ") and "target" in line]
    assert len(targets) == 4  # --quick: K = 1 and 5 unchanged, 1- and 2-point drops at K = 5
    assert all(line.endswith((": PASS", ": FAIL")) for line in targets)
    assert code == (1 if any(line.endswith("FAIL") for line in targets) else 0)
    assert "first 2 reruns replayed through NoiseAware: identical" in out
