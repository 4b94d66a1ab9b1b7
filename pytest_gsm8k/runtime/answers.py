"""xdist: the controller's engine answers the workers over one loopback connection each.

Why this shape: the controller knows every item and runs no tests, so it is
the one process that should talk to the model; the workers need its answers
one at a time, in the order xdist hands them items. A loopback TCP
connection per worker carries exactly that, with no polling and no files:
the worker asks for a problem id, the controller replies when its engine has
the answer. The connection is also the liveness signal: if the controller
dies, the kernel closes it and the worker's read ends at once.

Wire format, one JSON object per line:

* worker -> controller: ``{"token": T}`` first (only this run's workers get
  T, through xdist's ``workerinput``), then ``{"plan": [ids]}`` (the problems
  it collected, in run order: the controller prefetches them; every worker
  collects the same items, so later plans add nothing) and ``{"get": id}``;
* controller -> worker, one line per ``get``: ``{"response": ..., "cached": n}``,
  ``{"error": message, "aborted": bool}``, or ``{"not_run": message}`` once the
  run stopped early (the worker skips the item).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import socket
from collections.abc import Callable
from typing import Any

from pytest_gsm8k.core.types import ModelResponse, Request
from pytest_gsm8k.runtime.engine import EndpointAborted, EndpointError, Engine, NotRun

LIMIT = 1 << 26  # longest line either side accepts (a pass@N answer set can be long)


class AnswerServer:
    """Controller side: serves ``engine``'s answers; ``requests`` maps a problem id to its
    request (None for an id this run does not know)."""

    def __init__(self, engine: Engine, requests: Callable[[str], Request | None]) -> None:
        self.engine = engine
        self.requests = requests
        self.token = secrets.token_hex(16)
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()  # loop thread only
        self.address: tuple[str, int] = ("127.0.0.1", 0)

    def start(self) -> tuple[str, int]:
        """Listen on a free loopback port (on the engine's loop); returns the address."""

        async def listen() -> asyncio.Server:
            return await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=LIMIT)

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
            hello = json.loads(await reader.readline() or b"null")
            if not isinstance(hello, dict) or hello.get("token") != self.token:
                return
            while line := await reader.readline():
                message = json.loads(line)
                if "plan" in message:
                    known = [self.requests(str(pid)) for pid in message["plan"]]
                    self.engine.start([r for r in known if r is not None])
                elif "get" in message:
                    writer.write(await self._reply(str(message["get"])))
                    await writer.drain()
        except (ConnectionError, ValueError, asyncio.LimitOverrunError):
            pass  # a worker that went away, or a stray client: nothing to answer
        except asyncio.CancelledError:
            # The run is ending (Ctrl-C, SIGTERM): the engine cancelled the answer this
            # connection waited for, or close() cancelled the handler. Ending quietly keeps
            # asyncio's stream callback from printing the cancellation as a traceback.
            pass
        finally:
            writer.close()

    async def _reply(self, problem_id: str) -> bytes:
        request = self.requests(problem_id)
        reply: dict[str, Any]
        if request is None:
            reply = {"error": f"the controller knows no problem {problem_id!r}", "aborted": False}
        else:
            try:
                # counted as used when the worker's report arrives (settled), not now
                response = await self.engine.answer(request, consume=False)
                reply = {"response": response.to_json(), "cached": response.cached}
            except EndpointError as exc:
                reply = {"error": str(exc), "aborted": isinstance(exc, EndpointAborted)}
            except NotRun as exc:
                reply = {"not_run": str(exc)}
        return json.dumps(reply, ensure_ascii=False).encode() + b"\n"


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
        self.wait = wait
        self._sock = socket.create_connection(address, timeout=10.0)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._file = self._sock.makefile("rb")
        self._send({"token": token})

    def _send(self, message: dict[str, Any]) -> None:
        self._sock.sendall(json.dumps(message).encode() + b"\n")

    def offer(self, problem_ids: list[str]) -> None:
        """Tell the controller which problems this worker collected, in run order."""
        self._send({"plan": problem_ids})

    def result(self, request: Request) -> ModelResponse:
        """The controller's answer for ``request``'s problem (an EndpointError if it failed)."""
        try:
            self._sock.settimeout(self.wait)
            self._send({"get": request.problem_id})
            line = self._file.readline(LIMIT)
        except TimeoutError:
            raise EndpointAborted(
                f"no answer from the xdist controller for {request.problem_id} within "
                f"{self.wait:g} s"
            ) from None
        except OSError as exc:
            raise EndpointAborted(f"the xdist controller's answer channel failed ({exc})") from None
        if not line:
            raise EndpointAborted("the xdist controller closed its answer channel (it ended)")
        reply = json.loads(line)
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
