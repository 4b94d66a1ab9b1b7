"""Benchmark: ``python -m pytest_gsm8k merge`` on 8 shard reports of the full split.

Not a test. Run from the repository root::

    python benchmarks/bench_merge.py                 # make the 8 shards, then merge 3 times
    python benchmarks/bench_merge.py --keep DIR      # keep (or reuse) the shard reports in DIR

What it does:

* starts the loopback fake OpenAI server (``tests/fakeserver.py``, no latency) in its own
  process, and runs ``pytest --gsm8k-shard I/8 --gsm8k-repeats 5`` for I = 1..8 (the full
  test split, 1,319 problems asked 5 times each: every record holds its 5 outcomes and
  samples), each writing its report, unless DIR already holds them;
* runs the merge ``--rounds`` times, each in a fresh ``python`` process that measures
  itself: wall time from its start to the end of ``main()`` (reading, checking, deciding and
  writing the merged report), and its peak RSS (``ru_maxrss``);
* prints the medians, the reports' size, and the ratios peak RSS / reports' size and merge
  time / the shards' own wall time; exits 1 when a target is missed (under 2 s, under
  200 MB).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))
from gsm8k_copy import data_dir  # noqa: E402 - the embedded copy, unpacked for the server

SHARDS = 8
REPEATS = 5
TARGET_S = 2.0
TARGET_MB = 200.0

#: the merge in a process of its own, which reports its own time and peak memory
MEASURE = r"""
import json, resource, sys, time
start = time.perf_counter()
from pytest_gsm8k.__main__ import main
code = main(sys.argv[1:])
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"code": code, "wall": wall, "peak_mb": peak}))
"""


def make_shards(folder: Path) -> float:
    """The 8 shard reports, run one after another against one fake server; their wall time."""
    from fakeserver import serve_in_subprocess, stop_subprocess

    proc, base_url = serve_in_subprocess(data_dir() / "test.jsonl", model="fake-model")
    start = time.perf_counter()
    try:
        for index in range(1, SHARDS + 1):
            argv = [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:randomly",
                "-q",
                "--gsm8k-model=fake-model",
                f"--gsm8k-base-url={base_url}",
                "--gsm8k-no-cache",
                "--gsm8k-concurrency=64",
                f"--gsm8k-repeats={REPEATS}",
                f"--gsm8k-shard={index}/{SHARDS}",
                f"--gsm8k-report={folder / f'shard-{index}.json'}",
            ]
            done = subprocess.run(
                argv,
                cwd=folder,
                capture_output=True,
                text=True,
                env={**os.environ, "OPENAI_API_KEY": "sk-bench", "PYTHONPATH": str(REPO)},
            )
            if not (folder / f"shard-{index}.json").exists():
                tail = "\n".join((done.stdout + done.stderr).splitlines()[-10:])
                raise SystemExit(f"shard {index} wrote no report (rc {done.returncode}):\n{tail}")
    finally:
        stop_subprocess(proc)
    return time.perf_counter() - start


def merge_once(folder: Path) -> dict[str, Any]:
    reports = sorted(str(p) for p in folder.glob("shard-*.json"))
    done = subprocess.run(
        [sys.executable, "-c", MEASURE, "merge", *reports, f"--report={folder / 'merged.json'}"],
        capture_output=True,
        text=True,
        cwd=folder,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )
    measured: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    measured["said"] = done.stderr.strip()
    return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="make (or reuse) the shard reports here")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-merge-"))
    folder.mkdir(parents=True, exist_ok=True)
    shards_s = None
    if len(list(folder.glob("shard-*.json"))) != SHARDS:
        shards_s = make_shards(folder)
    size_mb = sum(p.stat().st_size for p in folder.glob("shard-*.json")) / 2**20
    problems = sum(len(json.loads(p.read_text())["problems"]) for p in folder.glob("shard-*.json"))
    runs = [merge_once(folder) for _ in range(args.rounds)]
    wall = statistics.median(r["wall"] for r in runs)
    peak = statistics.median(r["peak_mb"] for r in runs)
    print(f"{SHARDS} shard reports, {problems} problems x {REPEATS} repeats, {size_mb:.1f} MB")
    if shards_s is not None:
        print(f"the shards' runs: {shards_s:.1f} s (one after another)")
    print(f"merge: exit {runs[0]['code']}; {runs[0]['said'] or 'nothing on stderr'}")
    print(f"merge wall (median of {len(runs)}): {wall:.2f} s  (target < {TARGET_S:g} s)")
    print(f"merge peak RSS: {peak:.0f} MB  (target < {TARGET_MB:g} MB)")
    print(f"ratios: peak RSS / reports' size {peak / size_mb:.1f}x", end="")
    if shards_s is not None:
        print(f"; merge time / the shards' runs {wall / shards_s:.3f}", end="")
    print()
    missed = [
        name for name, ok in (("time", wall < TARGET_S), ("memory", peak < TARGET_MB)) if not ok
    ]
    print("targets: " + ("OK" if not missed else "MISS " + ", ".join(missed)))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
