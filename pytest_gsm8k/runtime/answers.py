"""xdist: the one channel between the controller and each worker (loopback TCP).

Why this shape: the controller knows every item and runs no tests, so it is
the one process that should talk to the model; the workers need its answers
one at a time, in the order xdist hands them items. xdist gives plugins no
way to talk during the run, so a loopback TCP connection per worker carries
everything that crosses: the worker's plan, the answers, and the controller's
early stop. No polling, no files. The connection is also the liveness signal:
if the controller dies, the kernel closes it and the worker's read ends at once.

A worker that calls a model of its own (a user's callable) connects too, as a
:class:`Channel` that never asks for answers: its plan tells the controller
what the run set out to do, and it hears the stop.

Wire format: frames, each a 4-byte big-endian length and that many bytes of
one JSON object (UTF-8; a lone surrogate from a reply travels as its JSON
escape). A length prefix cannot be misread whatever the answer holds or
however long it is, so the stream never falls out of step; a frame longer
than the reader's cap ends the connection instead of being half read.

* worker -> controller: ``{"token": T}`` first (only this run's workers get
  T, through xdist's ``workerinput``), then ``{"plan": [ids], "fetch": bool}``
  (the problems it collected, in run order; with ``fetch`` the controller's
  engine prefetches them; every worker collects the same items, so later plans
  add nothing to the fetch) and ``{"get": id}``;
* controller -> worker: ``{"planned": n}`` once a plan is recorded (so the plan
  is known before any report of that worker can arrive); one frame per ``get``,
  naming the problem it answers: ``{"id": id, "response": ..., "cached": n}``,
  ``{"id": id, "error": message, "aborted": bool, "said": bool}`` (``said``: another
  item reported this failure in full), or ``{"id": id, "not_run":
  message}`` once the run stopped early (the worker skips the item); and, at
  any time, ``{"stop": message}`` once (on connecting, to a worker that connects
  after the stop). An answer whose frame would be longer than :data:`MAX_FRAME`
  is sent as that item's error instead (the engine already refuses answers
  over :data:`MAX_REPLY_BYTES`, so this is a bound, not a path a real answer
  takes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Protocol

from pytest_gsm8k.core.jsontext import to_json_bytes
from pytest_gsm8k.core.types import ModelResponse, Request
from pytest_gsm8k.runtime.client import MAX_REPLY_BYTES
from pytest_gsm8k.runtime.failures import EndpointAborted, EndpointError, NotRun, SaidElsewhere

HEADER = struct.Struct(">I")  # a frame's length
#: the longest frame either side accepts: the largest answer the engine keeps, and room for
#: the JSON around it
MAX_FRAME = MAX_REPLY_BYTES + (1 << 16)
#: the longest first frame (the token) the controller reads from a connection: a stray
#: client cannot make it allocate more before it knows who is asking
MAX_HELLO = 1 << 10
#: the longest wait a socket accepts (the platform's time_t): longer waits are this one
MAX_WAIT = 1e7


def frame(message: dict[str, Any]) -> bytes:
    """``message`` as one frame's body (UTF-8 JSON; the length goes in front when sent)."""
    return to_json_bytes(message)


async def read_frame(reader: asyncio.StreamReader, limit: int) -> Any:
    """The next frame's message, or None at the end of the stream.

    ValueError for a frame over ``limit`` bytes, one cut short or one that is not JSON:
    the connection cannot be trusted past it.
    """
    try:
        head = await reader.readexactly(HEADER.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ValueError("a frame header cut short") from None
        return None
    (size,) = HEADER.unpack(head)
    if size > limit:
        raise ValueError(f"a frame of {size} bytes, over the {limit}-byte limit")
    try:
        body = await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise ValueError("a frame cut short") from None
    return json.loads(body)


def _write(writer: asyncio.StreamWriter, body: bytes) -> None:
    """Queue one frame on ``writer``: header and body together, so that frames written by
    different coroutines of the loop never interleave."""
    if not writer.is_closing():
        writer.write(HEADER.pack(len(body)))
        writer.write(body)


class AnswerEngine(Protocol):
    """What the answer server needs of what it serves: an :class:`Engine`, or the matrix of
    --gsm8k-config's engines (``runtime/matrix.py``)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    @property
    def lookahead(self) -> int | None: ...

    def start(self, requests: list[Request], *, guess: bool = False) -> None: ...

    async def answer(self, request: Request, *, consume: bool = True) -> ModelResponse: ...

    def settle(self, request: Request) -> None: ...

    def stop(self, message: str) -> None: ...


class AnswerServer:
    """Controller side: every worker's connection. Serves ``engine``'s answers, records the
    workers' plans and tells them of an early stop; ``requests`` maps a problem id to its
    request (None for an id this run does not know). With ``repeats`` K (``--gsm8k-repeats``)
    each problem is K requests: a worker's ``get`` names the repeat (``"repeat": i``, absent
    for the first), and the reply repeats it, so an answer is never taken for another ask."""

    def __init__(
        self,
        engine: AnswerEngine,
        requests: Callable[[str], Request | None],
        *,
        max_frame: int = MAX_FRAME,
        repeats: int = 1,
    ) -> None:
        self.engine = engine
        self.requests = requests
        self.repeats = max(1, repeats)
        self.max_frame = max_frame
        self.token = secrets.token_hex(16)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()  # loop thread only
        self._writers: set[asyncio.StreamWriter] = set()  # loop thread only: workers let in
        self._stop: str | None = None  # loop thread only: the message every worker hears
        self._planned: set[str] | None = None  # under _lock: the union of the plans
        self._stopping = False  # under _lock: stop_all was called
        self._lock = threading.Lock()
        self.address: tuple[str, int] = ("127.0.0.1", 0)

    def start(self) -> tuple[str, int]:
        """Listen on a free loopback port (on the engine's loop); returns the address."""

        async def listen() -> asyncio.Server:
            return await asyncio.start_server(self._serve, "127.0.0.1", 0)

        self._server = asyncio.run_coroutine_threadsafe(listen(), self.engine.loop).result(10)
        host, port = self._server.sockets[0].getsockname()[:2]
        self.address = (str(host), int(port))
        return self.address

    def close(self) -> None:
        """Stop listening and end every open connection (before the engine closes)."""
        server = self._server
        if server is None:
            return
        self._server = None

        async def shutdown() -> None:
            server.close()
            for task in list(self._handlers):
                task.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(shutdown(), self.engine.loop).result(5)

    def head_start(self, problem_ids: list[str], limit: int) -> int:
        """Begin fetching the first of ``problem_ids`` (the controller's own plan, in run
        order) before any worker has offered its plan; returns how many requests started.

        Why: an xdist worker offers its plan only once it has started, imported and
        collected (about half a second, CPU-bound on a small machine), and until then the
        endpoint idles; the controller already knows the plan. At most ``limit`` requests
        are sent on this guess: should the workers collect other items after all (a
        ``gsm8k_model`` override inside a test module, a conftest that deselects), that is
        all that was asked for nothing. Answers are only ever delivered for a worker's
        ``get``, so a guess never changes an outcome; the workers' offers add the rest.
        """
        if self.engine.lookahead is not None:
            # an early stop bounds what is fetched ahead of the asks: guessed answers the
            # workers ask for late (another order) or never would fill that bound
            return 0
        asks: list[Request] = []
        for problem_id in problem_ids:
            if len(asks) >= limit:
                break
            asks.extend(self._asks(problem_id)[: limit - len(asks)])
        if asks:
            self.engine.start(asks, guess=True)
        return len(asks)

    def planned_ids(self) -> set[str] | None:
        """The problems the workers offered, all plans together; None until one offered.

        Any thread. A worker's :meth:`Channel.offer` returns only once its plan is
        recorded here, so every worker whose report has arrived is counted in it.
        """
        with self._lock:
            return None if self._planned is None else set(self._planned)

    def stop_all(self, message: str) -> None:
        """The run stopped early (any thread; the first call counts): the engine sends
        nothing more (:meth:`Engine.stop`) and every worker, connected now or later, hears
        ``message`` (:meth:`Channel.stopped`)."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        self.engine.stop(message)

        def push() -> None:
            self._stop = message
            body = frame({"stop": message})
            for writer in list(self._writers):
                _write(writer, body)

        with contextlib.suppress(RuntimeError):  # the engine's loop is closed: nobody listens
            self.engine.loop.call_soon_threadsafe(push)

    def settled(self, problem_id: str) -> None:
        """The controller received the outcome for ``problem_id`` (see Engine.settle)."""
        if self.engine.lookahead is None:
            return
        for request in self._asks(problem_id):
            self.engine.settle(request)

    def _asks(self, problem_id: str) -> list[Request]:
        """Every request of ``problem_id``, one per repeat (none for an unknown id)."""
        request = self.requests(problem_id)
        return [] if request is None else request.asks(self.repeats)

    def _record(self, problem_ids: list[str]) -> None:
        with self._lock:
            if self._planned is None:
                self._planned = set()
            self._planned.update(problem_ids)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        try:
            hello = await read_frame(reader, MAX_HELLO)
            if not isinstance(hello, dict) or hello.get("token") != self.token:
                return
            self._writers.add(writer)
            if self._stop is not None:
                _write(writer, frame({"stop": self._stop}))
            while isinstance(message := await read_frame(reader, self.max_frame), dict):
                if "plan" in message:
                    ids = [str(pid) for pid in message["plan"]]
                    self._record(ids)
                    if message.get("fetch") is True:
                        self.engine.start([r for pid in ids for r in self._asks(pid)])
                    _write(writer, frame({"planned": len(ids)}))
                elif "get" in message:
                    repeat = message.get("repeat", 0)
                    _write(writer, await self._reply(str(message["get"]), repeat))
                await writer.drain()
        except (ConnectionError, ValueError, TypeError):
            pass  # a worker that went away, or a stray client: nothing to answer
        except asyncio.CancelledError:
            # The run is ending (Ctrl-C, SIGTERM): the engine cancelled the answer this
            # connection waited for, or close() cancelled the handler. Ending quietly keeps
            # asyncio's stream callback from printing the cancellation as a traceback.
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _reply(self, problem_id: str, repeat: object = 0) -> bytes:
        """The body of the frame that answers ``get problem_id`` (its ``repeat``)."""
        request = self.requests(problem_id)
        reply: dict[str, Any] = {"id": problem_id}
        if repeat:
            reply["repeat"] = repeat
        if request is None:
            reply["error"] = f"the controller knows no problem {problem_id!r}"
            reply["aborted"] = False
            return frame(reply)
        if (
            not isinstance(repeat, int)
            or isinstance(repeat, bool)
            or not 0 <= repeat < self.repeats
        ):
            reply["error"] = (
                f"the controller asks each problem {self.repeats} times: no repeat {repeat!r}"
            )
            reply["aborted"] = False
            return frame(reply)
        request = replace(request, repeat=repeat)
        try:
            # counted as used when the worker's report arrives (settled), not now
            response = await self.engine.answer(request, consume=False)
            reply.update(response=response.to_json(), cached=response.cached)
        except EndpointError as exc:
            reply.update(
                error=str(exc),
                aborted=isinstance(exc, EndpointAborted),
                said=isinstance(exc, SaidElsewhere),
            )
        except NotRun as exc:
            reply["not_run"] = str(exc)
        body = frame(reply)
        if len(body) > self.max_frame:
            too_large: dict[str, Any] = {
                "id": problem_id,
                "error": f"the answer is {len(body):,} bytes as JSON, more than the xdist "
                f"answer channel carries ({self.max_frame:,})",
                "aborted": False,
            }
            if repeat:
                too_large["repeat"] = repeat
            body = frame(too_large)
        return body


class _Closed(ConnectionError):
    """The controller closed the channel between frames (it ended)."""


class Channel:
    """Worker side: this worker's end of the channel, without answers (a worker that calls
    a model of its own). It offers the worker's plan and hears the controller's stop.

    ``wait`` bounds each wait for the controller (:class:`RemoteAnswers`: for one answer;
    the controller's engine has its own, shorter bounds, this one only ends a wait that
    nothing else ends).
    """

    #: whether the controller's engine prefetches the plans offered on this end
    fetch = False

    def __init__(self, address: tuple[str, int], token: str, *, wait: float = 60.0) -> None:
        self.wait = min(wait, MAX_WAIT)
        self._sock = socket.create_connection(address, timeout=10.0)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(self.wait)
        self._poll = select.poll() if hasattr(select, "poll") else None
        if self._poll is not None:
            self._poll.register(self._sock, select.POLLIN)
        self._pending = bytearray()  # bytes received, not yet taken as frames
        #: why the channel cannot be read any more (a reply cut short or out of step)
        self._broken: str | None = None
        self._stop: str | None = None
        self._send({"token": token})

    def offer(self, problem_ids: list[str]) -> None:
        """Tell the controller which problems this worker collected, in run order.

        Returns once the controller recorded them (:meth:`AnswerServer.planned_ids`);
        an OSError when it did not within ``wait`` or the channel failed.
        """
        if self._broken is not None:
            raise ConnectionError(self._broken)
        try:
            self._send({"plan": problem_ids, "fetch": self.fetch})
            reply = self._next(time.monotonic() + self.wait)
            if "planned" not in reply:
                raise ConnectionError("a reply to the plan that does not acknowledge it")
        except TimeoutError:
            self._broken = f"the xdist controller did not take the plan within {self.wait:g} s"
            raise ConnectionError(self._broken) from None
        except (OSError, ValueError) as exc:
            self._broken = f"the xdist controller's channel failed ({exc})"
            raise ConnectionError(self._broken) from None

    def stopped(self) -> str | None:
        """The controller's early-stop message once it has arrived, else None.

        Never waits: it reads only what is already here, so it is cheap enough to call
        before every item. A channel that failed hears no stop after its failure.
        """
        if self._stop is None and self._broken is None:
            try:
                if self._arrived():
                    self._receive()
                if self._take() is not None:
                    raise ConnectionError("a frame nobody asked for")
            except (OSError, ValueError) as exc:
                self._broken = f"the xdist controller's channel failed ({exc})"
        return self._stop

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.close()

    # -- frames ------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        body = frame(message)
        self._sock.sendall(HEADER.pack(len(body)) + body)

    def _arrived(self) -> bool:
        """Whether bytes (or the end) wait to be read, asked without waiting."""
        if self._poll is not None:
            return bool(self._poll.poll(0))
        return bool(select.select([self._sock], [], [], 0)[0])  # pragma: no cover - Windows

    def _receive(self) -> None:
        """One read of what the controller sent (waits as the socket's timeout says)."""
        need = HEADER.size
        if len(self._pending) >= HEADER.size:
            need += HEADER.unpack_from(self._pending)[0]
        chunk = self._sock.recv(min(max(need - len(self._pending), 1 << 16), 1 << 20))
        if not chunk:
            if self._pending:
                raise ConnectionError("a frame cut short")
            raise _Closed("the xdist controller closed its channel (it ended)")
        self._pending += chunk

    def _take(self) -> dict[str, Any] | None:
        """The next whole frame received, if any; a stop frame is kept, never returned."""
        pending = self._pending
        while len(pending) >= HEADER.size:
            (size,) = HEADER.unpack_from(pending)
            if size > MAX_FRAME:
                raise ConnectionError(
                    f"a frame of {size:,} bytes, over the {MAX_FRAME:,}-byte limit"
                )
            end = HEADER.size + size
            if len(pending) < end:
                return None
            message = json.loads(bytes(pending[HEADER.size : end]))
            del pending[:end]
            if not isinstance(message, dict):
                raise ConnectionError("a frame that is not a JSON object")
            if "stop" not in message:
                return message
            self._stop = str(message["stop"])
        return None

    def _next(self, deadline: float) -> dict[str, Any]:
        """The next frame other than a stop, read by ``deadline`` (TimeoutError after it, give
        or take a second: the socket's timeout is changed only when it is that far off)."""
        while (message := self._take()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            if abs((self._sock.gettimeout() or 0.0) - left) > 1.0:
                self._sock.settimeout(left)
            with contextlib.suppress(TimeoutError):  # the deadline above decides
                self._receive()
        return message


class RemoteAnswers(Channel):
    """Worker side: the controller's answers, asked for one test at a time; the plan it
    offers is fetched by the controller's engine, and it hears the stop like any
    :class:`Channel`."""

    fetch = True

    def __init__(
        self, address: tuple[str, int], token: str, *, endpoint: str, model: str, wait: float
    ) -> None:
        super().__init__(address, token, wait=wait)
        self.endpoint = endpoint
        self.model = model

    def result(self, request: Request) -> ModelResponse:
        """The controller's answer for ``request``'s problem (an EndpointError if it failed).

        After an early stop the controller's engine decides, as it does for its own tests:
        an answer it has (or is receiving) still comes, one it has not asked for is
        :class:`NotRun`. Any failure mid-reply (a timeout, a frame cut short, a reply for
        another problem) breaks the channel for good: the next read could start inside the
        late reply, and a worker must never score one problem with another's answer.
        """
        if self._broken is not None:
            raise EndpointAborted(self._broken)
        try:
            ask: dict[str, Any] = {"get": request.problem_id}
            if request.repeat:
                ask["repeat"] = request.repeat
            self._send(ask)
            reply = self._next(time.monotonic() + self.wait)
            if reply.get("id") != request.problem_id or reply.get("repeat", 0) != request.repeat:
                got = f" repeat {reply['repeat']!r}" if reply.get("repeat") else ""
                want = f" repeat {request.repeat}" if request.repeat else ""
                raise ConnectionError(
                    f"a reply for {reply.get('id')!r}{got} where {request.problem_id!r}{want} "
                    "was asked for"
                )
        except TimeoutError:
            self._broken = (
                f"no answer from the xdist controller for {request.problem_id} within "
                f"{self.wait:g} s"
            )
            raise EndpointAborted(self._broken) from None
        except _Closed:
            self._broken = "the xdist controller closed its answer channel (it ended)"
            raise EndpointAborted(self._broken) from None
        except (OSError, ValueError) as exc:
            self._broken = f"the xdist controller's answer channel failed ({exc})"
            raise EndpointAborted(self._broken) from None
        if "not_run" in reply:
            raise NotRun(str(reply["not_run"]))
        if "error" in reply:
            error = (
                EndpointAborted
                if reply.get("aborted")
                else SaidElsewhere
                if reply.get("said")
                else EndpointError
            )
            raise error(str(reply["error"]))
        response = ModelResponse.from_json(reply["response"])
        response.cached = int(reply.get("cached") or 0)
        return response

    def take_warnings(self) -> list[str]:
        return []  # cache warnings are the controller's, issued there
