"""The xdist controller's fetcher (pytest_gsm8k.lead): forked or fresh, it fetches the
offered plan once, declines another, frees the held-back workers, and never outlives
its controller.

The server is the loopback fake (its own counters are the evidence); the fetcher
is a real process. The end-to-end test runs ``pytest -n 2`` as a subprocess,
the way a user does, because only there is the controller single-threaded at
session start, which is when the fetcher is forked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script

from pytest_gsm8k.core.types import Request
from pytest_gsm8k.lead import LEAD_FILE, READY_FILE, Lead, offer_plan
from pytest_gsm8k.runtime.cache import ResponseCache
from pytest_gsm8k.runtime.client import Breaker, OpenAIClient


def sent(server: FakeOpenAIServer) -> int:
    by_path = server.stats()["requests_by_path"]
    return int(by_path.get("/v1/chat/completions", 0) + by_path.get("/v1/completions", 0))


def gone(pid: int) -> bool:
    """Ended (a zombie counts: the container's init may never reap an orphan)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for task in tasks:
        try:  # a thread may end between the listing and the read
            with open(f"/proc/{pid}/task/{task}/children") as fh:
                found.extend(int(c) for c in fh.read().split())
        except OSError:
            continue
    return found


def cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def lead_config(folder: Path, server: FakeOpenAIServer) -> dict[str, Any]:
    return {
        "run_dir": str(folder), "endpoint": server.base_url, "model": "fake-model",
        "api_key_env": "OPENAI_API_KEY", "timeout": 30.0, "max_retries": 2,
        "concurrency": 4, "cache_root": str(folder / "cache"), "persistent": False,
        "run_id": "run",
    }


def plan(count: int) -> list[Request]:
    questions = [json.loads(line)["question"] for line in
                 (Path(__file__).resolve().parents[2] / "shared" / "gsm8k" / "test.jsonl")
                 .read_text(encoding="utf-8").splitlines()[:count]]
    return [Request(problem_id=f"test-{i:04d}", api="chat", messages=(("user", q),))
            for i, q in enumerate(questions)]


def client(server: FakeOpenAIServer, model: str = "fake-model") -> OpenAIClient:
    return OpenAIClient(model=model, base_url=server.base_url, api_key=None, timeout=30.0,
                        max_retries=2, concurrency=4, breaker=Breaker())


@pytest.fixture
def lead(tmp_path: Path, server: FakeOpenAIServer, keyed_env: str) -> Iterator[Lead]:
    """A started fetcher in a fresh interpreter, closed after the test.

    Not forked here: this test process runs the server's thread (the two
    subprocess tests below cover the forked fetcher).
    """
    started = Lead(tmp_path, lead_config(tmp_path, server))
    started.start(fork=False)
    try:
        yield started
    finally:
        started.close()


def test_fetcher_fetches_the_offered_plan_once_and_frees_the_held_back_workers(
    tmp_path: Path, server: FakeOpenAIServer, lead: Lead
) -> None:
    server.set_script(Script(latency=0.05))
    assert not (tmp_path / READY_FILE).exists()  # nothing answered before a plan
    follow = offer_plan(tmp_path, client(server), plan(12), wait=30)
    assert follow is not None and follow.alive()
    assert lead.wait_ready(30)
    deadline = time.monotonic() + 30
    while server.stats()["completed"] < 12 and time.monotonic() < deadline:
        time.sleep(0.01)
    lead.close()
    feed = ResponseCache(tmp_path / "cache", "run", persistent=False).feed_path
    records = [json.loads(line) for line in feed.read_text(encoding="utf-8").splitlines()]
    assert len({r["k"] for r in records if "r" in r}) == 12  # every answer, for the followers
    assert sent(server) == 12
    assert set(server.stats()["requests_by_index"].values()) == {1}
    assert json.loads((tmp_path / LEAD_FILE).read_text())["state"] == "closed"
    assert lead.proc is None


def test_fetcher_declines_a_plan_for_another_model_and_sends_nothing(
    tmp_path: Path, server: FakeOpenAIServer, lead: Lead
) -> None:
    assert offer_plan(tmp_path, client(server, "other-model"), plan(5), wait=30) is None
    assert lead.wait_ready(30)  # a declined plan does not hold the other workers back
    assert json.loads((tmp_path / LEAD_FILE).read_text())["state"] == "declined"
    assert sent(server) == 0


def test_a_fetcher_that_never_gets_ready_holds_workers_back_no_longer_than_asked(
    lead: Lead,
) -> None:
    start = time.monotonic()
    assert not lead.wait_ready(0.3)  # no plan offered: no first answer
    assert 0.3 <= time.monotonic() - start < 5
    start = time.monotonic()
    assert not lead.wait_ready(30)  # waited out once: the next held-back workers start now
    assert time.monotonic() - start < 5


CONTROLLER = r"""
import json, sys, time
from pathlib import Path
from pytest_gsm8k.lead import Lead
lead = Lead(Path(sys.argv[1]), json.loads(sys.argv[2]))
lead.start()
print(lead.proc.pid, flush=True)
time.sleep(600)
"""


def test_fetcher_ends_when_its_controller_is_killed(
    tmp_path: Path, server: FakeOpenAIServer, keyed_env: str
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CONTROLLER, str(tmp_path),
         json.dumps(lead_config(tmp_path, server))],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        fetcher = int(proc.stdout.readline())
        assert cmdline(fetcher) == cmdline(proc.pid)  # single-threaded: forked
        assert not gone(fetcher)
    finally:
        proc.kill()
        proc.wait()
    deadline = time.monotonic() + 10
    while not gone(fetcher) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert gone(fetcher)


def xdist_run(tmp_path: Path, gsm8k_args: list[str], *extra: str) -> subprocess.Popen[str]:
    """``pytest -n 2`` over 40 problems, 4 at a time, as its own process (stdout piped)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *gsm8k_args, "-p", "no:hypothesispytest", "-n", "2",
         "--gsm8k-limit=40", "--gsm8k-concurrency=4", "--gsm8k-no-cache",
         "--gsm8k-report=r.json", *extra],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def forked_children(proc: subprocess.Popen[str]) -> list[int]:
    return [pid for pid in children(proc.pid) if cmdline(pid) == cmdline(proc.pid)]


def test_xdist_run_forks_its_fetcher_prints_once_and_leaves_nothing_behind(
    tmp_path: Path, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    server.set_script(Script(latency=0.2))
    log_file = tmp_path / "run.log"
    proc = xdist_run(tmp_path, gsm8k_args, f"--log-file={log_file}", "--log-file-level=DEBUG")
    seen: Counter[int] = Counter()
    while proc.poll() is None:  # 40 answers, 4 at a time, 0.2 s each: about 2 s
        seen.update(forked_children(proc))
        time.sleep(0.02)
    out = proc.stdout.read() if proc.stdout is not None else ""
    # A worker being spawned shows the controller's command line too, for the instant
    # between fork and exec; the fetcher shows it for its whole life.
    forked = {pid for pid, count in seen.items() if count >= 5}
    assert proc.returncode == 0, out
    assert len(forked) == 1, forked
    assert all(gone(pid) for pid in forked)
    assert out.count("gsm8k acc (test@1, 0-shot CoT) = 1.0000") == 1, out
    assert sent(server) == 40
    assert set(server.stats()["requests_by_index"].values()) == {1}
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["counts"]["correct"] == 40
    # The fetcher's own HTTP logging never reaches the user's --log-file (it did through the
    # handlers pytest had attached when it was forked, over the workers' lines, as NULs).
    assert b"\0" not in log_file.read_bytes()
    assert "httpcore" not in log_file.read_text(errors="replace")


def test_a_fetcher_killed_mid_run_leaves_the_rest_to_the_workers_and_says_so(
    tmp_path: Path, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    server.set_script(Script(latency=0.2))
    proc = xdist_run(tmp_path, gsm8k_args)
    killed = None
    while proc.poll() is None:
        if killed is None and server.stats()["completed"] >= 8:
            # seen twice, 50 ms apart: the fetcher, not a worker between fork and exec
            first = set(forked_children(proc))
            time.sleep(0.05)
            for pid in first & set(forked_children(proc)):
                os.kill(pid, 9)
                killed = pid
        time.sleep(0.01)
    out = proc.stdout.read() if proc.stdout is not None else ""
    assert killed is not None, out
    assert proc.returncode == 0, out
    assert "gsm8k: the fetcher process ended with code -9; the workers fetched the rest" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["counts"]["correct"] == 40
    # Asked again: only what the fetcher had in flight (4) or had not yet written to the
    # feed (its writer thread batches) when it died.
    assert 40 <= sent(server) <= 40 + 2 * 4


def test_an_empty_plan_frees_the_held_back_workers_and_sends_nothing(
    tmp_path: Path, server: FakeOpenAIServer, lead: Lead
) -> None:
    # What a worker offers when it has nothing for the fetcher (-k elsewhere, overridden
    # fixtures, collection errors): without it the others would wait LEAD_READY_WAIT.
    assert offer_plan(tmp_path, client(server), [], wait=30) is not None
    assert lead.wait_ready(30)
    assert sent(server) == 0


def test_xdist_run_deselecting_every_problem_sends_nothing(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    pytester.makepyfile(test_other="def test_other():\n    assert True\n")
    result = pytester.runpytest(*gsm8k_args, "-p", "no:hypothesispytest", "-n", "2",
                                "-k", "test_other")
    assert result.ret == 0
    result.assert_outcomes(passed=1)
    assert sent(server) == 0


def test_the_fetcher_is_not_forked_beside_a_running_thread() -> None:
    import threading

    from pytest_gsm8k.lead import _can_fork

    release = threading.Event()
    thread = threading.Thread(target=release.wait)
    thread.start()
    try:
        assert not _can_fork()  # a fresh interpreter instead
    finally:
        release.set()
        thread.join()


def test_a_worker_stops_waiting_for_a_fetcher_whose_heartbeat_is_stale(
    tmp_path: Path, server: FakeOpenAIServer
) -> None:
    (tmp_path / LEAD_FILE).write_text(json.dumps({"state": "listening"}))
    old = time.time() - 60  # a fetcher that died before it read any plan
    os.utime(tmp_path / LEAD_FILE, (old, old))
    start = time.monotonic()
    assert offer_plan(tmp_path, client(server), plan(3), wait=30) is None
    assert time.monotonic() - start < 5  # not the 30 s it would wait for a live one
