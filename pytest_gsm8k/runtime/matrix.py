"""``--gsm8k-config``: the configs' servers, one at a time, each with its own engine.

One GPU host runs vLLM's matrix in sequence, so does this: a driver thread starts the
first config's server (``launch``), plans every collected item of that config on a new
:class:`~pytest_gsm8k.runtime.engine.Engine`, waits until each of them has its answer (or
its error), stops the server, and only then starts the next one. Tests (and, under
xdist, the controller's answer server for the workers) wait for their config's engine
and then read from it; an engine keeps its answers after its server stopped.

Nothing here knows pytest: the glue hands in how a config's server and engine are made.
A config whose server cannot start is that config's errors (one message, shared by its
items); the next config still runs, as vLLM's own test goes on with the next config.

``--gsm8k-early-stop``: once a config's verdict is settled the glue calls
:meth:`Matrix.stop_config`; its engine sends nothing more, its items not yet fetched are
:class:`NotRun` (skipped, one message), and the driver stops its server as soon as the
requests under way have arrived, then starts the next config's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pytest_gsm8k.core.types import ModelResponse, Request
from pytest_gsm8k.runtime.engine import Engine
from pytest_gsm8k.runtime.failures import EndpointAborted, EndpointError, NotRun, SaidElsewhere
from pytest_gsm8k.runtime.serve import ServedProcess

#: how often a waiting driver or test looks whether the run is ending
POLL_SECONDS = 0.2


class LaunchError(Exception):
    """A config's server could not be started: the one line its items share."""


@dataclass(frozen=True)
class Launched:
    """A config's server, ready, and the engine that asks it (not yet started)."""

    server: ServedProcess
    engine: Engine


def group_of(problem_id: str) -> str:
    """The config a problem id of a group belongs to (``Qwen3-0.6B:test-0001``)."""
    return problem_id.rpartition(":")[0]


class Matrix:
    """The configs' servers in sequence; the answer source of every config's items."""

    def __init__(
        self,
        names: Sequence[str],
        launch: Callable[[str], Launched],
        *,
        say: Callable[[str], None] = lambda line: None,
        lookahead: int | None = None,
    ) -> None:
        self.names = tuple(names)
        self._launch = launch
        self._say = say
        self._engines: dict[str, concurrent.futures.Future[Engine]] = {
            name: concurrent.futures.Future() for name in self.names
        }
        self._made: list[Engine] = []
        #: configs whose failure to start an item has already said in full
        self._said: set[str] = set()
        self._current: ServedProcess | None = None
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: what each config's server reported (for the report): name -> fields
        self.servers: dict[str, dict[str, object]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        #: what the xdist answer server reads of an engine: None, the matrix fetches every
        #: item; a number (--gsm8k-early-stop), each config's engine fetches only so far
        #: ahead of the answers whose outcome came back (:meth:`settle`)
        self.lookahead = lookahead
        #: configs stopped early: name -> the message their items not fetched are skipped with
        self._stopped: dict[str, str] = {}
        self._loop_thread: threading.Thread | None = None

    # -- the driver --------------------------------------------------------------

    def begin(self, requests: Sequence[Request]) -> None:
        """Start the sequence with the collected items' requests (the first call counts)."""
        with self._lock:
            if self._thread is not None:
                return
            by_group: dict[str, list[Request]] = {name: [] for name in self.names}
            for request in requests:
                by_group.setdefault(group_of(request.problem_id), []).append(request)
            self._thread = threading.Thread(
                target=self._drive, args=(by_group,), name="gsm8k-matrix", daemon=True
            )
            self._thread.start()

    def _drive(self, by_group: dict[str, list[Request]]) -> None:
        for name in self.names:
            future = self._engines[name]
            wanted = by_group.get(name) or []
            if not wanted:
                future.set_exception(NotRun(f"config {name}: none of its items was collected"))
                continue
            if self._closing.is_set():
                future.set_exception(EndpointAborted("the run ended before this config"))
                continue
            try:
                launched = self._launch(name)
                if self._closing.is_set():  # the run ended while this server started
                    launched.server.stop()
                    launched.engine.close()
                    future.set_exception(EndpointAborted("the run ended before this config"))
                    continue
            except LaunchError as exc:
                future.set_exception(EndpointError(f"config {name}: {exc}"))
                continue
            except BaseException as exc:  # never leave a test waiting for ever
                future.set_exception(EndpointError(f"config {name}: {exc!r}"))
                continue
            self._current = launched.server
            engine = launched.engine
            self._made.append(engine)
            launched.server.watch(engine.abort)
            engine.start(list(wanted))
            future.set_result(engine)
            self._wait_answered(engine, wanted)
            self._current = None
            launched.server.stop()

    def _wait_answered(self, engine: Engine, requests: list[Request]) -> None:
        """Until every request of the config has its answer or error, or the run ends."""
        futures = [engine.by_request[r].future for r in requests if r in engine.by_request]
        pending = set(futures)
        while pending and not self._closing.is_set():
            _, pending = concurrent.futures.wait(pending, timeout=POLL_SECONDS)

    # -- the answer source (one process, or the xdist controller) -------------------

    def stop_config(self, name: str, message: str) -> None:
        """Config ``name``'s verdict is settled (--gsm8k-early-stop; any thread, the first
        call counts): its engine sends nothing more, the items it has not fetched are
        :class:`NotRun` with ``message``, and the driver moves on to the next config once
        the requests under way have arrived."""
        with self._lock:
            if name in self._stopped:
                return
            self._stopped[name] = message
        future = self._engines.get(name)
        if future is not None and future.done() and future.exception() is None:
            future.result().stop(message)
        self._say(f"gsm8k: {message}")

    def _failed(self, name: str, exc: BaseException) -> BaseException:
        """A config whose server did not start or died: its first item says why, the others
        say only that (one message, not one per problem); once the config was stopped early,
        its items are not run."""
        stopped = self._stopped.get(name)
        if stopped is not None and isinstance(exc, EndpointError):
            return NotRun(stopped)
        if not isinstance(exc, EndpointError) or isinstance(exc, EndpointAborted):
            return exc
        with self._lock:
            first = name not in self._said
            self._said.add(name)
        if first:
            return exc
        return SaidElsewhere(f"config {name}: its server failed (its first item says why)")

    def engine_for(self, request: Request) -> Engine:
        """The engine of ``request``'s config, once its server is up (raises its failure).
        The wait has the driver's bounds: each server's startup wait, then its answers."""
        name = group_of(request.problem_id)
        future = self._engines.get(name)
        if future is None:
            raise EndpointError(f"no config runs problem {request.problem_id!r}")
        while True:
            try:
                return future.result(timeout=POLL_SECONDS)
            except concurrent.futures.TimeoutError:
                if self._closing.is_set():
                    raise EndpointAborted("the run ended") from None
            except (EndpointError, NotRun) as exc:
                raise self._failed(name, exc) from None

    @property
    def endpoint(self) -> str:
        return "(the configs' servers)"

    @property
    def model(self) -> str:
        return "(the configs' models)"

    def result(self, request: Request) -> ModelResponse:
        engine = self.engine_for(request)
        try:
            return engine.result(request)
        except EndpointAborted as exc:
            raise self._config_failed(request, exc) from None

    def _config_failed(self, request: Request, exc: EndpointAborted) -> BaseException:
        """A config's server died or went unreachable mid-run: that config's failure (said
        in full once), not the whole matrix's: the next config still runs, as in vLLM's CI."""
        if self._closing.is_set():
            return exc
        name = group_of(request.problem_id)
        return self._failed(name, EndpointError(f"config {name}: {exc}"))

    def take_warnings(self) -> list[str]:
        out: list[str] = []
        for engine in list(self._made):
            out.extend(engine.take_warnings())
        return out

    def engine_of(self, request: Request) -> Engine | None:
        """The config's engine if it was made (never waits)."""
        future = self._engines.get(group_of(request.problem_id))
        if future is None or not future.done() or future.exception() is not None:
            return None
        return future.result()

    def notes(self) -> list[str]:
        out: list[str] = []
        for engine in list(self._made):
            out.extend(engine.notes())
        return out

    # -- what the xdist answer server needs of an engine ------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """An event loop of the matrix's own, for the xdist answer server."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="gsm8k-matrix-answers", daemon=True
                )
                thread.start()
                self._loop, self._loop_thread = loop, thread
            return self._loop

    def start(self, requests: list[Request], *, guess: bool = False) -> None:
        """A worker's plan: the matrix fetches every collected item of every config (it
        is never given a guess: the controller's head start is for one engine only)."""
        self.begin(requests)

    async def answer(self, request: Request, *, consume: bool = True) -> ModelResponse:
        """On the answer server's loop: wait for the config's engine, then its answer."""
        name = group_of(request.problem_id)
        future = self._engines.get(name)
        if future is None:
            raise EndpointError(f"no config runs problem {request.problem_id!r}")
        try:
            engine = await asyncio.wrap_future(future)
        except (EndpointError, NotRun) as exc:
            raise self._failed(name, exc) from None
        inner = asyncio.run_coroutine_threadsafe(engine.answer(request, consume=False), engine.loop)
        try:
            return await asyncio.wrap_future(inner)
        except EndpointAborted as exc:
            raise self._config_failed(request, exc) from None

    def settle(self, request: Request) -> None:
        """The outcome of ``request``'s answer came back: its config's engine may fetch
        one more (only with a lookahead; never waits)."""
        engine = self.engine_of(request)
        if engine is not None:
            engine.settle(request)

    def stop(self, message: str) -> None:
        for engine in list(self._made):
            engine.stop(message)

    # -- the end ------------------------------------------------------------------

    def close(self) -> None:
        """Stop the server that runs, every engine, the driver; idempotent."""
        self._closing.set()
        server = self._current
        if server is not None:
            server.stop()
        for engine in list(self._made):
            engine.close()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=30)
        for name, future in self._engines.items():
            if not future.done():
                with contextlib.suppress(concurrent.futures.InvalidStateError):
                    future.set_exception(EndpointAborted(f"config {name}: the run ended"))
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=5)
            if not loop.is_running():
                loop.close()
