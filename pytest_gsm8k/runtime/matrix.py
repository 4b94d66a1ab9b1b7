"""``--gsm8k-config``: the configs' servers in sequence, as one GPU host runs vLLM's
matrix (docs/configs.md): a driver thread launches a config's server, plans its items on a
new :class:`~pytest_gsm8k.runtime.engine.Engine`, waits for their answers, stops the server,
then launches the next. A config whose server fails is its items' one error and the next
still runs, as in vLLM's own test; one stopped early (:meth:`Matrix.stop_config`) has its
unfetched items :class:`NotRun`. No pytest: the glue hands in how a config is launched.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Sequence

from pytest_gsm8k.core.types import ModelResponse, Request
from pytest_gsm8k.runtime.engine import Engine
from pytest_gsm8k.runtime.failures import EndpointAborted, EndpointError, NotRun, SaidElsewhere
from pytest_gsm8k.runtime.serve import ServedProcess, ServeError

POLL_SECONDS = 0.2  # how often a waiting driver or test looks whether the run is ending


def group_of(problem_id: str) -> str:
    """``Qwen3-0.6B:test-0001`` -> ``Qwen3-0.6B``."""
    return problem_id.rpartition(":")[0]


class Matrix:
    """The configs' servers in sequence; the answer source of every config's items."""

    def __init__(
        self,
        names: Sequence[str],
        launch: Callable[[str], tuple[ServedProcess, Engine]],  # a server, its engine unstarted
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
        self._said: set[str] = set()  # configs whose failure an item has said in full
        self._current: ServedProcess | None = None
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        #: --gsm8k-early-stop: each engine fetches only so far ahead of the answers whose
        #: outcome came back (:meth:`settle`); None: every item
        self.lookahead = lookahead
        self._stopped: dict[str, str] = {}  # configs stopped early -> their skip message
        self._loop_thread: threading.Thread | None = None

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
                server, engine = self._launch(name)
                if self._closing.is_set():  # the run ended while this server started
                    server.stop()
                    engine.close()
                    future.set_exception(EndpointAborted("the run ended before this config"))
                    continue
            except ServeError as exc:  # one line, scrubbed: what its items share
                future.set_exception(EndpointError(f"config {name}: {exc}"))
                continue
            except BaseException as exc:  # never leave a test waiting for ever
                future.set_exception(EndpointError(f"config {name}: {exc!r}"))
                continue
            self._current = server
            self._made.append(engine)
            server.watch(engine.abort)
            engine.start(list(wanted))
            future.set_result(engine)
            # until every request of the config has its answer or error, or the run ends
            pending = {engine.by_request[r].future for r in wanted if r in engine.by_request}
            while pending and not self._closing.is_set():
                _, pending = concurrent.futures.wait(pending, timeout=POLL_SECONDS)
            self._current = None
            server.stop()

    def stop_config(self, name: str, message: str) -> None:
        """Config ``name``'s verdict is settled (--gsm8k-early-stop; the first call counts):
        its engine sends nothing more, its unfetched items are :class:`NotRun`, and the
        driver moves on once the requests under way have arrived."""
        with self._lock:
            if name in self._stopped:
                return
            self._stopped[name] = message
        future = self._engines.get(name)
        if future is not None and future.done() and future.exception() is None:
            future.result().stop(message)
        self._say(f"gsm8k: {message}")

    def _failed(self, name: str, exc: BaseException) -> BaseException:
        """A config whose server failed: its first item says why, the others only that; once
        the config was stopped early, its items are not run."""
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
        """The engine of ``request``'s config, once its server is up (raises its failure)."""
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

    endpoint = "(the configs' servers)"
    model = "(the configs' models)"

    def result(self, request: Request) -> ModelResponse:
        engine = self.engine_for(request)
        try:
            return engine.result(request)
        except EndpointAborted as exc:
            raise self._config_failed(request, exc) from None

    def _config_failed(self, request: Request, exc: EndpointAborted) -> BaseException:
        """A config's server died mid-run: that config's failure, not the matrix's."""
        if self._closing.is_set():
            return exc
        name = group_of(request.problem_id)
        return self._failed(name, EndpointError(f"config {name}: {exc}"))

    def take_warnings(self) -> list[str]:
        return [line for engine in list(self._made) for line in engine.take_warnings()]

    def engine_of(self, request: Request) -> Engine | None:
        """The config's engine if it was made (never waits)."""
        future = self._engines.get(group_of(request.problem_id))
        if future is None or not future.done() or future.exception() is not None:
            return None
        return future.result()

    def notes(self) -> list[str]:
        return [line for engine in list(self._made) for line in engine.notes()]

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
        """A worker's plan: every collected item of every config (never a guess)."""
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
        """``request``'s outcome came back: its engine may fetch one more (never waits)."""
        engine = self.engine_of(request)
        if engine is not None:
            engine.settle(request)

    def stop(self, message: str) -> None:
        for engine in list(self._made):
            engine.stop(message)

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
