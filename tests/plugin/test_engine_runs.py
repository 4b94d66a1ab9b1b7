"""The engine end to end: prefetch, retries, fail-fast, resume, xdist, user callables.

Every run is the real plugin (pytester, in-process unless xdist or a SIGKILL
needs processes) against the loopback fake server of tests/fakeserver.py; the
server's own counters (requests per problem, peak in flight, status codes)
are the evidence, never the plugin's opinion of itself.
The engine driven directly with scripted clients is in
tests/unit/runtime/test_engine.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_EXTRA_PLUGINS, XDIST, GsmRun, output, sent, spawn_pytest, wait_until
from helpers import read_json as read_report

HEADLINE = "gsm8k acc (test@1, 0-shot CoT) = "


def per_problem(server: FakeOpenAIServer) -> dict[int, int]:
    return {int(k): int(v) for k, v in server.stats()["requests_by_index"].items()}


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """A report without what legitimately differs between a run and its cached rerun."""
    out = {
        k: v
        for k, v in report.items()
        if k not in ("from_cache", "resumed", "started_at", "finished_at", "duration_s")
    }
    out["problems"] = [{k: v for k, v in p.items() if k != "cached"} for p in report["problems"]]
    return out


def entries(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "responses").glob("*/*.json"))


# -- prefetch -------------------------------------------------------------------------


def test_prefetch_keeps_exactly_the_concurrency_limit_in_flight(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    server.set_script(Script(latency=0.25))
    gsm8k_run("--gsm8k-limit=48", "--gsm8k-concurrency=12", "--gsm8k-no-cache", report=None)
    stats = server.stats()
    assert stats["peak_in_flight"] == 12
    assert sent(server) == 48
    assert set(per_problem(server).values()) == {1}


#: each xdist worker writes down whether it imported an HTTP client
WORKER_PROBE = """
import json, os, sys

def pytest_sessionfinish(session):
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is not None:
        with open(os.path.join(os.environ["PROBE_DIR"], workerinput["workerid"]), "w") as fh:
            json.dump({"openai": "openai" in sys.modules,
                       "httpx": any(m in sys.modules for m in ("httpx", "httpx2"))}, fh)
"""


def test_xdist_report_is_the_same_as_without_and_requests_are_not_repeated(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every outcome and a failed gate, plain and spread over workers: the same report and
    summary, each problem asked once (the full split plain: test_plugin.py). Under xdist the
    controller fetches for every worker: the workers never import an HTTP client."""
    script = Script(
        behaviours={i: "wrong" for i in range(0, 1319, 7)}
        | {i: "unparsed" for i in range(3, 1319, 11)}
        | {i: "truncated" for i in range(5, 1319, 13)},
        latency=0.1,
    )
    server.set_script(script)
    run = ["--gsm8k-limit=80", "--gsm8k-concurrency=16", "--gsm8k-no-cache", "--gsm8k-min-acc=0.98"]
    plain, _ = gsm8k_run(*run, "--gsm8k-report=plain.json", ret=1, report=None)
    assert sent(server) == 80
    one = read_report(pytester.path / "plain.json")
    assert 0 < one["correct"] < 80
    assert all(one["counts"][k] for k in ("wrong", "unparsed", "truncated")), one["counts"]
    assert [g["passed"] for g in one["gates"]] == [False]

    def summary(result: pytest.RunResult) -> list[str]:
        """The headline, the outcomes line and the gate's line."""
        return [
            line
            for line in result.outlines
            if line.startswith((HEADLINE, "  outcomes: ")) or "--gsm8k-min-acc 0.98" in line
        ]

    lines = summary(plain)
    assert len(lines) == 3, lines
    pytester.makeconftest(WORKER_PROBE)
    # -n auto is the cores (2 here: README's -n 2); -n 3 has more workers than cores, so
    # two of them wait for the fetcher's first answer.
    for workers in ("auto", "3"):
        server.reset()
        server.set_script(script)
        probe = pytester.path / f"probe-{workers}"
        probe.mkdir()
        monkeypatch.setenv("PROBE_DIR", str(probe))
        spread, _ = gsm8k_run(
            *run, "-n", workers, f"--gsm8k-report=x{workers}.json", ret=1, report=None
        )
        assert sent(server) == 80, workers
        assert set(per_problem(server).values()) == {1}, workers
        assert 8 <= server.stats()["peak_in_flight"] <= 16  # never more than the limit
        assert comparable(read_report(pytester.path / f"x{workers}.json")) == comparable(one)
        assert lines == summary(spread)
        seen = [json.loads(p.read_text()) for p in probe.iterdir()]
        started = re.search(r"(\d+) workers \[80 items\]", output(spread))
        assert started is not None, output(spread)
        assert len(seen) == int(started.group(1)) >= 2, seen
        assert all(not s["openai"] and not s["httpx"] for s in seen), seen


@XDIST
def test_a_request_failing_after_retries_is_asked_no_more_than_the_retries(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    server.set_script(Script(behaviours={i: "error500" for i in range(0, 1319, 4)}))
    result = pytester.runpytest(
        *gsm8k_args,
        *xdist,
        "--gsm8k-limit=24",
        "--gsm8k-max-retries=1",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
    )
    report = read_report(pytester.path / "r.json")
    failed = {p["index"] for p in report["problems"] if p["outcome"] == "error"}
    assert failed
    assert failed == {p["index"] for p in report["problems"] if p["index"] % 4 == 0}
    assert {p["error"] for p in report["problems"] if p["outcome"] == "error"} == {
        "HTTP 500 after retries: The server had an error (scripted)."
    }
    counts = per_problem(server)
    assert all(counts[i] == (2 if i in failed else 1) for i in counts), counts  # 1 + 1 retry
    assert result.ret != 0


# -- retries and fail-fast ----------------------------------------------------------


def test_429_storm_with_retry_after_ends_with_every_answer(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    storm = {i: {"429": 4} for i in range(1319)}
    server.set_script(Script(fail_first=storm, retry_after=0.05))
    result, _ = gsm8k_run(
        "--gsm8k-limit=30",
        "--gsm8k-concurrency=10",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        report=None,
    )
    report = read_report(pytester.path / "r.json")
    assert report["counts"]["correct"] == 30
    assert report["counts"]["error"] == 0
    stats = server.stats()
    assert stats["status_counts"].get(429) == 120  # every request refused four times
    assert stats["status_counts"].get(200) == 31  # 30 answers and the preflight
    assert "unreachable" not in output(result)


def _one_message_failure(result: pytest.RunResult, report: dict[str, Any]) -> str:
    """The checks every dead-endpoint run must pass; returns the shared message."""
    text = output(result)
    assert result.ret not in (0, pytest.ExitCode.USAGE_ERROR), text
    errors = [p for p in report["problems"] if p["outcome"] == "error"]
    assert errors
    assert len(errors) + report["counts"]["correct"] == report["n"] == 1319
    messages = Counter(p["error"] for p in errors)
    assert len(messages) == 1, messages  # one message shared by every unfinished item
    [message] = messages
    assert "unreachable" in message
    assert "stopped sending" in message
    assert "Traceback" not in text
    assert "raise " not in text
    # a few lines name it (the failed item, the run-stopped line), not one per problem
    assert sum(message[:40] in line for line in text.splitlines()) <= 8, text
    return str(message)


def test_server_dying_mid_run_fails_fast_with_one_message(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    server.set_script(Script(latency=0.02))
    server.die_after = 40
    result = pytester.runpytest(
        *gsm8k_args, "--gsm8k-concurrency=16", "--gsm8k-no-cache", "--gsm8k-report=r.json"
    )
    report = read_report(pytester.path / "r.json")
    _one_message_failure(result, report)
    # The run stops at the first item whose answer died with the server; answers that arrived
    # for items after it (out of order, up to the concurrency) are reported as errors too.
    assert 40 - 16 <= report["counts"]["correct"] <= 40
    assert sent(server) <= 40 + 16


def test_server_killed_under_xdist_fails_fast_with_one_message(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    server.set_script(Script(latency=0.05))

    def kill_after_some_answers() -> None:
        wait_until(lambda: server.stats()["completed"] >= 30, 30)
        server.kill()

    killer = threading.Thread(target=kill_after_some_answers, daemon=True)
    killer.start()
    result = pytester.runpytest(
        *gsm8k_args,
        "-n",
        "2",
        "--gsm8k-concurrency=16",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
    )
    killer.join()
    _one_message_failure(result, read_report(pytester.path / "r.json"))


# -- cache and resume -----------------------------------------------------------------


def _settle(server: FakeOpenAIServer) -> None:
    """Wait until nothing more arrives (bytes a killed client left in a socket included):
    the same request count, with nothing in flight, four polls in a row."""
    seen: list[int] = []

    def quiet() -> bool:
        stats = server.stats()
        seen.append(-1 if stats["in_flight"] else stats["requests_total"])
        return len(seen) >= 4 and seen[-1] >= 0 and len(set(seen[-4:])) == 1

    assert wait_until(quiet, 30, interval=0.05), "the server never went quiet"


def test_sigkill_mid_run_then_rerun_sends_only_the_missing_requests(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    """(Under -n 2, the same run and rerun with the controller killed alone, the harder case
    for what is left behind: test_xdist.py's SIGKILL of the controller.)"""
    server.set_script(Script(latency=0.05))
    cache = pytester.path / "cache"
    run = [
        *gsm8k_args,
        "--gsm8k-limit=120",
        "--gsm8k-concurrency=4",
        f"--gsm8k-cache-dir={cache}",
    ]
    # Its own process group, killed as a whole the way a CI runner kills a job; its
    # temporary run folder (left behind by the kill) goes under pytester's folder.
    proc = spawn_pytest(
        pytester,
        *run,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: len(entries(cache)) >= 20, 30)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    _settle(server)
    kept = len(entries(cache))
    first_run = sent(server)
    assert 20 <= kept < 120
    assert kept <= first_run < 120

    server.reset()
    result = pytester.runpytest(*run, "--gsm8k-resume", "--gsm8k-report=r.json")
    assert result.ret == 0, output(result)
    assert sent(server) == 120 - kept  # only the missing ones
    assert set(per_problem(server).values()) == {1}
    report = read_report(pytester.path / "r.json")
    assert report["counts"]["correct"] == 120
    assert report["from_cache"] == kept
    result.stdout.fnmatch_lines([f"*answers from cache: {kept} of 120*"])


def test_rerun_of_a_finished_run_asks_again_and_a_resume_sends_nothing_and_reports_the_same(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    """A verdict rests on answers this run received: a rerun asks the endpoint again. With
    --gsm8k-resume (re-scoring offline) it reads every answer and reports the same."""
    server.set_script(Script(behaviours={i: "wrong" for i in range(0, 1319, 5)}))
    run = [*gsm8k_args, "--gsm8k-limit=40", "--gsm8k-cache-dir=cache"]
    first = pytester.runpytest(*run, "--gsm8k-report=first.json")
    assert first.ret == 0
    assert sent(server) == 40
    first.stdout.fnmatch_lines(["*answers from cache: 0 of 40*"])
    server.reset()
    rerun = pytester.runpytest(*run, "--gsm8k-report=rerun.json")
    assert rerun.ret == 0
    assert sent(server) == 40
    rerun.stdout.fnmatch_lines(["*answers from cache: 0 of 40*"])
    assert comparable(read_report(pytester.path / "rerun.json")) == comparable(
        read_report(pytester.path / "first.json")
    )
    server.reset()
    second = pytester.runpytest(*run, "--gsm8k-resume", "--gsm8k-report=second.json")
    assert second.ret == 0
    assert sent(server) == 0
    second.stdout.fnmatch_lines(["*answers from cache: 40 of 40*"])
    one = read_report(pytester.path / "first.json")
    two = read_report(pytester.path / "second.json")
    assert comparable(one) == comparable(two)
    assert two["from_cache"] == 40
    assert one["from_cache"] == 0
    assert [line for line in first.outlines if line.startswith(HEADLINE)] == [
        line for line in second.outlines if line.startswith(HEADLINE)
    ]


def test_corrupt_cache_entries_are_warned_about_and_re_requested(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    run = ["--gsm8k-limit=12", "--gsm8k-cache-dir=cache"]
    gsm8k_run(*run, report=None)
    files = entries(pytester.path / "cache")
    assert len(files) == 12
    files[0].write_bytes(files[0].read_bytes()[:50])  # truncated
    files[1].write_text("not json at all")
    files[2].write_text(json.dumps({"v": 1, "response": {"completions": "nope"}}))
    server.reset()
    result, _ = gsm8k_run(*run, "--gsm8k-resume", "--gsm8k-report=r.json", report=None)
    assert sent(server) == 3
    text = output(result)
    assert text.count("gsm8k cache: corrupt entry") == 3, text
    report = read_report(pytester.path / "r.json")
    assert report["counts"]["correct"] == 12
    assert report["from_cache"] == 9
    result.stdout.fnmatch_lines(["*answers from cache: 9 of 12*"])
    server.reset()
    gsm8k_run(*run, "--gsm8k-resume", report=None)
    assert sent(server) == 0  # repaired


def test_cache_never_holds_the_api_key(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun, keyed_env: str
) -> None:
    gsm8k_run("--gsm8k-limit=10", "--gsm8k-cache-dir=cache", report=None)
    files = [p for p in (pytester.path / "cache").rglob("*") if p.is_file()]
    assert len(entries(pytester.path / "cache")) == 10
    for path in files:
        raw = path.read_bytes()
        assert keyed_env.encode() not in raw, path
        assert b"Bearer" not in raw, path


def test_another_protocol_or_model_never_hits_the_entries(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    gsm8k_data: Path,
) -> None:
    run = [*gsm8k_args, "--gsm8k-limit=10", "--gsm8k-cache-dir=cache", "--gsm8k-resume"]
    assert pytester.runpytest(*run).ret == 0
    assert sent(server) == 10
    for change in ("--gsm8k-max-tokens=512", "--gsm8k-system=Be brief."):
        server.reset()
        assert pytester.runpytest(*run, change).ret == 0
        assert sent(server) == 10, change
    server.reset()
    assert pytester.runpytest(*run).ret == 0
    assert sent(server) == 0  # the original still hits

    other = FakeOpenAIServer(gsm8k_data / "test.jsonl", model="other-model", api_key=keyed_env)
    other.start()
    try:
        moved = [a for a in run if not a.startswith(("--gsm8k-model", "--gsm8k-base-url"))]
        result = pytester.runpytest(
            *moved, "--gsm8k-model=other-model", f"--gsm8k-base-url={other.base_url}"
        )
        assert result.ret == 0, output(result)
        assert sent(other) == 10
    finally:
        other.stop()


# -- user callables ---------------------------------------------------------------------

CALLABLE_CONFTEST = """
import asyncio, json, threading, time
from pathlib import Path
import pytest

state = {"now": 0, "peak": 0, "calls": 0}
lock = threading.Lock()

def enter():
    with lock:
        state["now"] += 1
        state["calls"] += 1
        state["peak"] = max(state["peak"], state["now"])

def leave():
    with lock:
        state["now"] -= 1

def sync_model(request):
    enter()
    time.sleep(0.2)
    leave()
    return "The answer is 0.\\n#### 0"

async def async_model(request):
    enter()
    await asyncio.sleep(0.2)
    leave()
    return ["#### 0"]

@pytest.fixture(scope="session")
def gsm8k_model():
    yield {KIND}_model
    Path("calls.json").write_text(json.dumps(state))
"""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_user_callables_are_prefetched_concurrently(
    pytester: pytest.Pytester, gsm8k_data: Path, kind: str
) -> None:
    pytester.makeconftest(CALLABLE_CONFTEST.replace("{KIND}", kind))
    pytester.makepyfile(test_mine="def test_mine(gsm8k_outcome):\n    assert gsm8k_outcome\n")
    result = pytester.runpytest(
        f"--gsm8k-data={gsm8k_data}",
        *NO_EXTRA_PLUGINS,
        "--gsm8k-limit=40",
        "--gsm8k-concurrency=20",
        "--gsm8k-report=r.json",
    )
    assert result.ret == 0, output(result)
    state = json.loads((pytester.path / "calls.json").read_text())
    assert state["calls"] == 40
    assert state["peak"] == 20
    assert read_report(pytester.path / "r.json")["n"] == 40


XDIST_CALLABLE_CONFTEST = """
import os, time
import pytest

def model(request):
    with open(os.environ["CALLS_FILE"], "a") as fh:  # O_APPEND: whole lines, any process
        fh.write(request.problem_id + "\\n")
    time.sleep(0.05)
    return "#### 0"

@pytest.fixture(scope="session")
def gsm8k_model():
    return model
"""


def test_xdist_workers_share_a_user_callable_without_calling_it_twice(
    pytester: pytest.Pytester, gsm8k_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = pytester.path / "calls.txt"
    monkeypatch.setenv("CALLS_FILE", str(calls))
    pytester.makeconftest(XDIST_CALLABLE_CONFTEST)
    pytester.makepyfile(test_mine="def test_mine(gsm8k_outcome):\n    assert gsm8k_outcome\n")
    result = pytester.runpytest(
        "-n",
        "2",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-limit=40",
        "--gsm8k-concurrency=8",
        *NO_EXTRA_PLUGINS,
        "--gsm8k-report=r.json",
    )
    assert result.ret == 0, output(result)
    ids = calls.read_text().split()
    assert len(ids) == 40
    assert len(set(ids)) == 40  # each problem asked once, across workers
    assert read_report(pytester.path / "r.json")["n"] == 40


REJECTED_CONFTEST = """
import itertools
import pytest

class Request:  # an HTTP SDK's request: its method and URL
    method, url = "POST", "https://api.example.com/v1/messages"

class AuthenticationError(Exception):  # as anthropic's: a status, its request, the body
    status_code, request = 401, Request()
    body = {"type": "error", "error": {"message": "invalid x-api-key"}}

class KeyRejected(Exception):  # a status and nothing else
    status_code = 401

calls = itertools.count()

def model(request):
    if next(calls) < 3:
        return "#### 0"
    raise {ERROR}("invalid x-api-key")

@pytest.fixture(scope="session")
def gsm8k_model():
    return model
"""


@pytest.mark.parametrize(
    ("error", "xdist"),
    [("AuthenticationError", []), ("AuthenticationError", ["-n", "2"]), ("KeyRejected", [])],
    ids=["http-shaped", "http-shaped-xdist", "status-only"],
)
def test_a_users_function_whose_key_is_rejected_ends_the_run_with_its_own_words(
    pytester: pytest.Pytester, gsm8k_data: Path, error: str, xdist: list[str]
) -> None:
    """A 401 from a user's function ends the run at once, after answers too, whatever the
    exception's shape (the status is the claim: no later request gets through); it is said
    with the status and the server's message, never with the plugin's own client's advice
    (the API key variable, --gsm8k-* options), which that function does not read."""
    pytester.makeconftest(REJECTED_CONFTEST.replace("{ERROR}", error))
    pytester.makepyfile(test_mine="def test_mine(gsm8k_outcome):\n    assert gsm8k_outcome\n")
    common = (f"--gsm8k-data={gsm8k_data}", *NO_EXTRA_PLUGINS, "--gsm8k-concurrency=1")
    result = pytester.runpytest(*common, "--gsm8k-limit=20", "--gsm8k-report=r.json", *xdist)
    text = output(result)
    assert result.ret == 1, text
    rep = read_report(pytester.path / "r.json")
    said = {p["error"] for p in rep["problems"] if p["outcome"] == "error"}
    line = "the endpoint rejected the credentials (HTTP 401): invalid x-api-key"
    assert said == {line if error == "AuthenticationError" else "KeyRejected: invalid x-api-key"}
    answered = 20 - rep["counts"]["error"]  # 3 answers a process (a worker may have fewer)
    assert answered == 3 or (xdist and 0 < answered <= 6), text
    for advice in ("API key variable", "OPENAI_API_KEY", "--gsm8k-api-key-env"):
        assert advice not in text, text


MISSING_CONFTEST = """
import itertools
import pytest

class Request:  # an HTTP SDK's request: its method and URL
    method, url = "POST", "https://records.example.com/v1/lookup"

class NotFoundError(Exception):  # as an HTTP SDK's: a status, its request, the body
    status_code, request, body = 404, Request(), {"message": "no such record"}

class RecordMissing(Exception):  # a status and nothing else
    status_code = 404

calls = itertools.count()

def model(request):
    if next(calls) == 3:  # one problem's record is missing
        raise {ERROR}("no such record")
    return "#### 0"

@pytest.fixture(scope="session")
def gsm8k_model():
    return model
"""


@pytest.mark.parametrize("error", ["NotFoundError", "RecordMissing"])
def test_a_users_function_whose_404_follows_answers_fails_only_its_item(
    pytester: pytest.Pytester, gsm8k_data: Path, error: str
) -> None:
    """A 404 from a gsm8k_model function, whatever its shape, is that problem's error once
    answers came: the function may look up something missing for one problem, and the
    plugin cannot tell (its own client's 404 is the URL's, for every request: fatal). Ten in
    a row would still stop the run (test_reliability's storm)."""
    pytester.makeconftest(MISSING_CONFTEST.replace("{ERROR}", error))
    pytester.makepyfile(test_mine="def test_mine(gsm8k_outcome):\n    assert gsm8k_outcome\n")
    common = (f"--gsm8k-data={gsm8k_data}", *NO_EXTRA_PLUGINS, "--gsm8k-concurrency=1")
    result = pytester.runpytest(*common, "--gsm8k-limit=10", "--gsm8k-report=r.json")
    text = output(result)
    assert result.ret == 1, text
    rep = read_report(pytester.path / "r.json")
    said = [p["error"] for p in rep["problems"] if p["outcome"] == "error"]
    shown = "POST https://records.example.com/v1/lookup answered 404: no such record"
    assert said == [shown if error == "NotFoundError" else "RecordMissing: no such record"], text
    assert "run stopped" not in text, text
    assert "--gsm8k-base-url" not in text, text
