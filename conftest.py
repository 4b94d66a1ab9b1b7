"""Repository-level conftest: makes tests/ helpers (the fake server) importable, and sets what
``-n auto`` means for this suite."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """One worker more than the CPUs (xdist's documented hook): about a fifth of the suite's
    time is tests waiting (scripted latency, timeouts, servers starting) while the other
    worker may be waiting too. On 2 cores, fresh clone: -n 2 6:01, -n 3 5:25, -n 4 5:35
    (benchmarks/durations.txt, "Sixth session: -n auto")."""
    if config.option.numprocesses != "auto":
        return None
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (cpus or 1) + 1
