"""Benchmark: what an installed pytest-gsm8k costs a repository's own test run that never
uses it.

Not a test. Run from the repository root::

    python benchmarks/bench_installed.py             # 10 interleaved rounds
    python benchmarks/bench_installed.py --rounds 20

An auto-loading plugin is imported, configured and asked at every hook of every pytest run
of every repository it is installed in, whether or not that run measures a model. This
makes a repository of 4 trivial tests in a temporary folder and runs, interleaved,
``--rounds`` times each:

* ``disabled``: ``python -m pytest -q -p no:gsm8k`` (the reference: the same interpreter,
  pytest and every other installed plugin, without this one);
* ``installed``: ``python -m pytest -q`` (the plugin loaded, no GSM8K option, no GSM8K item).

It prints each one's median whole-process wall time and the ratio installed / disabled,
with the target (at most 1.10x), and exits 1 when the target is missed. It also prints the
ratio of the processes' CPU time (user + system), for information: on a machine that other
work loads, wall time swings by tenths of a second from run to run and CPU time much less. As in
``bench_plugin.py``, the measured processes get a private ``PYTHONPYCACHEPREFIX`` and one
untimed warm-up run each, so that bytecode is cached as on a user's machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET = 1.10

TESTS = """\
def test_one():
    assert 1 + 1 == 2

def test_two():
    assert "a" in "abc"

def test_three():
    assert [1, 2][0] == 1

def test_four():
    assert {"k": 1}["k"] == 1
"""

RUNS = {
    "disabled": ["-p", "no:gsm8k"],
    "installed": [],
}


def _cpu() -> float:
    """CPU time (user + system) of the finished child processes so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def _run(folder: Path, extra: list[str], env: dict[str, str]) -> tuple[float, float]:
    """One pytest process: its wall time and CPU time."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *extra]
    cpu = _cpu()
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode != 0 or "4 passed" not in done.stdout:
        raise SystemExit(f"{' '.join(extra) or 'installed'}: the run failed:\n{done.stdout}")
    return elapsed, _cpu() - cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "repo"
        (folder / "tests").mkdir(parents=True)
        (folder / "tests" / "test_app.py").write_text(TESTS, encoding="utf-8")
        (folder / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n", encoding="utf-8")
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PYTEST_", "GSM8K_")) and k != "PYTHONDONTWRITEBYTECODE"
        }
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        for extra in RUNS.values():  # warm-up: bytecode cached
            _run(folder, extra, env)
        times: dict[str, list[float]] = {name: [] for name in RUNS}
        cpus: dict[str, list[float]] = {name: [] for name in RUNS}
        for _ in range(args.rounds):
            for name, extra in RUNS.items():
                wall, cpu = _run(folder, extra, env)
                times[name].append(wall)
                cpus[name].append(cpu)
    medians = {name: statistics.median(values) for name, values in times.items()}
    cpu_medians = {name: statistics.median(values) for name, values in cpus.items()}
    for name, median in medians.items():
        low, high = min(times[name]), max(times[name])
        print(
            f"{name:>10}: median {median:.3f} s  (min {low:.3f}, max {high:.3f}), "
            f"CPU {cpu_medians[name]:.3f} s"
        )
    ratio = medians["installed"] / medians["disabled"]
    verdict = "OK" if ratio <= TARGET else "MISS"
    print(f"installed / disabled: {ratio:.2f}x  (target at most {TARGET:.2f}x: {verdict})")
    cpu_ratio = cpu_medians["installed"] / cpu_medians["disabled"]
    print(f"CPU time, installed / disabled: {cpu_ratio:.2f}x  (for information)")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
