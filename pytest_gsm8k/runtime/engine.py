"""The prefetching engine: one background event loop per process.

Tests run one after another on pytest's thread; model calls must not. The
engine gets the ordered list of requests for the items to run, and
``concurrency`` worker coroutines on a background loop fetch them ahead of
the tests, in run order, jumping to whatever the test thread is waiting for.
A test mostly finds its answer ready.

Scheduling state lives on the loop thread only; the test thread talks to it
with ``call_soon_threadsafe`` and waits on a thread-safe future, and when the
answer is already there it does not wake the loop at all (the two threads
share one GIL, so every needless wake-up slows the other down).

Requests go through the response cache when it can help: when it is
persistent (``--gsm8k-resume``; under xdist, also an answer another worker of the
run already stored). Without ``--gsm8k-resume`` the cache hands out this run's
own answers only (:mod:`pytest_gsm8k.runtime.cache`): a verdict rests on answers
this run received. With ``--gsm8k-no-cache`` a process keeps answers in memory only.

The engine knows nothing of xdist. Under xdist with the plugin's own client,
the controller runs the one engine and serves its answers to the workers
(:mod:`pytest_gsm8k.runtime.answers`). A user's callable exists in the
workers alone; there each worker's engine is asked for one item at a time,
with nothing planned (:meth:`Engine.result` fetches a request it was not
given), since xdist already spreads the items over the workers.

Failures are split in two: a request that fails after the openai client's
retries is that item's error; an endpoint that is gone (the breaker opens,
or a 401/404 says the key or the model is wrong, or a reply to a request that
names no model names another model than the run's while no ``GET /v1/models``
showed who answers: ``named``) aborts the engine, and every unfinished item
gets the same one-line message at once. Three more ways to
stop, so the same failure on many requests is one message and a stop:

* a 4xx (other than 408/429, which are retried) before any request succeeded:
  the requests themselves are wrong (a bad parameter), every one will fail;
* :data:`STORM` finished requests in a row failing with the same message (429s
  or timeouts past the retry budget): nothing is getting through;
* no answer at all for ``stall_timeout`` seconds while requests are in flight:
  a hung endpoint that accepts connections and never answers.

Cached answers are reused only from the server this run talks to
(:mod:`pytest_gsm8k.core.identity`): an entry recorded under another
``/v1/models`` card is asked again, and so is one whose reply named another
model or fingerprint than this run's replies do. A run learns its replies'
identity from its first fresh answer, so answers cached by an earlier run are
held back ("parked") while one is under way and checked once it arrives;
when nothing more is being asked (the workers are idle, no call in flight)
they are used on the card's word alone. Cache reads run on the cache's
reader thread with a bound: a hung file system never stalls this loop.

Everything that came from the endpoint (answers, model names, error messages)
is scrubbed of the run's secrets (:class:`~pytest_gsm8k.core.scrub.Scrubber`)
where it enters the engine, so no report, cache file or terminal line
downstream can hold them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any

from pytest_gsm8k.core.health import reasoning_model_hint
from pytest_gsm8k.core.identity import (
    Description,
    difference,
    reply_difference,
    reply_identity,
    unnamed_refusal,
    unnamed_reply,
)
from pytest_gsm8k.core.jsontext import to_json_bytes
from pytest_gsm8k.core.scrub import Scrubber, printable, shown_url
from pytest_gsm8k.core.settings import with_v1
from pytest_gsm8k.core.types import Completion, ModelResponse, Request
from pytest_gsm8k.runtime.bounded import mib
from pytest_gsm8k.runtime.cache import ResponseCache, Write, cache_key
from pytest_gsm8k.runtime.client import (
    MAX_REPLY_BYTES,
    Breaker,
    ModelClient,
    one_sample,
    refused_reply,
)
from pytest_gsm8k.runtime.wire import (
    ConnectionFailure,
    HTTPStatusFailure,
    RequestTimeout,
    WireFailure,
)

PLANNED, RUNNING, PARKED, DONE = "planned", "running", "parked", "done"

#: how long one cache read may take before the cache is given up for the run: a local
#: entry takes well under a millisecond; only a hung (network) file system takes this long
READ_SECONDS = 10.0

ReplyIdentity = tuple[str | None, str | None]

#: finished requests in a row that failed the same way (each after its whole retry budget:
#: by default six attempts over 15+ s) before the engine stops: past that nothing is getting
#: through. Fewer could be one burst that hit a shared rate-limit window at once (requests in
#: flight fail together); more would only spend minutes proving the same thing.
STORM = 10

#: after an early stop, how long closing waits for the requests already under way: they are
#: paid for, and an answer that arrives is cached, so a later resumed run need not ask again.
#: Bounded, because a slow endpoint must not hold the verdict back for a whole generation.
STOP_GRACE_SECONDS = 5.0


class EndpointError(Exception):
    """One item's request failed (after retries)."""


class EndpointAborted(EndpointError):
    """The endpoint is unusable; every remaining item fails with this message."""


class SaidElsewhere(EndpointError):
    """A failure another item already reported in full (a --gsm8k-config server that did not
    start or died): this item's problem counts as an error, and the item is skipped quietly,
    so a config of 1,319 problems gives one failure to read, not 1,319."""


class NotRun(Exception):
    """The run stopped early (the gates' verdicts are settled): this item is not run."""


class AnswerTooLarge(Exception):
    """All samples of one problem together take more than :data:`MAX_REPLY_BYTES` as JSON."""


class AnotherModel(Exception):
    """A reply to a request that names no model names another model than the run's: the
    run would grade that model under the name given (fatal: every answer is that model's)."""


class _Parked(Exception):
    """An answer cached by an earlier run waits for this run's first reply to be checked."""

    def __init__(self, hit: dict[str, Any]) -> None:
        super().__init__("parked")
        self.hit = hit


#: HTTP statuses the openai client retries (with 5xx); others fail at the first answer
RETRIED = (408, 409, 429)


def _refused_first(status: object, succeeded: int) -> bool:
    """A 4xx that no retry changes, before any request succeeded: the endpoint refuses
    what this run sends (a wrong parameter, a model it does not serve)."""
    client_error = isinstance(status, int) and 400 <= status < 500 and status not in RETRIED
    return client_error and not succeeded


def describe_error(exc: BaseException) -> tuple[str, bool]:
    """(one-line message, fatal?) for an exception from a model call."""
    if isinstance(exc, AnotherModel):
        return str(exc), True
    if isinstance(exc, WireFailure):  # the vllm preset's client: no openai import
        return _describe_wire(exc)
    try:
        import openai
    except ImportError:  # pragma: no cover
        return f"{type(exc).__name__}: {exc}", False
    if isinstance(exc, openai.APIStatusError):
        return _describe_status(exc, exc.status_code)
    if isinstance(exc, openai.APITimeoutError):
        return TIMED_OUT, False
    if isinstance(exc, (refused_reply(), AnswerTooLarge)):
        return str(exc), False  # the message says it all
    if isinstance(exc, openai.APIConnectionError):
        return _connection_failed(exc), False
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": "), False


TIMED_OUT = "request timed out after retries (see --gsm8k-timeout)"


def _describe_wire(exc: WireFailure) -> tuple[str, bool]:
    if isinstance(exc, HTTPStatusFailure):
        return _describe_status(exc, exc.status_code)
    if isinstance(exc, RequestTimeout):
        return TIMED_OUT, False
    if isinstance(exc, ConnectionFailure):
        return _connection_failed(exc), False
    return str(exc), False  # a reply refused unread: the message says it all


def _describe_status(exc: Exception, status: int) -> tuple[str, bool]:
    """An HTTP error reply (the openai client's or the wire client's) in one line."""
    if status in (401, 403):
        return (
            f"the endpoint rejected the credentials (HTTP {status}); check the API key variable"
        ), True
    if status == 404:
        return not_found(exc), True
    retried = " after retries" if status in RETRIED or status >= 500 else ""
    message = _api_message(exc)
    hint = reasoning_model_hint(message) if status == 400 else None
    return f"HTTP {status}{retried}: {message}" + (f"; {hint}" if hint else ""), False


def _connection_failed(exc: BaseException) -> str:
    cause = exc.__cause__
    detail = f" ({type(cause).__name__}: {cause})" if cause else ""
    return f"connection failed after retries{detail}"


#: the paths the openai client appends to the base URL for a completion
API_PATHS = ("/chat/completions", "/completions")


def not_found(exc: Any) -> str:
    """A 404's one line: the URL that answered it and, when the base URL does not end in
    /v1 (the usual cause), the base URL to use instead."""
    request = getattr(exc, "request", None)
    url = str(getattr(request, "url", "") or "")
    if not url:
        return f"the endpoint answered 404: {_api_message(exc)}"
    shown = shown_url(url)
    base = next((shown[: -len(p)] for p in API_PATHS if shown.endswith(p)), shown)
    line = f"{getattr(request, 'method', 'POST')} {shown} answered 404: {_api_message(exc)}"
    suggested = with_v1(base)
    if suggested is not None:
        line += f" (the base URL {base} does not end in /v1: try --gsm8k-base-url={suggested})"
    return line


def _api_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        error = body.get("error")
        message = (
            body.get("message")
            or (error.get("message") if isinstance(error, dict) else None)
            or body.get("detail")  # FastAPI's 404 for a path it does not serve (vLLM)
        )
        if message:
            return str(message)
    return str(getattr(exc, "message", exc)).splitlines()[0]


@dataclass(eq=False)
class Job:
    request: Request
    future: concurrent.futures.Future[ModelResponse] = field(
        default_factory=concurrent.futures.Future
    )
    state: str = PLANNED  # loop thread only
    wanted: bool = False  # the test thread waits for it (loop thread only)
    queued: bool = False  # in the loop's run-order list (loop thread only)
    consumed: bool = False  # a test (or the answer server) asked for it (loop thread only)
    #: planned on a guess (the xdist controller's head start) and not yet by a plan or an
    #: ask: its failure is its own and decides nothing for the run (loop thread only)
    guess: bool = False


class Engine:
    """Owns the loop thread, the client and the scheduling of one model."""

    def __init__(
        self,
        client: ModelClient,
        cache: ResponseCache,
        *,
        concurrency: int,
        breaker: Breaker | None = None,
        lookahead: int | None = None,
        scrub: Scrubber | None = None,
        stall_timeout: float | None = None,
        identity: Description | None = None,
        named: str | None = None,
        read_timeout: float = READ_SECONDS,
    ) -> None:
        self.client = client
        self.scrub = scrub or Scrubber()
        #: what the server's GET /v1/models says about the model (stored with each answer)
        self.identity: Description | None = self.scrub.obj(identity)
        #: the model a reply to a request without a model field must name (None: not
        #: judged: GET /v1/models showed who answers, or the client is a user's)
        self.named = named
        #: what cache keys name as the endpoint: the base URL, or a stabler name for a
        #: server whose URL changes every run (--gsm8k-serve: its command line)
        self.cache_endpoint = str(getattr(client, "cache_endpoint", None) or client.endpoint)
        self.read_timeout = read_timeout
        self._replies: dict[ReplyIdentity, None] = {}  # loop thread: this run's replies, in order
        self._parked: list[tuple[Job, dict[str, Any]]] = []  # loop thread only
        self._busy = 0  # loop thread only: workers handling a job
        self._refused: set[str] = set()  # loop thread only: keys of entries not reused
        self._refused_why: str | None = None
        #: loop thread only: reply identities of earlier runs' answers used before any reply
        self._unchecked: Counter[ReplyIdentity] = Counter()
        self.stall_timeout = stall_timeout
        self.breaker = breaker
        self.succeeded = 0  # loop thread only: requests answered (from the cache too)
        self._streak = 0  # loop thread only: finished requests in a row failing the same way
        self._streak_message = ""
        self._in_flight = 0  # loop thread only: calls to the client under way
        self._progress = time.monotonic()  # loop thread only: the last answer, or a start
        self.cache = cache
        self.concurrency = max(1, concurrency)
        # Only go to disk when it can help: resume across runs (and answers another xdist
        # worker of this run already stored); a throw-away cache is this process's memory.
        self.use_store = cache.persistent
        # At most this many answers fetched ahead of the ones asked for (None: no limit).
        # Early stopping sets it: what is fetched beyond the decision is paid for and unused.
        self.lookahead = lookahead
        self._ahead = 0  # started, not yet asked for (loop thread only)
        self.aborted: str | None = None
        #: the run stopped early: nothing more is sent; what is under way still arrives
        self.stopped: str | None = None
        self.requests_sent = 0
        self.from_cache = 0
        self.by_request: dict[Request, Job] = {}  # test thread only
        self._jobs: list[Job] = []  # loop thread only, in run order
        self._planned = False  # loop thread only: a plan (not a guess) or an ask came
        #: loop thread only: guessed jobs' failures, waiting for a plan or an ask
        self._held: list[tuple[Job, str, bool]] = []  # (job, message, refused first)
        #: loop thread only: a guess was refused as a first request: guess no more until
        #: a plan comes (what is refused once is likely refused again)
        self._guesses_refused = False
        self._holding = False  # loop thread only: parked answers wait for a real plan
        self._scan = 0
        self._priority: deque[Job] = deque()
        self._loop = asyncio.new_event_loop()
        self._wake: asyncio.Event | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False
        self._loop.set_exception_handler(self._loop_exception)
        self._thread = threading.Thread(target=self._run_loop, name="gsm8k-engine", daemon=True)
        self._thread.start()
        if breaker is not None:
            breaker.fit(self.concurrency)

            def on_open(err: str, breaker: Breaker = breaker) -> None:
                # No counts or timings in it: every xdist worker's breaker opens on its own,
                # and the run should still end with one message, shared by all its errors.
                message = (
                    f"endpoint {client.endpoint} unreachable ({err}): "
                    f"{breaker.threshold}+ connection failures in a row for "
                    f"{breaker.min_seconds:g}+ s; stopped sending"
                )
                self._loop.call_soon_threadsafe(self._abort, message)

            breaker.on_open = on_open

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """A cancellation that lands in a callback while the engine closes (Ctrl-C, SIGTERM)
        is the shutdown itself, not an error to print with a traceback."""
        if self._closed and isinstance(context.get("exception"), asyncio.CancelledError):
            return
        loop.default_exception_handler(context)

    # -- thread side -------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def start(self, requests: list[Request], *, guess: bool = False) -> None:
        """Plan and begin fetching ``requests`` in this order.

        ``guess``: requests nobody has planned yet (the xdist controller's head start).
        Until a real plan or an ask arrives, answers from an earlier run's cache stay
        parked (only a fresh reply of this run can vouch for them, and a guess may be all
        that is fetched for a while), and a guessed request's refusal is only its own: it
        aborts nothing unless a plan or an ask takes that request (a conftest may have
        deselected it for the very reason it fails). A run of identical failures is the
        endpoint's, whoever asked: it stops the run as it would without guesses.
        """
        jobs = [self._new_job(request) for request in requests]
        self._loop.call_soon_threadsafe(self._plan, jobs, False, guess)

    def _new_job(self, request: Request) -> Job:
        job = self.by_request.get(request)
        if job is None:
            job = Job(request=request)
            self.by_request[request] = job
        return job

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The engine's event loop (the xdist answer server runs on it too)."""
        return self._loop

    @property
    def endpoint(self) -> str:
        return self.client.endpoint

    @property
    def model(self) -> str:
        return self.client.model

    def take_warnings(self) -> list[str]:
        """Cache warnings and transport notes collected on the engine's threads, for the test
        thread to issue."""
        taken = self.cache.take_warnings()
        if self.breaker is not None and self.breaker.notes:
            notes, self.breaker.notes[:] = list(self.breaker.notes), []
            taken += [self._say(note) for note in notes]
        return taken

    def notes(self) -> list[str]:
        """Lines for the end of the run: cached answers this run did not trust (any thread,
        once the engine is closed or idle)."""
        lines = []
        if self._refused:
            count = len(self._refused)
            were = "answer was" if count == 1 else "answers were"
            lines.append(
                f"gsm8k: {count} cached {were} recorded against a server that described "
                f"itself differently ({self._refused_why}): asked again"
            )
        replies = list(self._replies)  # copies: the loop thread may still add to them
        current = replies[0] if replies else None
        late = {rid: n for rid, n in list(self._unchecked.items()) if rid not in replies}
        if current is not None and late:
            why = reply_difference(next(iter(late)), current)
            lines.append(
                f"gsm8k: {sum(late.values())} answers were graded from the cache before this "
                f"run's first fresh reply showed the server replies differently ({why}); "
                "rerun without --gsm8k-resume to ask them again"
            )
        return [self._say(line) for line in lines]

    def _say(self, message: str) -> str:
        """A message fit to print: without secrets, escapes or control characters."""
        return printable(self.scrub.text(message))

    async def answer(self, request: Request, *, consume: bool = True) -> ModelResponse:
        """On the loop: the response for ``request``, fetched next if it is not under way.

        ``consume=False``: the answer is used elsewhere (an xdist worker), so it counts as
        fetched ahead until :meth:`settle` says its outcome came back."""
        job = self.by_request.get(request)
        if self.stopped is not None and (job is None or job.state == PLANNED):
            raise NotRun(self.stopped)
        if job is None:
            job = self._new_job(request)
            self._plan([job], True)
        else:
            job.guess = False  # asked for: no longer a guess
            if self._holding:  # an ask before any plan: what is parked may go now
                self._planned, self._holding = True, False
                self._kick()
            self._adopt_failures()
            if not job.future.done():
                self._want(job)
        if consume:
            self._consume(job)
        return await asyncio.wrap_future(job.future)

    def settle(self, request: Request) -> None:
        """Any thread: the outcome of ``request``'s answer is known, so it no longer counts
        toward ``lookahead``. Under xdist this is when the worker's report reaches the
        controller, not when the worker took the answer: the early-stop decision is made on
        reports, and answers taken but not yet reported would be fetched past it."""
        self._loop.call_soon_threadsafe(self._settle, request)

    def _settle(self, request: Request) -> None:
        job = self.by_request.get(request)
        if job is not None:
            self._consume(job)

    def result(self, request: Request) -> ModelResponse:
        """The response for ``request``: usually ready; otherwise fetched first, now."""
        job = self.by_request.get(request)
        if self.stopped is not None and (
            job is None or (not job.future.done() and job.state == PLANNED)
        ):
            raise NotRun(self.stopped)
        if job is None:
            job = self._new_job(request)
            self._loop.call_soon_threadsafe(self._plan, [job], True)
        elif not job.future.done():
            self._loop.call_soon_threadsafe(self._want, job)
        if self.lookahead is not None:
            self._loop.call_soon_threadsafe(self._consume, job)
        while True:
            try:
                return job.future.result(timeout=0.5)
            except concurrent.futures.TimeoutError:
                if self._closed:
                    raise EndpointAborted(self.aborted or "the engine was closed") from None

    def ready(self, request: Request) -> ModelResponse | None:
        """The answer for ``request`` if it has arrived (never waits, never fetches)."""
        job = self.by_request.get(request)
        if job is None or not job.future.done() or job.future.exception() is not None:
            return None
        return job.future.result()

    def stop(self, message: str) -> None:
        """Send nothing more (any thread): the run stopped early. Requests under way finish
        and their answers are kept (cached); items not fetched yet raise :class:`NotRun`."""
        self.stopped = message

        def clear() -> None:
            self._release_parked()
            self._priority.clear()
            self._scan = len(self._jobs)
            # A job asked for just before the stop and not started would never be fetched
            # now: its waiter (a test, or an xdist worker's answer) learns at once instead.
            for job in self._jobs:
                if job.state == PLANNED and not job.future.done():
                    _resolve(job.future, error=NotRun(message))

        if not self._closed:
            self._loop.call_soon_threadsafe(clear)

    def abort(self, message: str) -> None:
        """Stop sending; every unfinished item fails with ``message`` (any thread)."""
        if not self._closed:
            self._loop.call_soon_threadsafe(self._abort, message)

    @property
    def jobs(self) -> list[Job]:
        """Every job this engine knows, in the order they were planned."""
        return list(self.by_request.values())

    def close(self) -> None:
        """Cancel what is left, close the client, stop the loop. After an early stop the
        requests under way first get :data:`STOP_GRACE_SECONDS` to arrive and be kept."""
        if self._closed or not self._loop.is_running():
            return
        if self.stopped is not None and self.aborted is None:
            under_way = [j.future for j in self._jobs if j.state == RUNNING]
            if under_way:
                concurrent.futures.wait(under_way, timeout=STOP_GRACE_SECONDS)
        self._closed = True

        async def shutdown() -> None:
            # every task on the loop: the engine's and any a caller put there (a server)
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.client.aclose()

        with contextlib.suppress(Exception):  # closing must never fail the run
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        self.cache.flush()
        self._loop.call_soon_threadsafe(
            self._fail_unfinished, EndpointAborted(self.aborted or "the run ended")
        )
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    # -- loop side: scheduling ------------------------------------------------

    def _plan(self, jobs: list[Job], wanted: bool, guess: bool = False) -> None:
        for job in jobs:
            if not job.queued:
                job.queued = True
                job.guess = guess
                self._jobs.append(job)
            elif not guess:
                job.guess = False
        if guess:
            self._holding = self._holding or not self._planned
        else:
            self._planned = True
            self._holding = False
            self._guesses_refused = False
            self._adopt_failures()
        if self.aborted is not None:
            self._fail_unfinished(EndpointAborted(self.aborted))
            return
        for job in jobs if wanted else ():
            self._want(job)
        if not self._workers:
            self._wake = asyncio.Event()
            self._workers = [
                self._loop.create_task(self._worker()) for _ in range(self.concurrency)
            ]
            if self.stall_timeout:
                self._workers.append(self._loop.create_task(self._stall_watch(self.stall_timeout)))
        else:
            self._kick()

    def _want(self, job: Job) -> None:
        """The test thread waits for ``job``: fetch it next."""
        job.wanted = True
        if job.future.done() or self.aborted is not None:
            return
        if job.state == PLANNED:
            self._priority.appendleft(job)
            self._kick()

    def _consume(self, job: Job) -> None:
        """A test asked for ``job``: it no longer counts as fetched ahead (loop thread)."""
        if job.consumed:
            return
        job.consumed = True
        if job.state != PLANNED:
            self._ahead -= 1
            self._kick()

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _next_job(self) -> Job | None:
        if self.stopped is not None:
            return None
        while self._priority:
            job = self._priority.popleft()
            if job.state == PLANNED:
                return job
        if self.lookahead is not None and self._ahead >= self.lookahead:
            return None  # far enough ahead of the tests; a consumed answer kicks us again
        jobs = self._jobs
        while self._scan < len(jobs):
            job = jobs[self._scan]
            if job.guess and self._guesses_refused:
                return None  # a plan kicks us again
            self._scan += 1
            if job.state == PLANNED:
                return job
        return None

    async def _worker(self) -> None:
        assert self._wake is not None
        while True:
            job = self._next_job()
            if job is None:
                if self._parked and self._busy == 0 and not self._holding:
                    self._release_parked()  # nothing else is being asked: no reply to wait for
                    continue
                self._wake.clear()
                await self._wake.wait()
                continue
            self._busy += 1
            try:
                await self._work(job)
            finally:
                self._busy -= 1

    async def _work(self, job: Job) -> None:
        """Fetch one job (or park its cached answer)."""
        job.state = RUNNING
        if not job.consumed:
            self._ahead += 1
        writes: list[Write] = []
        try:
            response = await self._fetch(job.request, writes)
        except _Parked as parked:
            job.state = PARKED
            self._parked.append((job, parked.hit))
            self.succeeded += 1
            self._streak = 0
            return
        except asyncio.CancelledError:
            self._store(writes)  # samples that did arrive are kept
            self._finish(job, error=EndpointAborted(self.aborted or "run cancelled"))
            raise
        except Exception as exc:  # classified below, never lost
            self._store(writes)
            message, fatal = describe_error(exc)
            status = getattr(exc, "status_code", None)
            self._failed(job, self._say(message), fatal, status)
            return
        self.succeeded += 1
        self._streak = 0
        if writes:
            # The test gets the answer once it is on disk: what a test saw survives a kill.
            job.state = DONE
            self._store(writes, functools.partial(_resolve, job.future, response))
        else:
            self._finish(job, response=response)

    def _failed(self, job: Job, message: str, fatal: bool, status: object) -> None:
        """A request failed for good: the job's error, and what it says of the endpoint.

        A guessed job's failure waits (unresolved) for a plan or an ask: only then is it
        known whether the run asks for it at all (:meth:`_adopt_failures`). What the
        failure says of the endpoint is judged now, in the order things happened: whether
        nothing had succeeded yet is kept with it, and it counts toward the run of
        identical failures at once (answers between failures break that run, whoever
        asked for either; replaying held failures later would count them as one run)."""
        if fatal:
            self._abort(message)
        elif job.guess:
            job.state = DONE
            refused = _refused_first(status, self.succeeded)
            self._held.append((job, message, refused))
            if refused:
                if not self._planned:  # after a plan, guesses left are sent as planned
                    self._guesses_refused = True  # no more guesses at a refusing endpoint
            else:
                self._count_failure(message)
        elif _refused_first(status, self.succeeded):
            self._abort(f"the endpoint refused the first requests: {message}")
        else:
            self._finish(job, error=EndpointError(message))
            self._count_failure(message)

    def _adopt_failures(self) -> None:
        """A plan or an ask came: the guessed jobs it took fail now as any job fails; the
        others' failures decide nothing (their futures get the error, nobody waits)."""
        held, self._held = self._held, []
        for job, message, refused in held:
            if job.future.done():
                continue
            if job.guess:
                _resolve(job.future, error=EndpointError(message))
            elif refused:
                self._abort(f"the endpoint refused the first requests: {message}")
            else:
                self._finish(job, error=EndpointError(message))  # counted when it failed

    def _store(
        self,
        writes: list[Write],
        done: Callable[[], None] | None = None,
    ) -> None:
        if writes:
            self.cache.submit(list(writes), done)
            writes.clear()
        elif done is not None:
            done()

    def _finish(
        self,
        job: Job,
        *,
        response: ModelResponse | None = None,
        error: BaseException | None = None,
    ) -> None:
        job.state = DONE
        if response is not None:
            _resolve(job.future, response)
        else:
            _resolve(job.future, error=error or EndpointError("no answer"))

    def _count_failure(self, message: str) -> None:
        """Stop after :data:`STORM` finished requests in a row failed the same way."""
        if message == self._streak_message:
            self._streak += 1
        else:
            self._streak_message, self._streak = message, 1
        if self._streak >= STORM:
            self._abort(
                f"{message} ({STORM} requests in a row failed this way, none answered "
                "between them); stopped sending"
            )

    async def _stall_watch(self, seconds: float) -> None:
        """Abort when no answer arrived for ``seconds`` while requests were in flight."""
        step = min(1.0, seconds / 4)
        while self.aborted is None:
            await asyncio.sleep(step)
            if self._in_flight and time.monotonic() - self._progress >= seconds:
                self._abort(
                    f"no answer from {self.client.endpoint} for {seconds:g} s with "
                    f"{self._in_flight} requests in flight (see --gsm8k-stall-timeout)"
                )

    def _fail_unfinished(self, error: BaseException) -> None:
        for job in self._jobs:
            if not job.future.done():
                job.state = DONE
                _resolve(job.future, error=error)

    def _abort(self, message: str) -> None:
        if self.aborted is not None:
            return
        message = self._say(message)
        # Answers in hand are answers, whatever else failed: this holds for answers parked
        # behind a head start too (graded on the server's card alone, as any parked answer
        # of a run that ends before its first fresh reply).
        self._release_parked()
        self.aborted = message
        self._fail_unfinished(EndpointAborted(message))
        self._priority.clear()
        current = asyncio.current_task(self._loop)
        for task in self._workers:
            if task is not current:
                task.cancel()

    # -- loop side: fetching ---------------------------------------------------

    async def _read(self, key: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The entry for ``key`` from the cache's reader thread, waited for with a bound."""
        future = self.cache.read(key, body)
        if future.done():
            return future.result()  # type: ignore[no-any-return]
        try:
            hit = await asyncio.wait_for(asyncio.wrap_future(future), self.read_timeout)
        except asyncio.TimeoutError:
            self.cache.stop_reading(self.read_timeout)
            return None
        return hit  # type: ignore[no-any-return]

    async def _lookup(self, key: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The cached answer to ``body`` if it may be used here; None (and counted) when it
        was recorded against a server that described itself differently."""
        hit = await self._read(key, body)
        if hit is None:
            return None
        rid = reply_identity(hit.get("model"), hit.get("system_fingerprint"))
        if hit.get("_run") == self.cache.run_id:  # another worker's answer of this run
            self._replies.setdefault(rid)
            return hit
        why = difference(hit.get("_server"), self.identity)
        current = next(iter(self._replies), None)
        if why is None and current is not None and rid not in self._replies:
            why = reply_difference(rid, current)
        if why is not None:
            self._refused.add(key)
            self._refused_why = self._refused_why or why
            return None
        return hit

    def _release_parked(self) -> None:
        """Use the parked answers that match this run's replies (all of them when none has
        arrived: nothing else is being asked); fetch the others again."""
        parked, self._parked = self._parked, []
        for job, hit in parked:
            if job.future.done():
                continue
            rid = reply_identity(hit.get("model"), hit.get("system_fingerprint"))
            if not self._replies:
                self._unchecked[rid] += 1
            elif rid not in self._replies:
                if self.stopped is not None:  # nothing is fetched any more
                    job.state = DONE
                    _resolve(job.future, error=NotRun(self.stopped))
                    continue
                job.state = PLANNED  # asked again: the lookup refuses the entry now
                if not job.consumed:
                    self._ahead -= 1
                self._priority.appendleft(job)
                continue
            self._finish(job, response=self._from_hit(hit))
        self._kick()

    def _use(self, hit: dict[str, Any], defer: bool) -> ModelResponse:
        """A usable entry's answer; an earlier run's waits (:class:`_Parked`) while this
        run has no reply to check it against yet (``defer``: the first sample only)."""
        if defer and not self._replies and hit.get("_run") != self.cache.run_id:
            raise _Parked(hit)
        return self._from_hit(hit)

    def _from_hit(self, hit: dict[str, Any]) -> ModelResponse:
        response = ModelResponse.from_json(hit)
        if hit.get("_run") != self.cache.run_id:  # not just another worker's fresh answer
            response.cached = len(response.completions)
            self.from_cache += 1
        return response

    async def _fetch(self, request: Request, writes: list[Write]) -> ModelResponse:
        """All samples of one request: one call with ``n``, more calls if ``n`` was ignored."""
        first = await self._one(
            request, sample_key(request, _first_sample(request)), writes, defer=True
        )
        if len(first.completions) >= request.n:
            first.completions = first.completions[: request.n]
            return _bounded(first)
        completions = list(first.completions)
        usage = dict(first.usage)
        cached = first.cached
        single = one_sample(request)
        for index in range(len(completions), request.n):
            extra = await self._one(single, sample_key(request, str(index)), writes, defer=False)
            completions.extend(extra.completions[:1] or [Completion(text="")])
            cached += extra.cached
            for name, value in extra.usage.items():
                usage[name] = usage.get(name, 0) + value
        return _bounded(
            ModelResponse(
                completions=completions,
                usage=usage,
                model=first.model,
                cached=cached,
                fingerprint=first.fingerprint,
            )
        )

    async def _one(
        self,
        request: Request,
        sample: str,
        writes: list[Write],
        *,
        defer: bool,
    ) -> ModelResponse:
        """One API call through the cache.

        ``defer``: when the answer is an earlier run's and no reply of this run has come to
        check it against, raise :class:`_Parked` (the worker moves on, the answer waits). A
        fresh answer goes to ``writes``: the worker hands them to the cache's writer thread.
        """
        if not self.use_store:
            self.requests_sent += 1
            return await self._call(request)
        body = request.body(self.client.model)
        key = cache_key(self.cache_endpoint, body, sample, request.wire)
        hit = await self._lookup(key, body)
        if hit is not None:
            return self._use(hit, defer)
        self.requests_sent += 1
        response = await self._call(request)
        if response.completions:
            writes.append((key, body, response.to_json(), self.identity))
        return response

    async def _call(self, request: Request) -> ModelResponse:
        """One call to the client: timed for the stall watch, its answer scrubbed."""
        if self._in_flight == 0:
            self._progress = time.monotonic()  # idle time is no stall
        self._in_flight += 1
        try:
            response = await self.client.complete(request)
        finally:
            self._in_flight -= 1
            self._progress = time.monotonic()
        response = self._clean(response)
        rid = reply_identity(response.model, response.fingerprint)
        if rid not in self._replies and self.named is not None:
            why = unnamed_reply(rid[0], self.named)
            if why is not None and "model" not in request.body(self.named):
                raise AnotherModel(unnamed_refusal(self.named, why))
        self._replies.setdefault(rid)
        if self._parked:
            self._release_parked()  # this run's first reply: the parked answers can be checked
        return response

    def _clean(self, response: ModelResponse) -> ModelResponse:
        """``response`` without the run's secrets: every string the server sent (answers,
        reasoning, finish reasons, the model name, whatever else the reply carries), so
        that a field nobody reads still never stores or prints the key."""
        scrub = self.scrub
        if not scrub:
            return response
        response.completions = [
            replace(c, **{f.name: scrub.obj(getattr(c, f.name)) for f in fields(c)})
            for c in response.completions
        ]
        for f in fields(response):
            if f.name != "completions":
                setattr(response, f.name, scrub.obj(getattr(response, f.name)))
        return response


def _resolve(
    future: concurrent.futures.Future[ModelResponse],
    result: ModelResponse | None = None,
    *,
    error: BaseException | None = None,
) -> None:
    """Set a future once, from any thread; a second outcome is dropped."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]


def _bounded(response: ModelResponse) -> ModelResponse:
    """``response``, unless its JSON (what the cache stores and the xdist channel carries) is
    over :data:`MAX_REPLY_BYTES`: the same bound with and without xdist, so the verdict is too.

    A character takes at most 6 bytes of JSON (an escape), so the exact size is measured
    only for answers that could be near the bound.
    """
    texts = [(c.text, c.reasoning or "", c.finish_reason or "") for c in response.completions]
    chars = sum(len(a) + len(b) + len(c) for a, b, c in texts) + len(response.model or "")
    if 6 * chars + 256 * (len(texts) + 1) <= MAX_REPLY_BYTES:
        return response
    size = len(to_json_bytes(response.to_json()))
    if size > MAX_REPLY_BYTES:
        raise AnswerTooLarge(
            f"the answers to this problem are over {mib(MAX_REPLY_BYTES)} as JSON "
            f"({size:,} bytes), the most one problem's answer may take"
        )
    return response


def sample_key(request: Request, sample: str) -> str:
    """The sample part of a cache key: as it always was for the first (or only) ask of a
    problem, so caches written before --gsm8k-repeats stay valid; ``r<i>:`` in front for
    repeat ``i`` of ``--gsm8k-repeats K``, whose body is the same but whose answer is not."""
    return sample if request.repeat == 0 else f"r{request.repeat}:{sample}"


def _first_sample(request: Request) -> str:
    return "0" if request.n == 1 else f"0..{request.n}"
