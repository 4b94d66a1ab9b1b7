"""``--gsm8k-config``: the configs' servers in sequence, as one GPU host runs vLLM's matrix
(docs/configs.md): a driver thread launches a config's server and engine, waits for its items'
answers, stops it, then launches the next. A config whose server fails is its items' one error
and the next still runs, as in vLLM's own test. No pytest: the glue hands in the launcher."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Callable, Sequence

from pytest_gsm8k.core.types import ModelResponse, Request
from pytest_gsm8k.runtime.engine import Engine
from pytest_gsm8k.runtime.failures import EndpointAborted, EndpointError, NotRun, SaidElsewhere
from pytest_gsm8k.runtime.serve import _LIVE, ServedProcess, ServeError

POLL_SECONDS = 0.2  # how often the waiting driver looks whether the run is ending


def group_of(problem_id: str) -> str:
    """``Qwen3-0.6B:test-0001`` -> ``Qwen3-0.6B``."""
    return problem_id.rpartition(":")[0]


class Matrix:
    """The configs' servers in sequence; the answer source of every config's items (here,
    and on the xdist answer server: it stands where an :class:`Engine` would)."""

    endpoint = "(the configs' servers)"
    model = "(the configs' models)"

    def __init__(
        self,
        names: Sequence[str],
        launch: Callable[[str], tuple[ServedProcess, Engine]],  # a server, its engine unstarted
        *,
        say: Callable[[str], None] = lambda line: None,
        lookahead: int | None = None,  # --gsm8k-early-stop: each engine's (Engine.lookahead)
    ) -> None:
        self.names = tuple(names)
        self._launch, self._say, self.lookahead = launch, say, lookahead
        self._engines = {name: concurrent.futures.Future[Engine]() for name in self.names}
        self.made: list[Engine] = []  # the configs' engines so far (the driver's)
        self._said: set[str] = set()  # configs whose failure an item has said in full
        self._stopped: dict[str, str] = {}  # configs stopped early -> their skip message
        self._awaited: set[str] = set()  # configs an item waited for before their server ran
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        #: the matrix's own loop, where configs' answers are awaited
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._loop_thread.start()

    def start(self, requests: Sequence[Request], *, guess: bool = False) -> None:
        """Start the sequence with the collected items' requests, as an Engine is started (the
        first call counts; on the answer server, a worker's plan: every item it collected)."""
        with self._lock:
            if self._thread is not None:
                return
            by_group: dict[str, list[Request]] = {}
            for request in requests:
                by_group.setdefault(group_of(request.problem_id), []).append(request)
            self._thread = threading.Thread(target=self._drive, args=(by_group,), daemon=True)
            self._thread.start()

    def _drive(self, by_group: dict[str, list[Request]]) -> None:
        for name in self.names:
            future, wanted = self._engines[name], by_group.get(name, [])
            ended = EndpointAborted("the run ended before this config")
            if not wanted:
                future.set_exception(NotRun(f"config {name}: none of its items was collected"))
                continue
            if self._closing.is_set():
                future.set_exception(ended)
                continue
            try:
                server, engine = self._launch(name)
            except BaseException as exc:  # never leave a test waiting for ever
                why = str(exc) if isinstance(exc, ServeError) else repr(exc)  # one line, scrubbed
                future.set_exception(EndpointError(f"config {name}: {why}"))
                continue
            if self._closing.is_set():  # the run ended while this server started
                server.stop()
                engine.close()
                future.set_exception(ended)
                continue
            self.made.append(engine)
            server.watch(engine.abort)
            engine.start(wanted)
            future.set_result(engine)
            # until every request of the config has its answer or error, or the run ends
            pending = {engine.by_request[r].future for r in wanted}  # start() made every job
            later = set(self.names[self.names.index(name) + 1 :])
            while pending and not self._closing.is_set():
                if engine.lookahead is not None and self._awaited & later:
                    # an item of a later config waits (items in another order: --ff, a
                    # shuffling plugin): this config's own come after it, so they are fetched
                    # now, past the early stop's lookahead, or neither would ever end
                    engine.lookahead = None
                    with contextlib.suppress(RuntimeError):  # its loop closed: the run ended
                        engine.start([])
                _, pending = concurrent.futures.wait(pending, timeout=POLL_SECONDS)
            server.stop()

    def _engine(self, name: str) -> Engine | None:  # never waits
        future = self._engines.get(name)
        if future is None or not future.done() or future.exception() is not None:
            return None
        return future.result()

    def engine_of(self, request: Request) -> Engine | None:
        return self._engine(group_of(request.problem_id))

    def stop_config(self, name: str, message: str) -> None:
        """Config ``name``'s verdict is settled (--gsm8k-early-stop; the first call counts):
        its engine sends nothing more, its unfetched items are :class:`NotRun`, and the
        driver moves on once the requests under way have arrived."""
        with self._lock:
            if name in self._stopped:
                return
            self._stopped[name] = message
        if (engine := self._engine(name)) is not None:
            engine.stop(message)
        self._say(f"gsm8k: {message}")

    def _failed(self, name: str, exc: BaseException) -> BaseException:
        """A config whose server failed: its first item says why, the others only that; once
        the config was stopped early, its items are not run."""
        if name in self._stopped and isinstance(exc, EndpointError):
            return NotRun(self._stopped[name])
        if not isinstance(exc, EndpointError) or isinstance(exc, EndpointAborted):
            return exc
        with self._lock:
            if name not in self._said:
                self._said.add(name)
                return exc
        return SaidElsewhere(f"config {name}: its server failed (its first item says why)")

    def result(self, request: Request) -> ModelResponse:
        """:meth:`answer` for a test: asked and consumed (the early stop's lookahead)."""
        return asyncio.run_coroutine_threadsafe(
            self.answer(request, consume=True), self.loop
        ).result()

    async def answer(self, request: Request, *, consume: bool = False) -> ModelResponse:
        """On the matrix's loop: wait for the config's engine, then its answer; not ``consume``
        on the xdist answer server (counted when the worker's report settles it)."""
        if (future := self._engines.get(name := group_of(request.problem_id))) is None:
            raise EndpointError(f"no config runs problem {request.problem_id!r}")
        if not future.done():
            self._awaited.add(name)
        try:
            engine = await asyncio.shield(asyncio.wrap_future(future))  # shared: never cancelled
        except (EndpointError, NotRun) as exc:
            raise self._failed(name, exc) from None
        inner = engine.answer(request, consume=consume and engine.lookahead is not None)
        try:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(inner, engine.loop))
        except EndpointAborted as exc:  # its server died: that config's failure, not the run's
            if self._closing.is_set():
                raise
            raise self._failed(name, EndpointError(f"config {name}: {exc}")) from None

    def take_warnings(self) -> list[str]:
        return [line for engine in list(self.made) for line in engine.take_warnings()]

    def settle(self, request: Request) -> None:
        """``request``'s outcome came back: its engine may fetch one more (never waits)."""
        if (engine := self.engine_of(request)) is not None:
            engine.settle(request)

    def close(self) -> None:
        """Stop the driver's servers (serving or starting), every engine, the driver; idempotent."""
        if self.loop.is_closed():
            return
        self._closing.set()
        ends, driver = time.monotonic() + 30, self._thread
        while driver is not None and driver.is_alive() and time.monotonic() < ends:
            for server in [s for s in list(_LIVE) if s.starter is driver]:
                server.stop()
            driver.join(POLL_SECONDS)
        for engine in list(self.made):
            engine.close()
        for name, future in self._engines.items():
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                future.set_exception(EndpointAborted(f"config {name}: the run ended"))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()
