"""xdist without surprises: the controller's one engine, one call per item, nothing left.

The plugin's own client under ``-n``: the controller fetches for every worker
through :mod:`pytest_gsm8k.runtime.answers`; the workers never import an HTTP
client. A user's model is called exactly once per item and sample whatever
its fixture scope. Killing the controller leaves no process behind. Every
run is the real plugin against the loopback fake server; the evidence is the
server's (or the user's callable's) own count.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import XDIST, output, sent

from pytest_gsm8k.core.types import Completion, ModelResponse, Request
from pytest_gsm8k.runtime.answers import AnswerServer, RemoteAnswers
from pytest_gsm8k.runtime.cache import ResponseCache
from pytest_gsm8k.runtime.engine import EndpointAborted, EndpointError, Engine

SCOPED_CONFTEST = """
import os
import pytest

def model(request):
    with open(os.environ["CALLS_FILE"], "a") as fh:  # O_APPEND: whole lines, any process
        fh.write(request.problem_id + "\\n")
    return "#### 0"

@pytest.fixture(scope="{SCOPE}")
def gsm8k_model():
    return lambda request: model(request)  # a new object per fixture instance
"""


@XDIST
@pytest.mark.parametrize("scope", ["function", "module", "session"])
def test_a_model_of_any_scope_is_called_once_per_item(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, scope: str, xdist: list[str]
) -> None:
    calls = pytester.path / "calls.txt"
    monkeypatch.setenv("CALLS_FILE", str(calls))
    pytester.makeconftest(SCOPED_CONFTEST.replace("{SCOPE}", scope))
    test = "def test_mine(gsm8k_outcome):\n    assert gsm8k_outcome\n"
    pytester.makepyfile(test_a=test, test_b=test)  # two modules: module scope makes two models
    result = pytester.runpytest(
        *xdist,
        "--gsm8k-limit=10",
        "--gsm8k-concurrency=4",
        "-p",
        "no:hypothesispytest",
        "-W",
        "default",
    )
    assert result.ret == 0, output(result)
    ids = calls.read_text().split()
    # 20 items over 10 problems: a session-scoped model answers each problem once for both
    # modules; a narrower one is called for each item, once (not once per item per engine)
    per_problem = 1 if scope == "session" else 2
    assert len(set(ids)) == 10 and all(ids.count(i) == per_problem for i in ids), ids
    said = "not session-scoped" in output(result)
    assert said == (scope != "session"), output(result)


WORKER_PROBE = """
import json, os, sys

def pytest_sessionfinish(session):
    workerinput = getattr(session.config, "workerinput", None)
    if workerinput is not None:
        with open(os.path.join(os.environ["PROBE_DIR"], workerinput["workerid"]), "w") as fh:
            json.dump({"openai": "openai" in sys.modules,
                       "httpx": any(m in sys.modules for m in ("httpx", "httpx2"))}, fh)
"""


def test_under_xdist_the_controller_fetches_and_workers_import_no_http_client(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    probe = pytester.path / "probe"
    probe.mkdir()
    monkeypatch.setenv("PROBE_DIR", str(probe))
    pytester.makeconftest(WORKER_PROBE)
    server.set_script(Script(latency=0.02))
    result = pytester.runpytest(
        *gsm8k_args, "-n", "2", "--gsm8k-limit=40", "--gsm8k-no-cache", "-p", "no:hypothesispytest"
    )
    assert result.ret == 0, output(result)
    assert sent(server) == 40 and set(server.stats()["requests_by_index"].values()) == {1}
    seen = [json.loads(p.read_text()) for p in probe.iterdir()]
    assert len(seen) == 2 and all(not s["openai"] and not s["httpx"] for s in seen), seen


def _session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid`` (Linux /proc)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:  # state, ..., session id
            alive.append(int(entry.name))
    return alive


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_sigkill_of_the_xdist_controller_leaves_no_process_and_a_rerun_sends_the_rest(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    server.set_script(Script(latency=0.05))
    cache = pytester.path / "cache"
    run = [
        *gsm8k_args,
        "-n",
        "2",
        "--gsm8k-limit=120",
        "--gsm8k-concurrency=4",
        f"--gsm8k-cache-dir={cache}",
        "-p",
        "no:hypothesispytest",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *run],
        cwd=pytester.path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(list(cache.glob("responses/*/*.json"))) < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)  # the controller alone, as the OOM killer would
        proc.wait()
        deadline = time.monotonic() + 10
        while _session_processes(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = _session_processes(proc.pid)
    finally:
        for pid in _session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived the controller by 10 s: {left}"
    time.sleep(0.3)  # answers in flight at the kill may still land on the server
    kept = len(list(cache.glob("responses/*/*.json")))
    assert 20 <= kept < 120
    server.reset()
    result = pytester.runpytest(*run, "--gsm8k-report=r.json")
    assert result.ret == 0, output(result)
    assert sent(server) == 120 - kept
    assert set(server.stats()["requests_by_index"].values()) == {1}


# -- the answer channel on its own --------------------------------------------------------


class Scripted:
    endpoint = "scripted:"
    model = "scripted"
    persistent_cache = False

    def __init__(self, fail: set[str] | None = None) -> None:
        self.fail = fail or set()
        self.order: list[str] = []

    async def complete(self, request: Request) -> ModelResponse:
        self.order.append(request.problem_id)
        await asyncio.sleep(0.01)
        if request.problem_id in self.fail:
            raise RuntimeError("scripted failure")
        return ModelResponse(completions=[Completion(text=f"#### {request.problem_id[1:]}")])

    async def aclose(self) -> None:
        pass


def _requests(n: int) -> dict[str, Request]:
    return {
        f"p{i}": Request(problem_id=f"p{i}", api="chat", messages=(("user", f"q{i}"),))
        for i in range(n)
    }


@pytest.fixture
def channel(tmp_path: Path):  # type: ignore[no-untyped-def]
    client = Scripted(fail={"p3"})
    engine = Engine(client, ResponseCache(tmp_path / "c", "run", persistent=False), concurrency=4)
    known = _requests(8)
    server = AnswerServer(engine, known.get)
    address = server.start()
    yield client, engine, server, address, known
    server.close()
    engine.close()


def test_the_channel_prefetches_the_plan_and_answers_each_get(channel) -> None:  # type: ignore[no-untyped-def]
    client, engine, server, address, known = channel
    remote = RemoteAnswers(address, server.token, endpoint="e", model="m", wait=10)
    try:
        remote.offer(list(known))
        assert remote.result(known["p5"]).completions[0].text == "#### 5"
        with pytest.raises(EndpointError) as info:
            remote.result(known["p3"])
        assert "scripted failure" in str(info.value)
        assert not isinstance(info.value, EndpointAborted)
        unknown = Request(problem_id="zz", api="chat")
        with pytest.raises(EndpointError, match="knows no problem 'zz'"):
            remote.result(unknown)
        for pid in ("p0", "p7"):
            assert remote.result(known[pid]).completions[0].text == f"#### {pid[1:]}"
    finally:
        remote.close()
    deadline = time.monotonic() + 5
    while len(client.order) < 8 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(client.order) == sorted(known)  # the whole plan, each once


def test_a_wrong_token_gets_nothing(channel) -> None:  # type: ignore[no-untyped-def]
    client, engine, server, address, known = channel
    remote = RemoteAnswers(address, "not-the-token", endpoint="e", model="m", wait=10)
    try:
        remote.offer(list(known))
        # the controller hangs up: EOF, or a broken pipe if it did so before our write
        with pytest.raises(EndpointAborted, match="answer channel"):
            remote.result(known["p1"])
    finally:
        remote.close()
    assert client.order == []


def test_a_closed_controller_ends_the_wait_at_once(tmp_path: Path) -> None:
    class Never(Scripted):
        async def complete(self, request: Request) -> ModelResponse:
            await asyncio.sleep(3600)
            raise AssertionError

    engine = Engine(Never(), ResponseCache(tmp_path / "c", "run", persistent=False), concurrency=1)
    known = _requests(1)
    server = AnswerServer(engine, known.get)
    remote = RemoteAnswers(server.start(), server.token, endpoint="e", model="m", wait=600)
    try:
        closer = threading.Timer(0.2, lambda: (server.close(), engine.close()))
        closer.start()
        with pytest.raises(EndpointAborted):
            remote.result(known["p0"])
        closer.join()
    finally:
        remote.close()


def test_under_early_stop_an_answer_counts_as_ahead_until_its_report_arrives(
    tmp_path: Path,
) -> None:
    """The controller decides an early stop on the workers' reports, so an answer a worker
    took but has not reported yet still counts toward the lookahead: otherwise the engine
    keeps fetching past the decision by as many answers as are in transit."""
    client = Scripted()
    cache = ResponseCache(tmp_path / "c", "run", persistent=False)
    engine = Engine(client, cache, concurrency=4, lookahead=3)
    known = _requests(20)
    server = AnswerServer(engine, known.get)
    remote = RemoteAnswers(server.start(), server.token, endpoint="e", model="m", wait=10)

    def settles_at(count: int) -> int:
        deadline = time.monotonic() + 5
        while len(client.order) < count and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.3)  # room for anything fetched beyond it
        return len(client.order)

    try:
        remote.offer(list(known))
        assert settles_at(3) == 3  # the lookahead, nothing more
        for i in range(5):  # a worker takes five answers: three prefetched, two asked for
            assert remote.result(known[f"p{i}"]).completions[0].text == f"#### {i}"
        assert settles_at(5) == 5  # taken is not reported: no prefetch beyond them
        for i in range(5):
            server.settled(f"p{i}")
        assert settles_at(8) == 8  # five reported: three ahead again
        assert client.order == [f"p{i}" for i in range(8)]
    finally:
        remote.close()
        server.close()
        engine.close()
