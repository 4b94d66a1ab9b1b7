"""xdist: the controller's engine answers the workers over one loopback connection each.

Why this shape: the controller knows every item and runs no tests, so it is
the one process that should talk to the model; the workers need its answers
one at a time, in the order xdist hands them items. A loopback TCP
connection per worker carries exactly that, with no polling and no files:
the worker asks for a problem id, the controller replies when its engine has
the answer. The connection is also the liveness signal: if the controller
dies, the kernel closes it and the worker's read ends at once.

Wire format: frames, each a 4-byte big-endian length and that many bytes of
one JSON object (UTF-8; a lone surrogate from a reply travels as its JSON
escape). A length prefix cannot be misread whatever the answer holds or
however long it is, so the stream never falls out of step; a frame longer
than the reader's cap ends the connection instead of being half read.

* worker -> controller: ``{"token": T}`` first (only this run's workers get
  T, through xdist's ``workerinput``), then ``{"plan": [ids]}`` (the problems
  it collected, in run order: the controller prefetches them; every worker
  collects the same items, so later plans add nothing) and ``{"get": id}``;
* controller -> worker, one frame per ``get``, naming the problem it answers:
  ``{"id": id, "response": ..., "cached": n}``, ``{"id": id, "error": message,
  "aborted": bool}``, or ``{"id": id, "not_run": message}`` once the run
  stopped early (the worker skips the item). An answer whose frame would be
  longer than :data:`MAX_FRAME` is sent as that item's error instead (the
  engine already refuses answers over :data:`MAX_REPLY_BYTES`, so this is a
  bound, not a path a real answer takes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
import struct
from collections.abc import Callable
from typing import Any

from pytest_gsm8k.core.jsontext import to_json_bytes
from pytest_gsm8k.core.types import ModelResponse, Request
from pytest_gsm8k.runtime.client import MAX_REPLY_BYTES
from pytest_gsm8k.runtime.engine import EndpointAborted, EndpointError, Engine, NotRun

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


class AnswerServer:
    """Controller side: serves ``engine``'s answers; ``requests`` maps a problem id to its
    request (None for an id this run does not know)."""

    def __init__(
        self,
        engine: Engine,
        requests: Callable[[str], Request | None],
        *,
        max_frame: int = MAX_FRAME,
    ) -> None:
        self.engine = engine
        self.requests = requests
        self.max_frame = max_frame
        self.token = secrets.token_hex(16)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()  # loop thread only
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

    def settled(self, problem_id: str) -> None:
        """The controller received the outcome for ``problem_id`` (see Engine.settle)."""
        if self.engine.lookahead is None:
            return
        request = self.requests(problem_id)
        if request is not None:
            self.engine.settle(request)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        try:
            hello = await read_frame(reader, MAX_HELLO)
            if not isinstance(hello, dict) or hello.get("token") != self.token:
                return
            while isinstance(message := await read_frame(reader, self.max_frame), dict):
                if "plan" in message:
                    known = [self.requests(str(pid)) for pid in message["plan"]]
                    self.engine.start([r for r in known if r is not None])
                elif "get" in message:
                    body = await self._reply(str(message["get"]))
                    writer.write(HEADER.pack(len(body)))
                    writer.write(body)
                    await writer.drain()
        except (ConnectionError, ValueError, TypeError):
            pass  # a worker that went away, or a stray client: nothing to answer
        except asyncio.CancelledError:
            # The run is ending (Ctrl-C, SIGTERM): the engine cancelled the answer this
            # connection waited for, or close() cancelled the handler. Ending quietly keeps
            # asyncio's stream callback from printing the cancellation as a traceback.
            pass
        finally:
            writer.close()

    async def _reply(self, problem_id: str) -> bytes:
        """The body of the frame that answers ``get problem_id``."""
        request = self.requests(problem_id)
        reply: dict[str, Any] = {"id": problem_id}
        if request is None:
            reply["error"] = f"the controller knows no problem {problem_id!r}"
            reply["aborted"] = False
            return frame(reply)
        try:
            # counted as used when the worker's report arrives (settled), not now
            response = await self.engine.answer(request, consume=False)
            reply.update(response=response.to_json(), cached=response.cached)
        except EndpointError as exc:
            reply.update(error=str(exc), aborted=isinstance(exc, EndpointAborted))
        except NotRun as exc:
            reply["not_run"] = str(exc)
        body = frame(reply)
        if len(body) > self.max_frame:
            body = frame(
                {
                    "id": problem_id,
                    "error": f"the answer is {len(body):,} bytes as JSON, more than the xdist "
                    f"answer channel carries ({self.max_frame:,})",
                    "aborted": False,
                }
            )
        return body


class RemoteAnswers:
    """Worker side: the controller's answers, asked for one test at a time.

    ``wait`` bounds how long one answer may take (the controller's engine has
    its own, shorter bounds; this one only ends a wait that nothing else ends).
    """

    def __init__(
        self, address: tuple[str, int], token: str, *, endpoint: str, model: str, wait: float
    ) -> None:
        self.endpoint = endpoint
        self.model = model
        self.wait = min(wait, MAX_WAIT)
        self._sock = socket.create_connection(address, timeout=10.0)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file = self._sock.makefile("rb")
        #: why the channel cannot be read any more (a reply cut short or out of step)
        self._broken: str | None = None
        self._send({"token": token})

    def _send(self, message: dict[str, Any]) -> None:
        body = frame(message)
        self._sock.sendall(HEADER.pack(len(body)) + body)

    def _read_reply(self) -> dict[str, Any]:
        head = self._file.read(HEADER.size)
        if not head:
            raise EndpointAborted("the xdist controller closed its answer channel (it ended)")
        if len(head) < HEADER.size:
            raise ConnectionError("a frame header cut short")
        (size,) = HEADER.unpack(head)
        if size > MAX_FRAME:
            raise ConnectionError(f"a frame of {size:,} bytes, over the {MAX_FRAME:,}-byte limit")
        body = self._file.read(size)
        if len(body) < size:
            raise ConnectionError("a frame cut short")
        reply = json.loads(body)
        if not isinstance(reply, dict):
            raise ConnectionError("a frame that is not a JSON object")
        return reply

    def offer(self, problem_ids: list[str]) -> None:
        """Tell the controller which problems this worker collected, in run order."""
        self._send({"plan": problem_ids})

    def result(self, request: Request) -> ModelResponse:
        """The controller's answer for ``request``'s problem (an EndpointError if it failed).

        Any failure mid-reply (a timeout, a frame cut short, a reply for another problem)
        breaks the channel for good: the next read could start inside the late reply, and
        a worker must never score one problem with another's answer.
        """
        if self._broken is not None:
            raise EndpointAborted(self._broken)
        try:
            self._sock.settimeout(self.wait)
            self._send({"get": request.problem_id})
            reply = self._read_reply()
            if reply.get("id") != request.problem_id:
                raise ConnectionError(
                    f"a reply for {reply.get('id')!r} where {request.problem_id!r} was asked for"
                )
        except TimeoutError:
            self._broken = (
                f"no answer from the xdist controller for {request.problem_id} within "
                f"{self.wait:g} s"
            )
            raise EndpointAborted(self._broken) from None
        except EndpointAborted:
            raise
        except (OSError, ValueError) as exc:
            self._broken = f"the xdist controller's answer channel failed ({exc})"
            raise EndpointAborted(self._broken) from None
        if "not_run" in reply:
            raise NotRun(str(reply["not_run"]))
        if "error" in reply:
            error = EndpointAborted if reply.get("aborted") else EndpointError
            raise error(str(reply["error"]))
        response = ModelResponse.from_json(reply["response"])
        response.cached = int(reply.get("cached") or 0)
        return response

    def take_warnings(self) -> list[str]:
        return []  # cache warnings are the controller's, issued there

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
            self._sock.close()
