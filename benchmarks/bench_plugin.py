"""Benchmark: the whole plugin, as a user runs it, against the leanest possible client.

Not a test. Run from the repository root::

    python benchmarks/bench_plugin.py            # latency 0 and 0.2 s, 3 rounds
    python benchmarks/bench_plugin.py --latency 0.2 --rounds 5

What it does, for each latency:

* starts the loopback fake OpenAI server (``tests/fakeserver.py``) in its own
  process with that fixed latency;
* runs, each in its own measuring wrapper process, interleaved, ``--rounds``
  times:

  - ``reference``: the leanest possible client (``AsyncOpenAI`` +
    ``asyncio.Semaphore(64)`` + the seed's regex over the full test split),
    a separate ``python`` process;
  - ``plugin``: ``python -m pytest --gsm8k-model=... --gsm8k-base-url=...
    --gsm8k-concurrency=64 --gsm8k-no-cache -p no:cacheprovider`` (the embedded data)
    in an empty temporary folder (no conftest, no ini: what a user with an
    empty repository gets);
  - ``plugin -n 2``: the same with pytest-xdist's ``-n 2``;

* measures, per run: the whole-process wall time (from spawn to exit, as the
  wrapper sees it), the peak RSS of every process in the tree (``VmHWM`` from
  ``/proc/<pid>/status``, sampled every 20 ms, cross-checked with the
  wrapper's ``RUSAGE_CHILDREN`` maximum), and the server's own count of
  completion requests (reset before each run; it must be exactly 1,319, with
  no problem asked twice);
* prints the median of the rounds per configuration and the ratios against
  the reference, with the targets (at 200 ms: single process at most 1.15x the
  reference, ``-n 2`` at most 1.05x the single process, at most 120 MB per
  process; at 0 ms, at most 2x the reference); exits 1 when one is missed.

Peak RSS columns: ``main`` is the pytest process (the xdist controller under
``-n 2``, which runs the one engine), ``worker`` the largest xdist worker.

Bytecode: this sandbox sets ``PYTHONDONTWRITEBYTECODE=1``, which makes
pytest re-parse every plugin module it assertion-rewrites (pytest-gsm8k and
any other installed plugin, e.g. hypothesis) on every start. A user's machine
caches them, so the measured processes get ``PYTHONPYCACHEPREFIX`` pointing to
a private folder instead (nothing is written into site-packages or the
repository) and one untimed warm-up run of each configuration fills it.
``--as-is`` keeps the environment untouched.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))
from gsm8k_copy import data_dir  # noqa: E402 - the embedded copy, unpacked for the server

DATA = data_dir()
CONCURRENCY = 64
MODEL = "fake-model"

# ---------------------------------------------------------------------------- the reference


REFERENCE = r"""
import asyncio, json, re, sys
from openai import AsyncOpenAI

ANSWER = re.compile(r"####\s*(-?[\d,]+(?:\.\d+)?)")


def number(text):
    match = ANSWER.search(text or "")
    return match.group(1).replace(",", "") if match else None


async def main(base_url, path, concurrency):
    with open(path, encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    client = AsyncOpenAI(base_url=base_url, api_key="EMPTY")
    limit = asyncio.Semaphore(concurrency)

    async def one(row):
        async with limit:
            reply = await client.chat.completions.create(
                model="fake-model",
                messages=[{"role": "user", "content": row["question"]}],
                temperature=0.0,
                max_tokens=1024,
            )
        return number(reply.choices[0].message.content) == number(row["answer"])

    correct = sum(await asyncio.gather(*(one(row) for row in rows)))
    await client.close()
    print(f"reference acc = {correct / len(rows):.4f} n={len(rows)}")


asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


# ---------------------------------------------------------------------------- measuring


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it (from /proc/<pid>/task/*/children)."""
    found = [root]
    index = 0
    while index < len(found):
        pid = found[index]
        index += 1
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    found.extend(int(c) for c in fh.read().split())
            except OSError:
                continue
    return found


def _hwm_kb(pid: int) -> tuple[str, int] | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            text = fh.read()
    except OSError:
        return None
    name, hwm = "?", 0
    for line in text.splitlines():
        if line.startswith("Name:"):
            name = line.split(None, 1)[1]
        elif line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
    return name, hwm


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def measure_main(argv: list[str]) -> int:
    """Wrapper mode: run ``argv``, print one JSON line with wall time and peak RSS."""
    import resource

    cwd = os.environ.pop("BENCH_CWD", None)
    log = os.environ.pop("BENCH_LOG", None)
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115
    peaks: dict[int, tuple[str, int]] = {}
    stop = threading.Event()
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)

    def sample() -> None:
        while not stop.is_set():
            for pid in _descendants(proc.pid):
                got = _hwm_kb(pid)
                if got is not None and got[1] >= peaks.get(pid, ("", 0))[1]:
                    # read each time: a process between fork and exec still shows its
                    # parent's command line
                    label = _cmdline(pid) or peaks.get(pid, ("", 0))[0]
                    peaks[pid] = (label, got[1])
            stop.wait(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    rc = proc.wait()
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    children_max = usage.ru_maxrss  # KB on Linux
    print(
        json.dumps(
            {
                "rc": rc,
                "wall": wall,
                # CPU seconds of the whole tree (every process waited for): what load on
                # the machine changes least
                "cpu": usage.ru_utime + usage.ru_stime,
                "children_max_kb": children_max,
                "peaks": {str(pid): [label, kb] for pid, (label, kb) in peaks.items()},
            }
        )
    )
    return 0


def _classify(label: str) -> str:
    if "execnet" in label or "gateway_base" in label or "-c import sys;exec(eval(" in label:
        return "worker"
    return "main"


def run_measured(argv: list[str], *, cwd: Path, env: dict[str, str], log: Path) -> dict[str, Any]:
    wrapper = [sys.executable, str(Path(__file__).resolve()), "--measure", "--", *argv]
    child_env = dict(env, BENCH_CWD=str(cwd), BENCH_LOG=str(log))
    done = subprocess.run(wrapper, env=child_env, capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    mains = [kb for label, kb in result["peaks"].values() if _classify(label) == "main"]
    workers = [kb for label, kb in result["peaks"].values() if _classify(label) == "worker"]
    result["main_mb"] = max(mains, default=0) / 1024
    result["worker_mb"] = max(workers, default=0) / 1024
    result["workers"] = len(workers)
    result["max_mb"] = (
        max(result["children_max_kb"], *(kb for _, kb in result["peaks"].values())) / 1024
    )
    return result


# ---------------------------------------------------------------------------- the server


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        data: dict[str, Any] = json.loads(reply.read())
        return data


def _post(url: str) -> None:
    request = urllib.request.Request(url, data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=10) as reply:
        reply.read()


def server_counts(root: str) -> tuple[int, int]:
    """(completion requests, most requests for one problem) since the last reset."""
    stats = _get(root + "/_stats")
    by_path = stats["requests_by_path"]
    sent = by_path.get("/v1/chat/completions", 0) + by_path.get("/v1/completions", 0)
    worst = max((int(v) for v in stats["requests_by_index"].values()), default=0)
    return sent, worst


# ---------------------------------------------------------------------------- the benchmark


def configurations(base_url: str, data: Path) -> list[tuple[str, list[str]]]:
    pytest_cmd = [
        sys.executable,
        "-m",
        "pytest",
        f"--gsm8k-model={MODEL}",
        f"--gsm8k-base-url={base_url}",
        f"--gsm8k-concurrency={CONCURRENCY}",
        "--gsm8k-no-cache",
        "-p",
        "no:cacheprovider",
    ]
    return [
        (
            "reference",
            [sys.executable, "-c", REFERENCE, base_url, str(data / "test.jsonl"), str(CONCURRENCY)],
        ),
        ("plugin", pytest_cmd),
        ("plugin -n 2", [*pytest_cmd, "-n", "2"]),
    ]


def bench_latency(
    latency: float, rounds: int, env: dict[str, str], work: Path, problems: int
) -> dict[str, list[dict[str, Any]]]:
    from fakeserver import serve_in_subprocess, stop_subprocess

    proc, base_url = serve_in_subprocess(DATA / "test.jsonl", latency=latency, model=MODEL)
    root = base_url.rsplit("/v1", 1)[0]
    results: dict[str, list[dict[str, Any]]] = {}
    try:
        configs = configurations(base_url, DATA)
        for round_ in range(rounds + 1):  # round 0: untimed warm-up (fills the bytecode cache)
            for name, argv in configs:
                cwd = Path(tempfile.mkdtemp(prefix="bench-run-", dir=work))  # empty folder
                log = work / f"{name.replace(' ', '_')}-{latency:g}-{round_}.log"
                _post(root + "/_reset")
                measured = run_measured(argv, cwd=cwd, env=env, log=log)
                sent, worst = server_counts(root)
                measured["requests"] = sent
                measured["worst"] = worst
                text = log.read_text(errors="replace")
                measured["ok"] = measured["rc"] == 0 and f"n={problems}" in text
                if not measured["ok"]:
                    tail = "\n".join(text.splitlines()[-15:])
                    print(
                        f"!! {name} (latency {latency:g}) failed, rc={measured['rc']}:\n{tail}",
                        file=sys.stderr,
                    )
                if round_ == 0:
                    continue
                results.setdefault(name, []).append(measured)
                print(
                    f"  latency {latency:g} s, round {round_}: {name:<12} "
                    f"{measured['wall']:6.2f} s  main {measured['main_mb']:4.0f} MB  "
                    f"worker {measured['worker_mb']:4.0f} MB  requests {sent}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        stop_subprocess(proc)
    return results


def summarize(
    all_results: dict[float, dict[str, list[dict[str, Any]]]], problems: int, rounds: int
) -> tuple[str, bool]:
    """The table, and the verdicts on the targets (plus informative lines)."""
    lines = [
        f"full test split ({problems} problems), concurrency {CONCURRENCY}; wall = median of "
        f"{rounds} round(s), peak RSS = max over the rounds",
        "",
    ]
    header = (
        f"| {'latency':>7} | {'run':<12} | {'wall s':>6} | {'min..max s':>12} | "
        f"{'x ref':>5} | {'peak RSS MB (main / worker)':>27} | {'requests':>8} |"
    )
    lines.append(header)
    lines.append("|" + "|".join("-" * len(cell) for cell in header.split("|")[1:-1]) + "|")
    ok = True
    verdicts: list[str] = []
    notes: list[str] = []
    for latency, results in all_results.items():
        ms = f"{latency * 1000:.0f} ms"
        ref = statistics.median(r["wall"] for r in results["reference"])
        medians: dict[str, float] = {}
        peaks: dict[str, float] = {}
        for name, runs in results.items():
            walls = [r["wall"] for r in runs]
            medians[name] = wall = statistics.median(walls)
            main_mb = max(r["main_mb"] for r in runs)
            worker_mb = max(r["worker_mb"] for r in runs)
            peaks[name] = max(main_mb, worker_mb)
            requests = sorted({r["requests"] for r in runs})
            exact = all(r["requests"] == problems and r["worst"] == 1 for r in runs)
            ok &= exact and all(r["ok"] for r in runs)
            rss = f"{main_mb:.0f}" + (f" / {worker_mb:.0f}" if worker_mb else "")
            shown = ",".join(str(n) for n in requests) + ("" if exact else " !")
            lines.append(
                f"| {ms:>7} | {name:<12} | {wall:6.2f} | {min(walls):5.2f}..{max(walls):5.2f} | "
                f"{wall / ref:5.2f} | {rss:>27} | {shown:>8} |"
            )
        target = 1.15 if latency > 0 else 2.0
        ratio = medians["plugin"] / ref
        ok &= ratio <= target
        verdicts.append(
            f"  {ms}: plugin {ratio:.2f}x the reference (target <= {target}x): "
            f"{'OK' if ratio <= target else 'MISS'}"
        )
        if "plugin -n 2" in medians:
            spread = medians["plugin -n 2"]
            if latency > 0:
                hit = spread <= 1.05 * medians["plugin"]
                ok &= hit
                verdicts.append(
                    f"  {ms}: plugin -n 2 {spread:.2f} s vs {medians['plugin']:.2f} s without "
                    f"xdist ({spread / medians['plugin']:.2f}x; target <= 1.05x): "
                    f"{'OK' if hit else 'MISS'}"
                )
            notes.append(f"  {ms}: plugin -n 2 is {spread / ref:.2f}x the reference")
        for name in ("plugin", "plugin -n 2"):
            if name in peaks:
                hit = peaks[name] <= 120
                ok &= hit
                verdicts.append(
                    f"  {ms}: {name} peak RSS {peaks[name]:.0f} MB per process "
                    f"(target <= 120 MB): {'OK' if hit else 'MISS'}"
                )
    exact_all = all(
        r["requests"] == problems and r["worst"] == 1
        for res in all_results.values()
        for runs in res.values()
        for r in runs
    )
    verdicts.append(
        f"  every run: server-side completion requests == {problems}, none asked "
        f"twice: {'OK' if exact_all else 'MISS'}"
    )
    lines += ["", "targets:", *verdicts, "for information:", *notes]
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--measure"]:
        return measure_main(args[2:] if args[1:2] == ["--"] else args[1:])
    parser = argparse.ArgumentParser(description="pytest-gsm8k vs the leanest client")
    parser.add_argument(
        "--latency",
        type=float,
        action="append",
        help="server latency in seconds (repeatable; default 0 and 0.2)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per configuration")
    parser.add_argument(
        "--as-is",
        action="store_true",
        help="keep PYTHONDONTWRITEBYTECODE etc. as they are (no bytecode cache)",
    )
    opts = parser.parse_args(args)
    latencies = opts.latency or [0.0, 0.2]
    problems = sum(1 for line in (DATA / "test.jsonl").open(encoding="utf-8") if line.strip())
    with tempfile.TemporaryDirectory(prefix="gsm8k-bench-") as tmp:
        work = Path(tmp)
        env = dict(os.environ)
        for name in ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "OPENAI_BASE_URL"):
            env.pop(name, None)
        env["OPENAI_API_KEY"] = "EMPTY"
        if not opts.as_is:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(work / "pycache")
        print(
            f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.2f}",
            file=sys.stderr,
        )
        all_results = {}
        for latency in latencies:
            all_results[latency] = bench_latency(latency, opts.rounds, env, work, problems)
        table, ok = summarize(all_results, problems, opts.rounds)
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
        f"load average after: {os.getloadavg()[0]:.2f}"
    )
    print(table)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
