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
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import XDIST, output, sent

from pytest_gsm8k.core.types import Completion, ModelResponse, Request
from pytest_gsm8k.runtime.answers import AnswerServer, Channel, RemoteAnswers
from pytest_gsm8k.runtime.cache import ResponseCache
from pytest_gsm8k.runtime.engine import EndpointAborted, EndpointError, Engine, NotRun

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
    # 20 items over 10 problems: in one process a session-scoped model answers each problem
    # once for both modules; a narrower one is called for each item, once (not once per
    # item per engine). Under xdist a user's model is asked per item, as xdist hands the
    # items out: at most once per item, so the two modules' items of a problem that land on
    # two workers may each ask it (the run's shared cache spares the second when it can).
    assert len(set(ids)) == 10, ids
    if scope == "session" and not xdist:
        assert all(ids.count(i) == 1 for i in ids), ids
    elif scope == "session":
        assert all(1 <= ids.count(i) <= 2 for i in ids), ids
    else:
        assert all(ids.count(i) == 2 for i in ids), ids
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


#: a scripted client, its engine, the answer server on it, its address, the known requests
Parts = tuple["Scripted", Engine, AnswerServer, tuple[str, int], dict[str, Request]]


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Parts]:
    client = Scripted(fail={"p3"})
    engine = Engine(client, ResponseCache(tmp_path / "c", "run", persistent=False), concurrency=4)
    known = _requests(8)
    server = AnswerServer(engine, known.get)
    address = server.start()
    yield client, engine, server, address, known
    server.close()
    engine.close()


def test_the_channel_prefetches_the_plan_and_answers_each_get(channel: Parts) -> None:
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


def test_a_wrong_token_gets_nothing(channel: Parts) -> None:
    client, engine, server, address, known = channel
    remote = RemoteAnswers(address, "not-the-token", endpoint="e", model="m", wait=10)
    try:
        # the controller hangs up: EOF, or a broken pipe if it did so before our write
        with pytest.raises(OSError, match="channel"):
            remote.offer(list(known))
        with pytest.raises(EndpointAborted, match="channel"):
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

    def end_the_controller() -> None:
        server.close()
        engine.close()

    try:
        closer = threading.Timer(0.2, end_the_controller)
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


def _eventually(condition: Callable[[], object], seconds: float = 5.0) -> bool:
    """Whether ``condition()`` holds within ``seconds`` (asked every 10 ms)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Gated(Scripted):
    """Answers p0 at once and every other problem once ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    async def complete(self, request: Request) -> ModelResponse:
        self.order.append(request.problem_id)
        if request.problem_id != "p0":
            await asyncio.to_thread(self.release.wait, 10)
        return ModelResponse(completions=[Completion(text=f"#### {request.problem_id[1:]}")])


def test_a_stop_reaches_every_worker_and_what_was_not_fetched_is_not_run(
    tmp_path: Path,
) -> None:
    """One call on the controller stops its engine and tells every worker: one that asks for
    answers, one that only listens (a worker calling its own model), one that was not
    probed before its next get, and one that connects after the stop."""
    client = Gated()
    engine = Engine(client, ResponseCache(tmp_path / "c", "run", persistent=False), concurrency=1)
    known = _requests(8)
    server = AnswerServer(engine, known.get)
    address = server.start()
    remote = RemoteAnswers(address, server.token, endpoint="e", model="m", wait=10)
    unprobed = RemoteAnswers(address, server.token, endpoint="e", model="m", wait=10)
    listener = Channel(address, server.token)
    late: Channel | None = None
    try:
        remote.offer(list(known))
        listener.offer(["p0", "p1"])
        assert _eventually(lambda: engine.ready(known["p0"]) and client.order == ["p0", "p1"])
        assert remote.stopped() is None and listener.stopped() is None
        server.stop_all("decided")
        assert _eventually(lambda: remote.stopped() == "decided")
        assert _eventually(lambda: listener.stopped() == "decided")
        server.stop_all("decided again")  # the first stop is the one every worker hears
        # answers the controller has still come; one never fetched is not run
        assert remote.result(known["p0"]).completions[0].text == "#### 0"
        with pytest.raises(NotRun, match="^decided$"):
            remote.result(known["p5"])
        # the stop frame waiting ahead of a reply is taken as the stop, not as the reply
        assert unprobed.result(known["p0"]).completions[0].text == "#### 0"
        assert unprobed.stopped() == "decided"
        late = Channel(address, server.token)
        late.offer(["p7"])  # the stop arrives first; the plan is still acknowledged
        assert late.stopped() == "decided"
        assert server.planned_ids() == {"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"}
        client.release.set()  # the request under way at the stop arrives and is delivered
        assert remote.result(known["p1"]).completions[0].text == "#### 1"
        assert listener.stopped() == "decided" and remote.stopped() == "decided"
    finally:
        client.release.set()
        for channel in (remote, unprobed, listener, late):
            if channel is not None:
                channel.close()
        server.close()
        engine.close()
    assert client.order == ["p0", "p1"]  # nothing was sent after the stop


def test_planned_ids_is_the_union_of_the_offers_and_only_an_answers_plan_is_fetched(
    channel: Parts,
) -> None:
    client, engine, server, address, known = channel
    first = Channel(address, server.token)
    second = Channel(address, server.token)
    remote = RemoteAnswers(address, server.token, endpoint="e", model="m", wait=10)
    try:
        assert server.planned_ids() is None  # nobody offered yet
        first.offer(["p0", "p1"])
        # recorded by the time the offer returns: a report sent after it finds it there
        assert server.planned_ids() == {"p0", "p1"}
        second.offer(["p1", "p2", "zz"])  # ids the controller does not know are plans too
        assert server.planned_ids() == {"p0", "p1", "p2", "zz"}
        assert engine.jobs == []  # a channel without answers has nothing fetched for it
        remote.offer(["p4", "p5"])
        assert server.planned_ids() == {"p0", "p1", "p2", "zz", "p4", "p5"}
        assert [job.request.problem_id for job in engine.jobs] == ["p4", "p5"]
        assert remote.result(known["p5"]).completions[0].text == "#### 5"
        copy = server.planned_ids()
        assert copy is not None
        copy.add("mine")  # a copy: the caller cannot change the controller's record
        assert "mine" not in (server.planned_ids() or set())
        assert first.stopped() is None and second.stopped() is None
    finally:
        for each in (first, second, remote):
            each.close()
    assert _eventually(lambda: sorted(client.order) == ["p4", "p5"])


def test_a_channel_with_a_wrong_token_hears_no_stop_and_records_no_plan(
    channel: Parts,
) -> None:
    client, engine, server, address, known = channel
    stranger = Channel(address, "not-the-token", wait=10)
    try:
        with pytest.raises(OSError, match="channel"):
            stranger.offer(["p0"])
        server.stop_all("decided")
        assert stranger.stopped() is None
        assert server.planned_ids() is None
    finally:
        stranger.close()
