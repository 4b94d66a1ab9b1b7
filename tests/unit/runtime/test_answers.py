"""The answer channel between the xdist controller and its workers, on its own: the plan is
prefetched, each get answered, a wrong token gets nothing, a closed controller ends waits."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers import response_cache, wait_until

from pytest_gsm8k.core.types import Completion, ModelResponse, Request
from pytest_gsm8k.runtime import answers
from pytest_gsm8k.runtime.answers import AnswerServer, Channel
from pytest_gsm8k.runtime.engine import Engine
from pytest_gsm8k.runtime.failures import EndpointAborted, EndpointError, NotRun


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


#: the scripted client, its engine, the controller's answer server, its address, the plan
Parts = tuple[Scripted, Engine, AnswerServer, tuple[str, int], dict[str, Request]]


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Parts]:
    client = Scripted(fail={"p3"})
    engine = Engine(client, response_cache(tmp_path / "c", "run", persistent=False), concurrency=4)
    known = _requests(8)
    server = AnswerServer(engine, known.get, repeats=1)
    server.start()
    address = server.address
    yield client, engine, server, address, known
    server.close()
    engine.close()


def test_the_channel_prefetches_the_plan_and_answers_each_get(channel: Parts) -> None:
    client, _engine, server, address, known = channel
    remote = Channel(address, server.token, wait=10, endpoint="", model="")
    try:
        remote.offer(list(known), fetch=True)
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
    wait_until(lambda: len(client.order) >= 8, 5)
    assert sorted(client.order) == sorted(known)  # the whole plan, each once


def test_a_wrong_token_gets_nothing(channel: Parts) -> None:
    client, _engine, _server, address, known = channel
    remote = Channel(address, "not-the-token", wait=10, endpoint="", model="")
    try:
        # the controller hangs up: EOF, or a broken pipe if it did so before our write
        with pytest.raises(OSError, match="channel"):
            remote.offer(list(known), fetch=True)
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

    engine = Engine(Never(), response_cache(tmp_path / "c", "run", persistent=False), concurrency=1)
    known = _requests(1)
    server = AnswerServer(engine, known.get, repeats=1)
    server.start()
    remote = Channel(server.address, server.token, wait=600, endpoint="", model="")
    try:

        def close_both() -> None:
            server.close()
            engine.close()

        closer = threading.Timer(0.2, close_both)
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
    cache = response_cache(tmp_path / "c", "run", persistent=False)
    engine = Engine(client, cache, concurrency=4, lookahead=3)
    known = _requests(20)
    server = AnswerServer(engine, known.get, repeats=1)
    server.start()
    remote = Channel(server.address, server.token, wait=10, endpoint="", model="")

    def settles_at(count: int) -> int:
        wait_until(lambda: len(client.order) >= count, 5)
        time.sleep(0.3)  # room for anything fetched beyond it
        return len(client.order)

    try:
        remote.offer(list(known), fetch=True)
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


def test_an_answer_over_the_channels_frame_is_that_items_error_and_the_next_is_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The controller never sends a frame longer than it may: such an answer becomes that
    item's error, and the channel stays in step for the next problem."""

    class Sized:
        endpoint, model, persistent_cache = "sized", "m", False

        async def complete(self, request: Request) -> ModelResponse:
            size = 5000 if request.problem_id == "p1" else 10
            return ModelResponse([Completion(text="x" * size + f"#### {request.problem_id}")])

        async def aclose(self) -> None:
            pass

    known = {f"p{i}": Request(problem_id=f"p{i}", api="chat") for i in range(3)}
    engine = Engine(Sized(), response_cache(tmp_path / "c", "run", persistent=False), concurrency=2)
    monkeypatch.setattr(answers, "MAX_FRAME", 2000)
    server = AnswerServer(engine, known.get, repeats=1)
    server.start()
    remote = Channel(server.address, server.token, wait=1e300, endpoint="", model="")
    try:
        remote.offer(list(known), fetch=True)
        assert remote.result(known["p0"]).completions[0].text.endswith("#### p0")
        with pytest.raises(EndpointError, match="more than the xdist answer channel carries"):
            remote.result(known["p1"])
        assert remote.result(known["p2"]).completions[0].text.endswith("#### p2")
    finally:
        remote.close()
        server.close()
        engine.close()


@pytest.fixture
def scripted_controller() -> Iterator[tuple[tuple[str, int], list[bytes]]]:
    """A loopback socket that answers each frame it reads with the next of ``replies``
    (raw bytes, framing included), then waits: a controller gone wrong."""
    replies: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn, conn.makefile("rb") as stream:
            while head := stream.read(4):
                stream.read(struct.unpack(">I", head)[0])
                if replies:
                    conn.sendall(replies.pop(0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield listener.getsockname()[:2], replies
    listener.close()
    thread.join(timeout=5)


def _frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return struct.pack(">I", len(body)) + body


def test_a_reply_for_another_problem_breaks_the_channel_for_good(
    scripted_controller: tuple[tuple[str, int], list[bytes]],
) -> None:
    address, replies = scripted_controller
    answer: dict[str, Any] = {"completions": [{"text": "#### 1"}], "usage": {}, "model": None}
    replies += [b"", _frame({"planned": 2}), _frame({"id": "p1", "response": answer, "cached": 0})]
    remote = Channel(address, "t", wait=10, endpoint="", model="")
    try:
        remote.offer(["p0", "p1"], fetch=True)
        with pytest.raises(EndpointAborted, match="a reply for 'p1' where 'p0' was asked for"):
            remote.result(Request(problem_id="p0", api="chat"))
        # what follows on the stream cannot be trusted: nothing more is read from it
        with pytest.raises(EndpointAborted, match="a reply for 'p1'"):
            remote.result(Request(problem_id="p1", api="chat"))
    finally:
        remote.close()


def test_a_frame_longer_than_the_channel_carries_is_never_read(
    scripted_controller: tuple[tuple[str, int], list[bytes]],
) -> None:
    address, replies = scripted_controller
    replies += [b"", _frame({"planned": 1}), struct.pack(">I", 1 << 31)]
    remote = Channel(address, "t", wait=10, endpoint="", model="")
    try:
        remote.offer(["p0"], fetch=True)
        with pytest.raises(EndpointAborted, match=r"over the .*-byte limit"):
            remote.result(Request(problem_id="p0", api="chat"))
    finally:
        remote.close()


def test_a_plan_the_controller_does_not_acknowledge_fails_the_offer(
    scripted_controller: tuple[tuple[str, int], list[bytes]],
) -> None:
    """The offer returns only once the controller recorded the plan: a reply that is not the
    acknowledgement is a failed channel (an OSError, as a refused connection is)."""
    address, replies = scripted_controller
    replies += [b"", _frame({"id": "p0", "not_run": "decided"})]
    channel = Channel(address, "t", wait=10, endpoint="", model="")
    try:
        with pytest.raises(OSError, match="does not acknowledge"):
            channel.offer(["p0"])
        with pytest.raises(OSError, match="does not acknowledge"):
            channel.offer(["p0"])  # broken for good: nothing more is read
        assert channel.stopped() is None
    finally:
        channel.close()


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
    engine = Engine(client, response_cache(tmp_path / "c", "run", persistent=False), concurrency=1)
    known = _requests(8)
    server = AnswerServer(engine, known.get, repeats=1)
    server.start()
    address = server.address
    remote = Channel(address, server.token, wait=10, endpoint="", model="")
    unprobed = Channel(address, server.token, wait=10, endpoint="", model="")
    listener = Channel(address, server.token, wait=60, endpoint="", model="")
    late: Channel | None = None
    try:
        remote.offer(list(known), fetch=True)
        listener.offer(["p0", "p1"])
        assert wait_until(lambda: engine.ready(known["p0"]) and client.order == ["p0", "p1"], 5)
        assert remote.stopped() is None
        assert listener.stopped() is None
        engine.stop("decided")  # the engines first, as Sources.stop does
        server.stop_all("decided")
        assert wait_until(lambda: remote.stopped() == "decided", 5)
        assert wait_until(lambda: listener.stopped() == "decided", 5)
        server.stop_all("decided again")  # the first stop is the one every worker hears
        # answers the controller has still come; one never fetched is not run
        assert remote.result(known["p0"]).completions[0].text == "#### 0"
        with pytest.raises(NotRun, match=r"^decided$"):
            remote.result(known["p5"])
        # the stop frame waiting ahead of a reply is taken as the stop, not as the reply
        assert unprobed.result(known["p0"]).completions[0].text == "#### 0"
        assert unprobed.stopped() == "decided"
        late = Channel(address, server.token, wait=60, endpoint="", model="")
        late.offer(["p7"])  # the stop arrives first; the plan is still acknowledged
        assert late.stopped() == "decided"
        assert server.planned_ids() == {"p0", "p1", "p2", "p3", "p4", "p5", "p6", "p7"}
        client.release.set()  # the request under way at the stop arrives and is delivered
        assert remote.result(known["p1"]).completions[0].text == "#### 1"
        assert listener.stopped() == "decided"
        assert remote.stopped() == "decided"
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
    first = Channel(address, server.token, wait=60, endpoint="", model="")
    second = Channel(address, server.token, wait=60, endpoint="", model="")
    remote = Channel(address, server.token, wait=10, endpoint="", model="")
    try:
        assert server.planned_ids() is None  # nobody offered yet
        first.offer(["p0", "p1"])
        # recorded by the time the offer returns: a report sent after it finds it there
        assert server.planned_ids() == {"p0", "p1"}
        second.offer(["p1", "p2", "zz"])  # ids the controller does not know are plans too
        assert server.planned_ids() == {"p0", "p1", "p2", "zz"}
        assert not engine.by_request  # a channel without answers has nothing fetched for it
        remote.offer(["p4", "p5"], fetch=True)
        assert server.planned_ids() == {"p0", "p1", "p2", "zz", "p4", "p5"}
        assert [job.request.problem_id for job in engine.by_request.values()] == ["p4", "p5"]
        assert remote.result(known["p5"]).completions[0].text == "#### 5"
        copy = server.planned_ids()
        assert copy is not None
        copy.add("mine")  # a copy: the caller cannot change the controller's record
        assert "mine" not in (server.planned_ids() or set())
        assert first.stopped() is None
        assert second.stopped() is None
    finally:
        for each in (first, second, remote):
            each.close()
    assert wait_until(lambda: sorted(client.order) == ["p4", "p5"], 5)


def test_a_channel_with_a_wrong_token_hears_no_stop_and_records_no_plan(
    channel: Parts,
) -> None:
    _client, _engine, server, address, _known = channel
    stranger = Channel(address, "not-the-token", wait=10, endpoint="", model="")
    try:
        with pytest.raises(OSError, match="channel"):
            stranger.offer(["p0"])
        server.stop_all("decided")
        assert stranger.stopped() is None
        assert server.planned_ids() is None
    finally:
        stranger.close()


def test_each_repeat_is_its_own_ask_on_the_channel(tmp_path: Path) -> None:
    """--gsm8k-repeats 3: a worker's plan makes the controller fetch every repeat; each get
    names its repeat and the reply names it back; a repeat the run does not have is refused."""

    class Counting(Scripted):
        async def complete(self, request: Request) -> ModelResponse:
            self.order.append(f"{request.problem_id}#{request.repeat}")
            return ModelResponse(completions=[Completion(text=f"#### {request.repeat}")])

    client = Counting()
    engine = Engine(client, response_cache(tmp_path / "c", "run", persistent=False), concurrency=4)
    known = _requests(2)
    server = AnswerServer(engine, known.get, repeats=3)
    server.start()
    remote = Channel(server.address, server.token, wait=10, endpoint="", model="")
    try:
        remote.offer(list(known), fetch=True)
        for ask in known["p1"].asks(3):
            assert remote.result(ask).completions[0].text == f"#### {ask.repeat}"
        with pytest.raises(EndpointError, match="asks each problem 3 times: no repeat 3"):
            remote.result(replace(known["p0"], repeat=3))
    finally:
        remote.close()
        server.close()
        engine.close()
    assert sorted(client.order) == sorted(f"p{i}#{r}" for i in range(2) for r in range(3))


def test_a_head_start_fetches_at_most_its_limit_in_order_and_an_offer_adds_the_rest(
    tmp_path: Path,
) -> None:
    """The controller's guess before any plan: the first ``limit`` asks (repeats counted),
    in the order given; the worker's offer then adds what is left, nothing twice."""

    class Counting(Scripted):
        async def complete(self, request: Request) -> ModelResponse:
            self.order.append(f"{request.problem_id}#{request.repeat}")
            return ModelResponse(completions=[Completion(text="#### 1")])

    client = Counting()
    engine = Engine(client, response_cache(tmp_path / "c", "run", persistent=False), concurrency=1)
    known = _requests(4)
    server = AnswerServer(engine, known.get, repeats=2)
    server.start()
    address = server.address
    remote = Channel(address, server.token, wait=10, endpoint="", model="")
    try:
        server.head_start(["p2", "p0", "p1", "p3"], 3)
        assert len(engine.by_request) == 3  # the first three asks, planned
        assert wait_until(lambda: len(client.order) == 3, 5)
        time.sleep(0.05)  # anything beyond the limit would be sent by now
        assert client.order == ["p2#0", "p2#1", "p0#0"]
        assert server.planned_ids() is None  # a guess is not a worker's plan
        remote.offer(list(known), fetch=True)
        for ask in known["p3"].asks(2):
            assert remote.result(ask).completions[0].text == "#### 1"
        assert wait_until(lambda: len(client.order) == 8, 5)
    finally:
        remote.close()
        server.close()
        engine.close()
    assert sorted(client.order) == sorted(f"p{i}#{r}" for i in range(4) for r in range(2))
    server.head_start(["zz"], 5)  # a problem the run does not know: nothing
    assert len(engine.by_request) == 8


def test_a_guessed_requests_failure_is_its_own_and_an_early_stop_gets_no_head_start(
    tmp_path: Path,
) -> None:
    """A 400 on a guessed request (one a conftest may have deselected because it fails)
    aborts nothing; the same 400 on a planned first request still ends the run. Under an
    early stop's lookahead the head start sends nothing."""
    from pytest_gsm8k.runtime.failures import WireFailure

    class Refusing(Scripted):
        async def complete(self, request: Request) -> ModelResponse:
            self.order.append(request.problem_id)
            if request.problem_id in self.fail:
                raise WireFailure("u", 400, {"error": {"message": "too long"}}, {})
            return ModelResponse(completions=[Completion(text="#### 1")])

    known = _requests(4)
    client = Refusing(fail={"p0"})
    engine = Engine(client, response_cache(tmp_path / "c", "run", persistent=False), concurrency=1)
    server = AnswerServer(engine, known.get, repeats=1)
    server.start()
    remote = Channel(server.address, server.token, wait=10, endpoint="", model="")
    try:
        server.head_start(["p0"], 1)
        assert len(engine.by_request) == 1
        assert wait_until(lambda: client.order == ["p0"], 5)
        time.sleep(0.05)
        assert engine.aborted is None
        remote.offer(["p1", "p2"], fetch=True)
        assert remote.result(known["p2"]).completions[0].text == "#### 1"
    finally:
        remote.close()
        server.close()
        engine.close()

    planned = Refusing(fail={"p0"})
    engine = Engine(planned, response_cache(tmp_path / "d", "run", persistent=False), concurrency=1)
    try:
        engine.start([known["p0"], known["p1"]])
        assert wait_until(lambda: engine.aborted is not None, 5)
        assert "refused the first requests" in str(engine.aborted)
    finally:
        engine.close()

    # a guess the plan then takes fails as a planned request would: the run ends
    adopted = Refusing(fail={"p0"})
    engine = Engine(adopted, response_cache(tmp_path / "f", "run", persistent=False), concurrency=1)
    try:
        engine.start([known["p0"]], guess=True)
        assert wait_until(lambda: adopted.order == ["p0"], 5)
        time.sleep(0.05)
        assert engine.aborted is None
        engine.start([known["p0"], known["p1"]])
        assert wait_until(lambda: engine.aborted is not None, 5)
        assert "refused the first requests" in str(engine.aborted)
        assert adopted.order == ["p0"]  # nothing more was sent
    finally:
        engine.close()

    ahead = Scripted()
    engine = Engine(
        ahead, response_cache(tmp_path / "e", "run", persistent=False), concurrency=2, lookahead=2
    )
    server = AnswerServer(engine, known.get, repeats=1)
    server.start()
    try:
        server.head_start(list(known), 8)
        assert engine.by_request == {}
        time.sleep(0.05)
        assert ahead.order == []
    finally:
        server.close()
        engine.close()


def test_a_stop_frame_half_sent_is_not_waited_for(
    scripted_controller: tuple[tuple[str, int], list[bytes]],
) -> None:
    """The worker asks ``stopped()`` before every item and must never wait there: a frame
    whose first bytes arrived is kept until the rest comes, however long ``wait`` is."""
    address, replies = scripted_controller
    stop = _frame({"stop": "decided"})
    replies += [stop[:3], stop[3:] + _frame({"planned": 1})]
    channel = Channel(address, "t", wait=30, endpoint="", model="")
    try:
        time.sleep(0.3)  # the first 3 bytes arrive
        started = time.monotonic()
        assert channel.stopped() is None
        assert time.monotonic() - started < 1
        channel.offer(["p0"])  # the rest of the stop frame, then the acknowledgement
        assert channel.stopped() == "decided"
    finally:
        channel.close()


def test_a_frame_is_taken_only_whole_at_any_split_and_a_stream_cut_mid_frame_is_no_pause() -> None:
    """Both ends read with take_frame: frames cut at every byte, and several in one read, come
    out whole and in order, none early. A worker's ``stopped()`` tells "nothing yet" (no wait,
    the channel still usable) from a controller gone mid-frame (broken for good)."""
    from pytest_gsm8k.runtime.answers import MAX_FRAME, frame, take_frame

    sent: list[dict[str, Any]] = [
        {"stop": "x"},
        {"planned": 2},
        {"id": "p1", "response": {"t": "\u00e9\ud83d"}},
    ]
    data = b"".join(frame(m) for m in sent)
    ends = list(itertools.accumulate(len(frame(m)) for m in sent))
    for cut in range(len(data) + 1):
        buffer, taken = bytearray(), []
        for at, part in ((cut, data[:cut]), (len(data), data[cut:])):
            buffer += part
            while (message := take_frame(buffer, MAX_FRAME)) is not None:
                taken.append(message)
            assert len(taken) == sum(end <= at for end in ends)  # all arrived, none early
        assert (taken, buffer) == (sent, bytearray())
    listener = socket.create_server(("127.0.0.1", 0))
    channel = Channel(listener.getsockname()[:2], "t", wait=30, endpoint="", model="")
    try:
        conn, _ = listener.accept()
        assert conn.recv(1 << 10)  # the token (unread, the close would be a reset)
        assert channel.stopped() is None  # nothing yet
        conn.sendall(data[:5])
        time.sleep(0.2)
        assert channel.stopped() is None  # half a frame: no wait
        conn.close()
        time.sleep(0.2)
        assert channel.stopped() is None
        with pytest.raises(OSError, match="a frame cut short"):
            channel.offer(["p0"])
    finally:
        channel.close()
        listener.close()


@pytest.mark.parametrize(
    ("deep", "said"),
    [
        # cut short: 3.11's and 3.12's json.loads recursed before it saw the end (3.13's
        # reaches the end: a JSON error, a ValueError as well)
        (b"[" * 1000, None),
        (b"[" * 500 + b"]" * 500, "nested deeper"),  # whole: refused by its depth
    ],
)
def test_a_frame_nested_thousands_deep_is_refused_not_a_recursion_error(
    deep: bytes, said: str | None
) -> None:
    """A local process can send a first frame under the hello's 1 KiB limit nested 1,000
    deep: ``json.loads`` raised RecursionError, which the controller's handler did not catch
    (a traceback printed). It is a frame not to trust, like any other bad frame."""
    from pytest_gsm8k.runtime.answers import MAX_HELLO, take_frame

    buffer = bytearray(struct.pack(">I", len(deep)) + deep)
    with pytest.raises(ValueError, match=said):
        take_frame(buffer, MAX_HELLO)
