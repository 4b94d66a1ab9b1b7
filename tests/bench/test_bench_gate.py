"""The gate simulation's numpy twin must stay the real noise-aware test.

benchmarks/bench_gate.py computes the noise-aware test's p-values of 240,000 reruns with a
numpy twin (``twin``: per-stratum convolution powers through the Fourier transform) and the
claim with ``claims``, instead of the real ``evidence`` and ``reach``; these tests keep a
change to core/calibrated.py from silently leaving the published figures about another
test.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import numpy as np
import pytest
from helpers import REPO

from pytest_gsm8k.core.calibrated import Pair, evidence, reach

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


@pytest.mark.parametrize(("k", "ell"), [(1, 1), (1, 5), (3, 1), (5, 1), (5, 5), (10, 5)])
def test_twin_equals_the_real_test_and_claim(bench: ModuleType, k: int, ell: int) -> None:
    rng = np.random.default_rng(k * 10 + ell)
    rates = np.concatenate([np.ones(60), np.zeros(20), rng.uniform(0.05, 0.95, 40)])
    after = bench.regress(rates, "both", 6.0)
    base = rng.binomial(k, rates, (4, len(rates)))
    now = rng.binomial(ell, after, (4, len(rates)))
    flip, drop, rise = bench.twin(base, now, k, ell)
    claims = bench.claims(base, now, k, ell, 0.01)
    for r in range(4):
        pairs = [
            Pair(str(i), int(c), k, int(d), ell)
            for i, (c, d) in enumerate(zip(base[r], now[r], strict=True))
        ]
        real = evidence(pairs)
        assert flip[r] == pytest.approx(real.flip, abs=1e-9)
        assert drop[r] == pytest.approx(real.drop, abs=1e-9)
        assert rise[r] == pytest.approx(real.rise, abs=1e-9)
        assert claims[r] == pytest.approx(reach(pairs, 0.01).problems, rel=1e-12)


def test_a_disagreeing_twin_is_refused(bench: ModuleType) -> None:
    base = np.array([5, 5, 3, 0])
    now = np.array([0, 1, 0, 0])
    with pytest.raises(bench.TwinMismatch):
        bench._check(base, now, 5, 1, (0.5, 0.5, 0.5), 0.01)


def test_the_shapes_take_off_what_they_say(bench: ModuleType) -> None:
    rates = bench.FAMILIES["uniform"](np.random.default_rng(1))
    for shape in bench.SHAPES:
        after = bench.regress(rates, shape, 13.19)
        assert float((rates - after).sum()) == pytest.approx(13.19, abs=0.5)
        assert (after <= rates + 1e-12).all()
