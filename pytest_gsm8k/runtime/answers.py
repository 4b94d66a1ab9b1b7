"""xdist: the one channel between the controller, which alone talks to the model, and each
worker (loopback TCP): its plan, the answers, the early stop (docs/design.md, "Speed, the cache
and xdist"). Frames: a 4-byte big-endian length, then one JSON object, so the stream never
falls out of step whatever an answer holds; a frame over the reader's cap ends the connection.
Worker to controller: ``{"token": T}`` first (T reaches only this run's workers, through
``workerinput``), ``{"plan": [ids], "fetch": bool}`` and ``{"get": id, "repeat": i}`` (no
``repeat``: 0). Controller to worker: ``{"planned": n}``; per ``get`` one frame naming its problem
and repeat, with ``response`` and ``cached``, ``error``, ``aborted`` and ``said`` (another item
reported it in full), or ``not_run``; once, ``{"stop": why}``."""

from __future__ import annotations

import contextlib
import itertools
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from pytest_gsm8k.core import jsontext
from pytest_gsm8k.core.jsontext import to_json
from pytest_gsm8k.core.types import ModelResponse, Request
from pytest_gsm8k.runtime.client import MAX_REPLY_BYTES
from pytest_gsm8k.runtime.failures import EndpointAborted, EndpointError, NotRun, SaidElsewhere

if TYPE_CHECKING:  # asyncio: the answer server's (an xdist worker only follows a Channel)
    import asyncio

    from pytest_gsm8k.runtime.engine import Engine
    from pytest_gsm8k.runtime.matrix import Matrix

HEADER = struct.Struct(">I")  # a frame's length
#: the longest frame either side accepts: the largest answer the engine keeps, and its JSON
MAX_FRAME = MAX_REPLY_BYTES + (1 << 16)
#: the longest first frame (the token): a stray client makes the controller allocate no more
MAX_HELLO = 1 << 10
Message = dict[str, Any]


def frame(message: dict[str, Any]) -> bytes:
    """``message`` as one frame (UTF-8 JSON; a lone surrogate travels as its JSON escape)."""
    body = to_json(message).encode()
    return HEADER.pack(len(body)) + body


def take_frame(buffer: bytearray, limit: int) -> Message | None:
    """The first whole frame's message in ``buffer``, taken out of it; None while no whole
    frame has arrived. A ValueError for a frame over ``limit`` bytes or not a JSON object:
    the stream is not trusted past it."""
    if len(buffer) < HEADER.size:
        return None
    (size,) = HEADER.unpack_from(buffer)
    if size > limit:
        raise ValueError(f"a frame of {size:,} bytes, over the {limit:,}-byte limit")
    if len(buffer) < HEADER.size + size:
        return None
    message = jsontext.loads(bytes(buffer[HEADER.size : HEADER.size + size]))  # nesting capped
    del buffer[: HEADER.size + size]
    if not isinstance(message, dict):
        raise ValueError("a frame that is not a JSON object")
    return message


def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
    if not writer.is_closing():  # one frame in one write: frames never interleave
        writer.write(data)


class AnswerServer:
    """Controller side: every worker's connection. Serves ``engine``'s answers (or the
    --gsm8k-config matrix's), records the workers' plans and tells them of an early stop.
    ``requests`` maps a problem id to its request (None: an id this run does not know); with
    ``repeats`` K each problem is K requests, and each reply names the repeat it answers."""

    def __init__(
        self, engine: Engine | Matrix, requests: Callable[[str], Request | None], *, repeats: int
    ) -> None:
        self.engine, self.requests, self.repeats = engine, requests, repeats
        self.token = secrets.token_hex(16)
        self.address: tuple[str, int] = ("127.0.0.1", 0)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()  # these three: the loop's thread only
        self._writers: set[asyncio.StreamWriter] = set()  # the workers let in
        self._stop: str | None = None  # the message every worker hears
        self._lock = threading.Lock()  # these two
        self._planned: set[str] | None = None  # the union of the plans
        self._stopping = False

    def start(self) -> None:
        import asyncio

        listen = asyncio.start_server(self._serve, "127.0.0.1", 0)
        self._server = asyncio.run_coroutine_threadsafe(listen, self.engine.loop).result(10)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = (str(host), int(port))

    def close(self) -> None:
        """Stop listening and end every open connection (before the engine closes)."""
        import asyncio

        server, self._server = self._server, None
        if server is None:
            return

        async def shutdown() -> None:
            server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self.engine.loop).result(5)

    def head_start(self, problem_ids: list[str], limit: int) -> None:
        """Fetch the first ``limit`` requests of the controller's plan while the workers start
        (docs/design.md, "head start"). Answers go only to a worker's ``get``, so a guess
        changes no outcome; none under an early stop's lookahead."""
        asks = list(itertools.islice((r for p in problem_ids for r in self._asks(p)), limit))
        if asks and self.engine.lookahead is None:
            self.engine.start(asks, guess=True)

    def planned_ids(self) -> set[str] | None:
        """The problems the workers offered, all plans together; None until one offered. A
        worker's offer returns only once its plan is here, before any of its reports."""
        with self._lock:
            return None if self._planned is None else set(self._planned)

    def stop_all(self, message: str) -> None:
        """The run stopped early (any thread; the first call counts; its engines are stopped
        first: Sources.stop): every worker, connected now or later, hears ``message``."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True

        def push() -> None:
            self._stop = message
            for writer in list(self._writers):
                _write(writer, frame({"stop": message}))

        with contextlib.suppress(RuntimeError):  # the engine's loop is closed: nobody listens
            self.engine.loop.call_soon_threadsafe(push)

    def settled(self, problem_id: str) -> None:
        """The controller received the outcome for ``problem_id`` (see Engine.settle)."""
        if self.engine.lookahead is not None:
            for request in self._asks(problem_id):
                self.engine.settle(request)

    def _asks(self, problem_id: str) -> list[Request]:
        request = self.requests(problem_id)
        return [] if request is None else request.asks(self.repeats)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import asyncio

        if (task := asyncio.current_task()) is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        buffer = bytearray()

        async def read(limit: int) -> Message:
            while (message := take_frame(buffer, limit)) is None:
                if not (chunk := await reader.read(1 << 16)):
                    raise EOFError
                buffer.extend(chunk)
            return message

        try:
            hello = await read(MAX_HELLO)
            if hello.get("token") != self.token:
                return
            self._writers.add(writer)
            if self._stop is not None:
                _write(writer, frame({"stop": self._stop}))
            while True:
                message = await read(MAX_FRAME)
                if "plan" in message:
                    ids = [str(pid) for pid in message["plan"]]
                    with self._lock:
                        self._planned = (self._planned or set()) | set(ids)
                    if message.get("fetch") is True:
                        self.engine.start([r for pid in ids for r in self._asks(pid)])
                    _write(writer, frame({"planned": len(ids)}))
                elif "get" in message:
                    _write(writer, await self._reply(str(message["get"]), message.get("repeat", 0)))
                await writer.drain()
        except (ConnectionError, EOFError, ValueError, TypeError, asyncio.CancelledError):
            # a worker gone, a stray client, or the run ending (an answer or this handler
            # cancelled): quietly, or asyncio's stream callback prints a traceback
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _reply(self, problem_id: str, repeat: object) -> bytes:
        """The frame that answers ``get problem_id`` (its ``repeat``)."""
        head: dict[str, Any] = {"id": problem_id, **({"repeat": repeat} if repeat else {})}
        request = self.requests(problem_id)
        if request is None:
            error = f"the controller knows no problem {problem_id!r}"
        elif type(repeat) is not int or not 0 <= repeat < self.repeats:
            error = f"the controller asks each problem {self.repeats} times: no repeat {repeat!r}"
        else:
            try:
                # counted as used when the worker's report arrives (settled), not now
                response = await self.engine.answer(replace(request, repeat=repeat))
                data = frame({**head, "response": response.to_json(), "cached": response.cached})
            except EndpointError as exc:
                aborted, said = isinstance(exc, EndpointAborted), isinstance(exc, SaidElsewhere)
                data = frame({**head, "error": str(exc), "aborted": aborted, "said": said})
            except NotRun as exc:
                data = frame({**head, "not_run": str(exc)})
            if (size := len(data) - HEADER.size) <= MAX_FRAME:
                return data
            error = (
                f"the answer is {size:,} bytes as JSON, more than the xdist answer channel "
                f"carries ({MAX_FRAME:,})"
            )
        return frame({**head, "error": error, "aborted": False})


class Channel:
    """Worker side: it offers the worker's plan, hears the controller's stop and, with
    ``fetch``, brings the controller's answers one test at a time (the controller prefetches
    the plan; ``endpoint`` and ``model`` name whom they come from). Without ``fetch``: a worker
    that calls a model of its own. ``wait`` bounds each wait for the controller, ending only a
    wait that the controller engine's own bounds do not. Any failure breaks it for good: the
    next read could start inside a late reply, and a worker must never score one problem with
    another's answer."""

    def __init__(
        self, address: tuple[str, int], token: str, *, wait: float, endpoint: str, model: str
    ) -> None:
        # a socket takes no longer wait than the platform's time_t: longer waits are this one
        self.wait, self.fetch = min(wait, 1e7), False
        self.endpoint, self.model = endpoint, model
        self._sock = socket.create_connection(address, timeout=10.0)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = bytearray()  # what arrived of the frames not read yet
        self._broken: str | None = None  # why the channel cannot be read any more
        self._stop: str | None = None
        self._sock.sendall(frame({"token": token}))

    def offer(self, problem_ids: list[str], *, fetch: bool = False) -> None:
        """Tell the controller which problems this worker collected, in run order, and whether
        its engine prefetches them (``fetch``, from now on); returns once it recorded them, a
        ConnectionError when it did not within ``wait``."""
        self.fetch = fetch
        self._ask({"plan": problem_ids, "fetch": self.fetch}, "take the plan", _acknowledged)

    def stopped(self) -> str | None:
        """The controller's early-stop message once it has arrived, else None. Never waits,
        not even on a frame half arrived (cheap before every item)."""
        try:
            while self._stop is None and self._broken is None:
                if (message := self._read(None)) is None:
                    break
                if "stop" not in message:
                    raise ConnectionError("a frame nobody asked for")
        except (OSError, ValueError) as exc:
            self._broken = self._broken or f"the xdist controller's channel failed ({exc})"
        return self._stop

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()

    def _read(self, deadline: float | None) -> Message | None:
        """The next frame (a stop is also kept), waiting until ``deadline`` (TimeoutError);
        ``deadline`` None: only from what has arrived (None: no whole frame yet)."""
        while (message := take_frame(self._buffer, MAX_FRAME)) is None:
            left = 0.0 if deadline is None else max(deadline - time.monotonic(), 1e-6)
            self._sock.settimeout(left)  # past the deadline: still takes what has arrived
            try:
                chunk = self._sock.recv(1 << 20)
            except BlockingIOError:  # no deadline (a timeout of 0) and nothing arrived
                return None
            if not chunk:
                if not self._buffer:
                    self._broken = "the xdist controller closed its channel (it ended)"
                raise ConnectionError("a frame cut short")
            self._buffer += chunk
        if "stop" in message:
            self._stop = str(message["stop"])
        return message

    def _ask(self, message: Message, what: str, wrong: Callable[[Message], str | None]) -> Message:
        """Send ``message``; the next frame other than a stop, within ``wait``, in which
        ``wrong`` finds nothing wrong. A ConnectionError (the channel broken, now or before)
        says why not."""
        try:
            if self._broken is None:
                self._sock.settimeout(self.wait)
                self._sock.sendall(frame(message))
                deadline = time.monotonic() + self.wait
                while (reply := self._read(deadline)) is None or "stop" in reply:
                    pass
                if (why := wrong(reply)) is None:
                    return reply
                raise ConnectionError(why)
        except TimeoutError:
            self._broken = f"the xdist controller did not {what} within {self.wait:g} s"
        except (OSError, ValueError) as exc:
            self._broken = self._broken or f"the xdist controller's channel failed ({exc})"
        raise ConnectionError(self._broken)

    def result(self, request: Request) -> ModelResponse:
        """The controller's answer for ``request`` (an EndpointError if it failed; NotRun after
        an early stop for one it never asked for)."""
        pid, repeat = request.problem_id, request.repeat

        def wrong(reply: Message) -> str | None:
            got = (reply.get("id"), reply.get("repeat", 0))
            asked = f"{_which(pid, repeat)} was asked for"
            return None if got == (pid, repeat) else f"a reply for {_which(*got)} where {asked}"

        try:
            get = {"get": pid, **({"repeat": repeat} if repeat else {})}
            reply = self._ask(get, f"answer {pid}", wrong)
        except ConnectionError as exc:
            raise EndpointAborted(str(exc)) from None
        if "not_run" in reply:
            raise NotRun(str(reply["not_run"]))
        if "error" in reply:
            said = SaidElsewhere if reply.get("said") else EndpointError
            raise (EndpointAborted if reply.get("aborted") else said)(str(reply["error"]))
        response = ModelResponse.from_json(reply["response"])
        response.cached = int(reply.get("cached") or 0)
        return response

    def take_warnings(self) -> list[str]:
        return []  # cache warnings are the controller's, issued there


def _acknowledged(reply: Message) -> str | None:
    return None if "planned" in reply else "a reply to the plan that does not acknowledge it"


def _which(pid: object, repeat: object) -> str:
    return f"{pid!r}" + (f" repeat {repeat!r}" if repeat else "")
