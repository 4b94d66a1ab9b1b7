"""The answer channel between the xdist controller and its workers, on its own: the plan is
prefetched, each get answered, a wrong token gets nothing, a closed controller ends waits."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import wait_until

from pytest_gsm8k.core.types import Completion, ModelResponse, Request
from pytest_gsm8k.runtime.answers import AnswerServer, RemoteAnswers
from pytest_gsm8k.runtime.cache import ResponseCache
from pytest_gsm8k.runtime.engine import EndpointAborted, EndpointError, Engine


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
Channel = tuple[Scripted, Engine, AnswerServer, tuple[str, int], dict[str, Request]]


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Channel]:
    client = Scripted(fail={"p3"})
    engine = Engine(client, ResponseCache(tmp_path / "c", "run", persistent=False), concurrency=4)
    known = _requests(8)
    server = AnswerServer(engine, known.get)
    address = server.start()
    yield client, engine, server, address, known
    server.close()
    engine.close()


def test_the_channel_prefetches_the_plan_and_answers_each_get(channel: Channel) -> None:
    client, _engine, server, address, known = channel
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
    wait_until(lambda: len(client.order) >= 8, 5)
    assert sorted(client.order) == sorted(known)  # the whole plan, each once


def test_a_wrong_token_gets_nothing(channel: Channel) -> None:
    client, _engine, _server, address, known = channel
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
    cache = ResponseCache(tmp_path / "c", "run", persistent=False)
    engine = Engine(client, cache, concurrency=4, lookahead=3)
    known = _requests(20)
    server = AnswerServer(engine, known.get)
    remote = RemoteAnswers(server.start(), server.token, endpoint="e", model="m", wait=10)

    def settles_at(count: int) -> int:
        wait_until(lambda: len(client.order) >= count, 5)
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


def test_an_answer_over_the_channels_frame_is_that_items_error_and_the_next_is_its_own(
    tmp_path: Path,
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
    engine = Engine(Sized(), ResponseCache(tmp_path / "c", "run", persistent=False), concurrency=2)
    server = AnswerServer(engine, known.get, max_frame=2000)
    remote = RemoteAnswers(server.start(), server.token, endpoint="e", model="m", wait=1e300)
    try:
        remote.offer(list(known))
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
    replies += [b"", b"", _frame({"id": "p1", "response": answer, "cached": 0})]
    remote = RemoteAnswers(address, "t", endpoint="e", model="m", wait=10)
    try:
        remote.offer(["p0", "p1"])
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
    replies += [b"", b"", struct.pack(">I", 1 << 31)]
    remote = RemoteAnswers(address, "t", endpoint="e", model="m", wait=10)
    try:
        remote.offer(["p0"])
        with pytest.raises(EndpointAborted, match=r"over the .*-byte limit"):
            remote.result(Request(problem_id="p0", api="chat"))
    finally:
        remote.close()
