"""The prefetching engine: one background event loop per process fetches the items' answers,
``concurrency`` at a time in run order, jumping to whatever a test waits for (docs/design.md,
"Speed, the cache and xdist"; "Failures"); the test thread posts to it. Answers cached by an
earlier run are parked until this run's first fresh reply shows whom they came from."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import threading
import time
from collections import Counter, deque
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_gsm8k.core.identity import (
    Description,
    difference,
    reply_difference,
    reply_identity,
    unnamed_refusal,
    unnamed_reply,
)
from pytest_gsm8k.core.jsontext import to_json
from pytest_gsm8k.core.scrub import Scrubber, printable
from pytest_gsm8k.core.types import Completion, ModelResponse, Request
from pytest_gsm8k.runtime.cache import ResponseCache, Write, cache_key
from pytest_gsm8k.runtime.client import MAX_REPLY_BYTES, Breaker, ModelClient, OpenAIClient, mib
from pytest_gsm8k.runtime.failures import (
    EndpointAborted,
    EndpointError,
    NotRun,
    Said,
    describe_error,
)

PLANNED, RUNNING, PARKED, DONE = "planned", "running", "parked", "done"

#: a cache read that takes longer is a hung network file system: the cache is given up
READ_SECONDS = 10.0
#: finished requests in a row failing the same way before the engine stops (fewer could be
#: one burst in a shared rate-limit window)
STORM = 10
#: after an early stop, how long closing waits for requests under way (paid for, cached)
STOP_GRACE_SECONDS = 5.0


@dataclass(eq=False)
class Job:
    """One request's fetch; every field but ``request`` and ``future`` is the loop thread's."""

    request: Request
    future: Future[ModelResponse] = field(default_factory=Future)
    state: str = PLANNED
    queued: bool = False  # in the run-order list
    consumed: bool = False  # a test (or the answer server) asked for it
    wanted: bool = False  # fetched before the run order, however far ahead
    guess: bool = False  # the xdist controller's head start, until a plan or an ask takes it
    unparked: bool = False  # its parked answer lacked samples: fetched again, never parked


class Engine:
    """One model's loop thread, client and scheduling. ``lookahead``: at most this many
    answers fetched ahead of those asked for (the early stop). ``named``: the model a reply to
    a request without a model field must name. ``identity``: the server's card."""

    def __init__(
        self,
        client: ModelClient,
        cache: ResponseCache,
        *,
        concurrency: int,
        lookahead: int | None = None,
        scrub: Scrubber | None = None,
        stall_timeout: float | None = None,
        identity: Description | None = None,
        named: str | None = None,
    ) -> None:
        self.client, self.endpoint, self.model = client, client.endpoint, client.model
        self.cache, self.scrub = cache, scrub or Scrubber(None, None, ())
        self.identity: Description | None = self.scrub.obj(identity)
        self.named, self.stall_timeout = named, stall_timeout
        self.cache_endpoint = str(getattr(client, "cache_endpoint", None) or client.endpoint)
        self.concurrency, self.lookahead = max(1, concurrency), lookahead
        self.aborted: str | None = None
        self.stopped: str | None = None  # an early stop: nothing more is sent
        self.succeeded = 0  # answered, from the cache too
        self.by_request: dict[Request, Job] = {}
        # the loop thread's from here on
        self._replies: dict[tuple[str | None, str | None], None] = {}  # this run's, in order
        self._parked: list[tuple[Job, dict[str, Any]]] = []
        self._unchecked: Counter[tuple[str | None, str | None]] = Counter()
        self._refused: dict[str, str] = {}  # cached entries not reused: why, by key
        self._busy = self._ahead = self._in_flight = self._noted = 0
        self._recent: deque[str | None] = deque(maxlen=STORM)  # how requests ended: None, answered
        self._progress = time.monotonic()  # the last answer, or a start
        self._queue: deque[Job] = deque()  # in run order, the wanted ones in front
        self._planned = False  # a plan (not a guess) or an ask came: parked answers may go
        #: refused guesses, their lines, until a plan or an ask takes them (no guess is sent
        #: meanwhile, unless a plan came before)
        self._held: list[tuple[Job, str]] = []
        self.loop = asyncio.new_event_loop()  # the xdist answer server runs on it too
        self._wake = asyncio.Event()  # bound to the loop on its first wait
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False
        self.loop.set_exception_handler(self._loop_exception)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="gsm8k-engine", daemon=True
        )
        self._thread.start()
        self.breaker = breaker = getattr(client, "breaker", None) or Breaker()
        # no counts or timings: every xdist worker's breaker opens on its own, and the run
        # should still end with one message shared by all its errors
        breaker.on_open = lambda err: self.loop.call_soon_threadsafe(
            self._abort,
            f"endpoint {client.endpoint} unreachable ({err}): {breaker.threshold}+ "
            f"connection failures in a row for {breaker.min_seconds:g}+ s; stopped sending",
        )

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        # a cancellation in a callback while closing (Ctrl-C, SIGTERM) is no error to print
        if not (self._closed and isinstance(context.get("exception"), asyncio.CancelledError)):
            loop.default_exception_handler(context)

    # -- any thread ---------------------------------------------------------------------

    def start(self, requests: list[Request], *, guess: bool = False) -> None:
        """Plan ``requests`` in this order; ``guess``: the xdist controller's head start."""
        jobs = [self.by_request.setdefault(r, Job(r)) for r in requests]
        self.loop.call_soon_threadsafe(self._plan, jobs, guess)

    def take_warnings(self) -> list[str]:
        """Cache warnings and transport notes, for the test thread."""
        notes = list(self.breaker.notes.values())[self._noted :]
        self._noted += len(notes)
        return self.cache.take_warnings() + [self._say(note) for note in notes]

    def notes(self) -> list[str]:
        """End-of-run lines: cached answers this run did not trust (once closed or idle)."""
        lines = []
        if count := len(self._refused):
            were = "answer was" if count == 1 else "answers were"
            lines.append(
                f"gsm8k: {count} cached {were} recorded against a server that described "
                f"itself differently ({next(iter(self._refused.values()))}): asked again"
            )
        replies = list(self._replies)  # copies: the loop thread may still add to them
        late = {rid: n for rid, n in list(self._unchecked.items()) if rid not in replies}
        if replies and late:
            lines.append(
                f"gsm8k: {sum(late.values())} answers were graded from the cache before this "
                "run's first fresh reply showed the server replies differently "
                f"({reply_difference(next(iter(late)), replies[0])}); "
                "rerun without --gsm8k-resume to ask them again"
            )
        return [self._say(line) for line in lines]

    def _say(self, message: str) -> str:
        return printable(self.scrub.text(message, cut=True))  # a reply's excerpt ends some

    def settle(self, request: Request) -> None:
        """``request``'s outcome is known: it no longer counts toward ``lookahead`` (under
        xdist when the worker's report reaches the controller, where the early stop decides)."""
        if (job := self.by_request.get(request)) is not None:
            self.loop.call_soon_threadsafe(self._consume, job)

    def result(self, request: Request) -> ModelResponse:
        """The response for ``request`` (test thread): usually ready, else fetched first now.
        An answer already there is taken without waking the loop (both threads share a GIL)."""
        job = self._job(request)
        consume = self.lookahead is not None and not job.consumed
        if consume or not job.future.done():
            self.loop.call_soon_threadsafe(self._ask, job, consume)
        while True:
            try:
                return job.future.result(timeout=0.5)
            except concurrent.futures.TimeoutError:
                if self._closed:
                    raise EndpointAborted(self.aborted or "the engine was closed") from None

    async def answer(self, request: Request, *, consume: bool = False) -> ModelResponse:
        """:meth:`result` on the loop thread. Not ``consume``: used elsewhere (an xdist worker),
        so it counts as fetched ahead until :meth:`settle`; the matrix's own test thread
        consumes as :meth:`result` does."""
        job = self._job(request)
        self._ask(job, consume)
        return await asyncio.wrap_future(job.future)

    def _job(self, request: Request) -> Job:
        job = self.by_request.get(request)
        unsent = job is None or (job.state == PLANNED and not job.future.done())
        if self.stopped is not None and unsent:
            raise NotRun(self.stopped)
        return job or self.by_request.setdefault(request, Job(request))

    def ready(self, request: Request) -> ModelResponse | None:
        """The answer for ``request`` if it has arrived (never waits, never fetches)."""
        job = self.by_request.get(request)
        done = job is not None and job.future.done() and job.future.exception() is None
        return job.future.result() if job is not None and done else None

    def stop(self, message: str) -> None:
        """The run stopped early: send nothing more. Requests under way finish and are kept;
        items not fetched yet raise :class:`NotRun` at once."""
        self.stopped = message

        def clear() -> None:
            self._release_parked()
            self._queue.clear()
            for job in list(self.by_request.values()):
                if job.state == PLANNED:
                    _resolve(job.future, NotRun(message))

        if not self._closed:
            self.loop.call_soon_threadsafe(clear)

    def abort(self, message: str) -> None:
        """Stop sending; every unfinished item fails with ``message``."""
        if not self._closed:
            self.loop.call_soon_threadsafe(self._abort, message)

    def close(self) -> None:
        """Cancel what is left, close the client, stop the loop (after an early stop, past
        :data:`STOP_GRACE_SECONDS` for the requests under way)."""
        if self._closed or not self.loop.is_running():
            return
        if self.stopped is not None and self.aborted is None:
            under_way = [j.future for j in list(self.by_request.values()) if j.state == RUNNING]
            concurrent.futures.wait(under_way, timeout=STOP_GRACE_SECONDS)
        self._closed = True

        async def shutdown() -> None:
            # every task on the loop: the engine's and any a caller put there (a server)
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.client.aclose()

        with contextlib.suppress(Exception):  # closing must never fail the run
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(timeout=10)
        self.cache.flush()
        ended = EndpointAborted(self.aborted or "the run ended")
        self.loop.call_soon_threadsafe(self._fail_unfinished, ended)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()

    # -- loop thread: scheduling ----------------------------------------------------------

    def _ask(self, job: Job, consume: bool) -> None:
        """A test (or a worker) waits for ``job``: taken from any guess, fetched next."""
        self._plan([job])
        self._want(job)
        if consume:
            self._consume(job)

    def _plan(self, jobs: list[Job], guess: bool = False) -> None:
        for job in jobs:
            if not job.queued:
                job.queued, job.guess = True, guess
                self._queue.append(job)
            elif not guess:
                job.guess = False
        if not guess:  # a refused guess this plan took ends the run as a planned request would
            self._planned, held, self._held = True, self._held, []
            for job, message in held:  # the others' futures get their error (nobody waits)
                if job.guess:
                    _resolve(job.future, EndpointError(message))
                else:
                    self._abort(f"the endpoint refused the first requests: {message}")
        if self.aborted is not None:
            self._fail_unfinished(EndpointAborted(self.aborted))
            return
        if not self._workers:
            self._workers = [self.loop.create_task(self._worker()) for _ in range(self.concurrency)]
            if self.stall_timeout:
                self._workers.append(self.loop.create_task(self._stall_watch(self.stall_timeout)))
        self._wake.set()

    def _want(self, job: Job) -> None:
        if not job.future.done() and self.aborted is None and job.state == PLANNED:
            job.wanted = True
            self._queue.appendleft(job)

    def _consume(self, job: Job) -> None:
        if not job.consumed:
            job.consumed = True
            if job.state != PLANNED:
                self._ahead -= 1
                self._wake.set()

    def _next_job(self) -> Job | None:
        """The wanted jobs first, then the run order: only so far ahead (a consumed answer
        kicks us again), and no guess after a refused one (a plan kicks us again)."""
        full = self.lookahead is not None and self._ahead >= self.lookahead
        while self._queue and self.stopped is None:
            job = self._queue[0]
            held = full or (job.guess and bool(self._held) and not self._planned)
            if job.state == PLANNED and held and not job.wanted:
                return None
            if self._queue.popleft().state == PLANNED:
                return job
        return None

    async def _worker(self) -> None:
        while True:
            if (job := self._next_job()) is not None:
                self._busy += 1
                try:
                    await self._work(job)
                finally:
                    self._busy -= 1
            elif self._parked and self._busy == 0 and self._planned:
                self._release_parked()  # nothing else is being asked: no reply to wait for
            else:
                self._wake.clear()
                await self._wake.wait()

    async def _work(self, job: Job) -> None:
        job.state = RUNNING
        if not job.consumed:
            self._ahead += 1
        writes: list[Write] = []
        try:
            response = await self._fetch(job, writes)
        except asyncio.CancelledError:
            self.cache.submit(writes)  # samples that did arrive are kept
            self._finish(job, EndpointAborted(self.aborted or "run cancelled"))
            raise
        except Exception as exc:  # classified here, never lost
            self.cache.submit(writes)
            try:
                message, fatal, refused = describe_error(exc, isinstance(self.client, OpenAIClient))
            except Exception as odd:  # a user's exception that cannot be said: never a hang
                said = f"{type(exc).__name__} ({type(odd).__name__})"
                message, fatal, refused = said, False, False
            self._failed(job, self._say(message), fatal, refused)
            return
        if response is not None:  # else parked: an earlier run's answer, an answer all the same
            job.state = DONE
            # the test gets the answer once it is on disk: it survives a kill
            self.cache.submit(writes, functools.partial(_resolve, job.future, response))
        self.succeeded += 1
        self._recent.append(None)

    def _failed(self, job: Job, message: str, fatal: bool, refused: bool) -> None:
        """A request failed for good: the job's error, and what it says of the endpoint. A
        guess is judged as it happened (its place in a run of failures), but a refusal of a
        guess before any answer waits for a plan or an ask (:meth:`_plan`)."""
        if fatal:
            self._abort(message)
        elif not refused or self.succeeded:
            self._finish(job, EndpointError(message))
            self._recent.append(message)  # STORM finished requests in a row failed this way
            if self._recent.count(message) == STORM:
                self._abort(
                    f"{message} ({STORM} requests in a row failed this way, none answered "
                    "between them); stopped sending"
                )
        elif job.guess:
            job.state = DONE
            self._held.append((job, message))
        else:
            self._abort(f"the endpoint refused the first requests: {message}")

    def _finish(self, job: Job, outcome: ModelResponse | BaseException) -> None:
        job.state = DONE
        _resolve(job.future, outcome)

    async def _stall_watch(self, seconds: float) -> None:
        while self.aborted is None:
            await asyncio.sleep(min(1.0, seconds / 4))
            if self._in_flight and time.monotonic() - self._progress >= seconds:
                self._abort(
                    f"no answer from {self.client.endpoint} for {seconds:g} s with "
                    f"{self._in_flight} requests in flight (see --gsm8k-stall-timeout)"
                )

    def _fail_unfinished(self, error: BaseException) -> None:
        for job in list(self.by_request.values()):
            if not job.future.done():
                self._finish(job, error)

    def _abort(self, message: str) -> None:
        if self.aborted is not None:
            return
        message = self._say(message)
        # answers in hand are answers, whatever else failed (parked ones are graded on the
        # server's card alone, as in any run that ends before its first fresh reply)
        self._release_parked()
        self.aborted = message
        self._fail_unfinished(EndpointAborted(message))
        self._queue.clear()
        for task in self._workers:
            if task is not asyncio.current_task(self.loop):
                task.cancel()

    # -- loop thread: fetching ------------------------------------------------------------

    async def _lookup(self, key: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The cached answer to ``body`` if it may be used here (read within
        :data:`READ_SECONDS`); None, and counted, when its server described itself otherwise."""
        future = self.cache.read(key, body)
        try:
            hit = await asyncio.wait_for(asyncio.wrap_future(future), READ_SECONDS)
        except TimeoutError:
            self.cache.stop_reading(READ_SECONDS)
            return None
        if hit is None:
            return None
        rid = reply_identity(hit.get("model"), hit.get("system_fingerprint"))
        if hit.get("_run") == self.cache.run_id:  # another worker's answer of this run
            self._replies.setdefault(rid)
            return hit
        why = difference(hit.get("_server"), self.identity)
        if why is None and self._replies and rid not in self._replies:
            why = reply_difference(rid, next(iter(self._replies)))
        if why is not None:
            self._refused[key] = why
            return None
        return hit

    def _release_parked(self) -> None:
        """Use the parked answers that match this run's replies (all of them when none has
        arrived: nothing else is being asked); fetch the others again."""
        parked, self._parked = self._parked, []
        for job, hit in parked:
            rid = reply_identity(hit.get("model"), hit.get("system_fingerprint"))
            if not self._replies:
                self._unchecked[rid] += 1
            # the first call's samples only, where the endpoint ignored n: fetched again whole
            whole = len(hit["completions"]) >= job.request.n
            if whole and (not self._replies or rid in self._replies):
                self._finish(job, self._from_hit(hit))
            elif self.stopped is not None:  # nothing is fetched any more
                self._finish(job, NotRun(self.stopped))
            else:  # asked again: the lookup refuses the entry now, or the rest is read or asked
                job.state, job.unparked = PLANNED, True
                if not job.consumed:
                    self._ahead -= 1
                self._want(job)
        self._wake.set()

    def _from_hit(self, hit: dict[str, Any]) -> ModelResponse:
        response = ModelResponse.from_json(hit)
        if hit.get("_run") != self.cache.run_id:  # not just another worker's fresh answer
            response.cached = len(response.completions)
        return response

    async def _fetch(self, job: Job, writes: list[Write]) -> ModelResponse | None:
        """All samples of one request: one call with ``n``, more calls if ``n`` was ignored.
        None: parked, an earlier run's answer with no reply of this run to check it against."""
        request = job.request
        first = await self._one(request, "0" if request.n == 1 else f"0..{request.n}", writes, job)
        if first is None:
            return None
        completions, usage, cached = list(first.completions), Counter(first.usage), first.cached
        for index in range(len(completions), request.n):  # n ignored: one sample a call
            extra = await self._one(replace(request, n=1), str(index), writes)
            assert extra is not None
            completions.extend(extra.completions[:1] or [Completion(text="")])
            cached += extra.cached
            usage.update(extra.usage)
        kept = completions[: request.n]
        response = ModelResponse(kept, dict(usage), first.model, cached, first.fingerprint)
        # its JSON is what the cache stores and the xdist channel carries
        if (size := len(to_json(response.to_json()).encode())) > MAX_REPLY_BYTES:
            raise Said(
                f"the answers to this problem are over {mib(MAX_REPLY_BYTES)} as JSON "
                f"({size:,} bytes), the most one problem's answer may take"
            )
        return response

    async def _one(
        self, request: Request, sample: str, writes: list[Write], park: Job | None = None
    ) -> ModelResponse | None:
        """One API call through the cache; a fresh answer goes to ``writes``."""
        if not self.cache.persistent:  # answers stay in this process's memory
            return await self._call(request)
        body = request.body(self.client.model)
        key = cache_key(self.cache_endpoint, body, sample, request.wire, request.repeat)
        hit = await self._lookup(key, body)
        if hit is not None:
            earlier = hit.get("_run") != self.cache.run_id
            if park is not None and not park.unparked and not self._replies and earlier:
                park.state = PARKED
                self._parked.append((park, hit))
                return None
            return self._from_hit(hit)
        response = await self._call(request)
        if response.completions:
            writes.append((key, body, response.to_json(), self.identity))
        return response

    async def _call(self, request: Request) -> ModelResponse:
        if self._in_flight == 0:
            self._progress = time.monotonic()  # idle time is no stall
        self._in_flight += 1
        try:
            response = await self.client.complete(request)
        finally:
            self._in_flight -= 1
            self._progress = time.monotonic()
        if self.scrub:  # every string the server sent, read or not
            response = ModelResponse.from_json(self.scrub.obj(response.to_json()))
        rid = reply_identity(response.model, response.fingerprint)
        if rid not in self._replies and self.named is not None:
            why = unnamed_reply(rid[0], self.named)
            if why is not None and "model" not in request.body(self.named):
                raise Said(unnamed_refusal(self.named, why), fatal=True)
        self._replies.setdefault(rid)
        if self._parked:
            self._release_parked()  # this run's first reply: the parked answers can be checked
        return response


def _resolve(future: Future[ModelResponse], outcome: ModelResponse | BaseException) -> None:
    """Set a future once, from any thread; a second outcome is dropped."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
