"""The prefetching engine: one background event loop per process fetches the answers of the
items to run, ``concurrency`` at a time and in run order, jumping to whatever the test thread
waits for, so a test mostly finds its answer ready (docs/design.md, "Speed, the cache and
xdist"; how it stops on failures: "Failures").

Scheduling state lives on the loop thread only; the test thread posts to it with
``call_soon_threadsafe``, and does not wake it when the answer is already there (both threads
share one GIL). The engine knows nothing of xdist: the controller's answer server
(:mod:`.answers`) and the configs' driver (:mod:`.matrix`) call it. Answers cached by an
earlier run are parked until this run's first fresh reply shows whom they came from
(:mod:`pytest_gsm8k.core.identity`). All that comes from the endpoint is scrubbed of the run's
secrets where it enters.
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
from pytest_gsm8k.core.jsontext import to_json_bytes
from pytest_gsm8k.core.scrub import Scrubber, printable
from pytest_gsm8k.core.types import Completion, ModelResponse, Request
from pytest_gsm8k.runtime.bounded import mib
from pytest_gsm8k.runtime.cache import ResponseCache, Write, cache_key
from pytest_gsm8k.runtime.client import MAX_REPLY_BYTES, Breaker, ModelClient
from pytest_gsm8k.runtime.failures import (
    AnotherModel,
    AnswerTooLarge,
    EndpointAborted,
    EndpointError,
    NotRun,
    describe_error,
    refused_first,
)

PLANNED, RUNNING, PARKED, DONE = "planned", "running", "parked", "done"

#: how long one cache read may take before the cache is given up for the run (only a hung
#: network file system takes this long)
READ_SECONDS = 10.0
#: finished requests in a row failing the same way (each after its whole retry budget) before
#: the engine stops; fewer could be one burst in a shared rate-limit window
STORM = 10
#: after an early stop, how long closing waits for requests under way (paid for, and cached
#: for a resumed run), bounded so that a slow endpoint does not hold the verdict back
STOP_GRACE_SECONDS = 5.0

ReplyIdentity = tuple[str | None, str | None]


class _Parked(Exception):
    """An answer cached by an earlier run waits for this run's first reply to be checked."""


@dataclass(eq=False)
class Job:
    """One request's fetch; every field but ``request`` and ``future`` is the loop thread's."""

    request: Request
    future: concurrent.futures.Future[ModelResponse] = field(
        default_factory=concurrent.futures.Future
    )
    state: str = PLANNED
    queued: bool = False  # in the run-order list
    consumed: bool = False  # a test (or the answer server) asked for it
    #: planned on a guess (the xdist controller's head start), not yet by a plan or an ask:
    #: its failure is its own and decides nothing for the run
    guess: bool = False


class Engine:
    """Owns the loop thread, the client and the scheduling of one model.

    ``lookahead``: at most this many answers fetched ahead of those asked for (early stopping:
    what is fetched past the decision is paid for and unused). ``named``: the model a reply to
    a request without a model field must name (None: not judged). ``identity``: what
    ``GET /v1/models`` says of the model, stored with each answer.
    """

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
        self.client, self.endpoint, self.model = client, client.endpoint, client.model
        self.cache = cache
        self.scrub = scrub or Scrubber()
        self.identity: Description | None = self.scrub.obj(identity)
        self.named = named
        #: the base URL, or a name that outlives it (a server the run starts: its command)
        self.cache_endpoint = str(getattr(client, "cache_endpoint", None) or client.endpoint)
        self.read_timeout = read_timeout
        self.stall_timeout = stall_timeout
        self.breaker = breaker
        self.concurrency = max(1, concurrency)
        self.use_store = cache.persistent  # else answers stay in this process's memory
        self.lookahead = lookahead
        self.aborted: str | None = None
        self.stopped: str | None = None  # an early stop: nothing more is sent
        self.requests_sent = 0
        self.succeeded = 0  # requests answered, from the cache too
        self.by_request: dict[Request, Job] = {}  # test thread only
        # loop thread only from here on
        self._replies: dict[ReplyIdentity, None] = {}  # this run's reply identities, in order
        self._parked: list[tuple[Job, dict[str, Any]]] = []
        self._unchecked: Counter[ReplyIdentity] = Counter()  # earlier answers used unchecked
        self._refused: set[str] = set()  # keys of cached entries not reused
        self._refused_why: str | None = None
        self._busy = self._ahead = self._streak = self._in_flight = self._scan = 0
        self._streak_message = ""
        self._progress = time.monotonic()  # the last answer, or a start
        self._jobs: list[Job] = []  # in run order
        self._priority: deque[Job] = deque()
        self._planned = False  # a plan (not a guess) or an ask came
        self._held: list[tuple[Job, str, bool]] = []  # guesses' failures: (job, line, refused)
        self._guesses_refused = False  # a guess was refused first: guess no more until a plan
        self._holding = False  # parked answers wait for a real plan
        self.loop = asyncio.new_event_loop()  # the xdist answer server runs on it too
        self._wake: asyncio.Event | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False
        self.loop.set_exception_handler(self._loop_exception)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="gsm8k-engine", daemon=True
        )
        self._thread.start()
        if breaker is not None:
            breaker.fit(self.concurrency)

            def on_open(err: str, breaker: Breaker = breaker) -> None:
                # no counts or timings: every xdist worker's breaker opens on its own, and
                # the run should still end with one message shared by all its errors
                self.loop.call_soon_threadsafe(
                    self._abort,
                    f"endpoint {client.endpoint} unreachable ({err}): {breaker.threshold}+ "
                    f"connection failures in a row for {breaker.min_seconds:g}+ s; stopped sending",
                )

            breaker.on_open = on_open

    def _loop_exception(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """A cancellation in a callback while closing (Ctrl-C, SIGTERM) is no error to print."""
        if self._closed and isinstance(context.get("exception"), asyncio.CancelledError):
            return
        loop.default_exception_handler(context)

    # -- any thread ---------------------------------------------------------------------

    def start(self, requests: list[Request], *, guess: bool = False) -> None:
        """Plan and begin fetching ``requests`` in this order. ``guess``: the xdist controller's
        head start (docs/design.md): until a plan or an ask, cached answers stay parked and a
        guess's refusal decides nothing (a conftest may deselect it for the reason it fails)."""
        jobs = [self._new_job(request) for request in requests]
        self.loop.call_soon_threadsafe(self._plan, jobs, False, guess)

    def _new_job(self, request: Request) -> Job:
        job = self.by_request.get(request)
        if job is None:
            job = self.by_request[request] = Job(request=request)
        return job

    def take_warnings(self) -> list[str]:
        """Cache warnings and transport notes from the engine's threads, for the test thread."""
        taken = self.cache.take_warnings()
        if self.breaker is not None and self.breaker.notes:
            notes, self.breaker.notes[:] = list(self.breaker.notes), []
            taken += [self._say(note) for note in notes]
        return taken

    def notes(self) -> list[str]:
        """End-of-run lines: cached answers this run did not trust (once closed or idle)."""
        lines = []
        if self._refused:
            count = len(self._refused)
            were = "answer was" if count == 1 else "answers were"
            lines.append(
                f"gsm8k: {count} cached {were} recorded against a server that described "
                f"itself differently ({self._refused_why}): asked again"
            )
        replies = list(self._replies)  # copies: the loop thread may still add to them
        late = {rid: n for rid, n in list(self._unchecked.items()) if rid not in replies}
        if replies and late:
            why = reply_difference(next(iter(late)), replies[0])
            lines.append(
                f"gsm8k: {sum(late.values())} answers were graded from the cache before this "
                f"run's first fresh reply showed the server replies differently ({why}); "
                "rerun without --gsm8k-resume to ask them again"
            )
        return [self._say(line) for line in lines]

    def _say(self, message: str) -> str:
        """A message fit to print: without secrets, escapes or control characters."""
        return printable(self.scrub.text(message))

    def settle(self, request: Request) -> None:
        """``request``'s outcome is known: it no longer counts toward ``lookahead``. Under
        xdist that is when the worker's report reaches the controller (the early stop decides
        on reports), not when the worker took the answer."""
        self.loop.call_soon_threadsafe(self._consume, self.by_request.get(request))

    def result(self, request: Request) -> ModelResponse:
        """The response for ``request`` (test thread): usually ready, else fetched first now."""
        job = self.by_request.get(request)
        if self.stopped is not None and (
            job is None or (not job.future.done() and job.state == PLANNED)
        ):
            raise NotRun(self.stopped)
        if job is None:
            job = self._new_job(request)
            self.loop.call_soon_threadsafe(self._plan, [job], True)
        elif not job.future.done():
            self.loop.call_soon_threadsafe(self._want, job)
        if self.lookahead is not None:
            self.loop.call_soon_threadsafe(self._consume, job)
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
        """The run stopped early: send nothing more. Requests under way finish and are kept;
        items not fetched yet (asked for or not) raise :class:`NotRun` at once."""
        self.stopped = message

        def clear() -> None:
            self._release_parked()
            self._priority.clear()
            self._scan = len(self._jobs)
            for job in self._jobs:
                if job.state == PLANNED and not job.future.done():
                    _resolve(job.future, NotRun(message))

        if not self._closed:
            self.loop.call_soon_threadsafe(clear)

    def abort(self, message: str) -> None:
        """Stop sending; every unfinished item fails with ``message``."""
        if not self._closed:
            self.loop.call_soon_threadsafe(self._abort, message)

    def close(self) -> None:
        """Cancel what is left, close the client, stop the loop; after an early stop, the
        requests under way first get :data:`STOP_GRACE_SECONDS` to arrive."""
        if self._closed or not self.loop.is_running():
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
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(timeout=10)
        self.cache.flush()
        ended = EndpointAborted(self.aborted or "the run ended")
        self.loop.call_soon_threadsafe(self._fail_unfinished, ended)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self.loop.close()

    # -- loop thread: scheduling ----------------------------------------------------------

    async def answer(self, request: Request, *, consume: bool = True) -> ModelResponse:
        """The response for ``request``, fetched next if it is not under way. ``consume=False``:
        used elsewhere (an xdist worker), so fetched ahead until :meth:`settle`."""
        job = self.by_request.get(request)
        if self.stopped is not None and (job is None or job.state == PLANNED):
            raise NotRun(self.stopped)
        if job is None:
            job = self._new_job(request)
            self._plan([job], True)
        else:
            job.guess = False
            if self._holding:  # an ask before any plan: what is parked may go now
                self._planned, self._holding = True, False
                self._kick()
            self._adopt_failures()
            if not job.future.done():
                self._want(job)
        if consume:
            self._consume(job)
        return await asyncio.wrap_future(job.future)

    def _plan(self, jobs: list[Job], wanted: bool, guess: bool = False) -> None:
        for job in jobs:
            if not job.queued:
                job.queued, job.guess = True, guess
                self._jobs.append(job)
            elif not guess:
                job.guess = False
        if guess:
            self._holding = self._holding or not self._planned
        else:
            self._planned, self._holding, self._guesses_refused = True, False, False
            self._adopt_failures()
        if self.aborted is not None:
            self._fail_unfinished(EndpointAborted(self.aborted))
            return
        for job in jobs if wanted else ():
            self._want(job)
        if self._workers:
            self._kick()
            return
        self._wake = asyncio.Event()
        self._workers = [self.loop.create_task(self._worker()) for _ in range(self.concurrency)]
        if self.stall_timeout:
            self._workers.append(self.loop.create_task(self._stall_watch(self.stall_timeout)))

    def _want(self, job: Job) -> None:
        """A test waits for ``job``: fetch it next."""
        if not job.future.done() and self.aborted is None and job.state == PLANNED:
            self._priority.appendleft(job)
            self._kick()

    def _consume(self, job: Job | None) -> None:
        """A test asked for ``job``: it no longer counts as fetched ahead."""
        if job is not None and not job.consumed:
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
            return None  # far enough ahead; a consumed answer kicks us again
        while self._scan < len(self._jobs):
            job = self._jobs[self._scan]
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
            if job is not None:
                self._busy += 1
                try:
                    await self._work(job)
                finally:
                    self._busy -= 1
            elif self._parked and self._busy == 0 and not self._holding:
                self._release_parked()  # nothing else is being asked: no reply to wait for
            else:
                self._wake.clear()
                await self._wake.wait()

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
            self._parked.append((job, parked.args[0]))
        except asyncio.CancelledError:
            self._store(writes)  # samples that did arrive are kept
            self._finish(job, EndpointAborted(self.aborted or "run cancelled"))
            raise
        except Exception as exc:  # classified below, never lost
            self._store(writes)
            message, fatal = describe_error(exc)
            self._failed(job, self._say(message), fatal, getattr(exc, "status_code", None))
            return
        else:
            if writes:  # the test gets the answer once it is on disk: it survives a kill
                job.state = DONE
                self._store(writes, functools.partial(_resolve, job.future, response))
            else:
                self._finish(job, response)
        self.succeeded += 1
        self._streak = 0

    def _failed(self, job: Job, message: str, fatal: bool, status: object) -> None:
        """A request failed for good: the job's error, and what it says of the endpoint.

        A guessed job's failure waits for a plan or an ask (:meth:`_adopt_failures`), but is
        judged now, in the order things happened: whether anything had succeeded, and its
        place in a run of identical failures (answers between failures break that run)."""
        if fatal:
            self._abort(message)
        elif job.guess:
            job.state = DONE
            refused = refused_first(status, self.succeeded)
            self._held.append((job, message, refused))
            if not refused:
                self._count_failure(message)
            elif not self._planned:  # after a plan, guesses left are sent as planned
                self._guesses_refused = True
        elif refused_first(status, self.succeeded):
            self._abort(f"the endpoint refused the first requests: {message}")
        else:
            self._finish(job, EndpointError(message))
            self._count_failure(message)

    def _adopt_failures(self) -> None:
        """A plan or an ask came: the guessed jobs it took fail now as any job fails; the
        others' failures decide nothing (their futures get the error, nobody waits)."""
        held, self._held = self._held, []
        for job, message, refused in held:
            if job.future.done():
                continue
            if job.guess:
                _resolve(job.future, EndpointError(message))
            elif refused:
                self._abort(f"the endpoint refused the first requests: {message}")
            else:
                self._finish(job, EndpointError(message))  # counted when it failed

    def _store(self, writes: list[Write], done: Callable[[], None] | None = None) -> None:
        if writes:
            self.cache.submit(list(writes), done)
            writes.clear()
        elif done is not None:
            done()

    def _finish(self, job: Job, outcome: ModelResponse | BaseException) -> None:
        job.state = DONE
        _resolve(job.future, outcome)

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
        while self.aborted is None:
            await asyncio.sleep(min(1.0, seconds / 4))
            if self._in_flight and time.monotonic() - self._progress >= seconds:
                self._abort(
                    f"no answer from {self.client.endpoint} for {seconds:g} s with "
                    f"{self._in_flight} requests in flight (see --gsm8k-stall-timeout)"
                )

    def _fail_unfinished(self, error: BaseException) -> None:
        for job in self._jobs:
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
        self._priority.clear()
        current = asyncio.current_task(self.loop)
        for task in self._workers:
            if task is not current:
                task.cancel()

    # -- loop thread: fetching ------------------------------------------------------------

    async def _lookup(self, key: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """The cached answer to ``body`` if it may be used here: read on the cache's reader
        thread with a bound; None (and counted) when recorded against a server that described
        itself differently."""
        future = self.cache.read(key, body)
        if future.done():
            hit = future.result()
        else:
            try:
                hit = await asyncio.wait_for(asyncio.wrap_future(future), self.read_timeout)
            except asyncio.TimeoutError:
                self.cache.stop_reading(self.read_timeout)
                return None
        if hit is None:
            return None
        rid = reply_identity(hit.get("model"), hit.get("system_fingerprint"))
        if hit.get("_run") == self.cache.run_id:  # another worker's answer of this run
            self._replies.setdefault(rid)
            return hit  # type: ignore[no-any-return]
        why = difference(hit.get("_server"), self.identity)
        current = next(iter(self._replies), None)
        if why is None and current is not None and rid not in self._replies:
            why = reply_difference(rid, current)
        if why is not None:
            self._refused.add(key)
            self._refused_why = self._refused_why or why
            return None
        return hit  # type: ignore[no-any-return]

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
                    self._finish(job, NotRun(self.stopped))
                    continue
                job.state = PLANNED  # asked again: the lookup refuses the entry now
                if not job.consumed:
                    self._ahead -= 1
                self._priority.appendleft(job)
                continue
            self._finish(job, self._from_hit(hit))
        self._kick()

    def _from_hit(self, hit: dict[str, Any]) -> ModelResponse:
        response = ModelResponse.from_json(hit)
        if hit.get("_run") != self.cache.run_id:  # not just another worker's fresh answer
            response.cached = len(response.completions)
        return response

    async def _fetch(self, request: Request, writes: list[Write]) -> ModelResponse:
        """All samples of one request: one call with ``n``, more calls if ``n`` was ignored."""
        first = await self._one(request, sample_key(request, _first_sample(request)), writes, True)
        if len(first.completions) >= request.n:
            first.completions = first.completions[: request.n]
            return _bounded(first)
        completions, usage, cached = list(first.completions), dict(first.usage), first.cached
        single = replace(request, n=1)  # the endpoint ignored n: one sample a call
        for index in range(len(completions), request.n):
            extra = await self._one(single, sample_key(request, str(index)), writes, False)
            completions.extend(extra.completions[:1] or [Completion(text="")])
            cached += extra.cached
            for name, value in extra.usage.items():
                usage[name] = usage.get(name, 0) + value
        return _bounded(ModelResponse(completions, usage, first.model, cached, first.fingerprint))

    async def _one(
        self, request: Request, sample: str, writes: list[Write], defer: bool
    ) -> ModelResponse:
        """One API call through the cache; a fresh answer goes to ``writes``. ``defer``: an
        earlier run's answer with no reply of this run to check it against is parked."""
        if not self.use_store:
            self.requests_sent += 1
            return await self._call(request)
        body = request.body(self.client.model)
        key = cache_key(self.cache_endpoint, body, sample, request.wire)
        hit = await self._lookup(key, body)
        if hit is not None:
            if defer and not self._replies and hit.get("_run") != self.cache.run_id:
                raise _Parked(hit)  # args[0]: the entry
            return self._from_hit(hit)
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
        if self.scrub:  # every string the server sent, read or not
            response = ModelResponse.from_json(self.scrub.obj(response.to_json()))
        rid = reply_identity(response.model, response.fingerprint)
        if rid not in self._replies and self.named is not None:
            why = unnamed_reply(rid[0], self.named)
            if why is not None and "model" not in request.body(self.named):
                raise AnotherModel(unnamed_refusal(self.named, why))
        self._replies.setdefault(rid)
        if self._parked:
            self._release_parked()  # this run's first reply: the parked answers can be checked
        return response


def _resolve(
    future: concurrent.futures.Future[ModelResponse], outcome: ModelResponse | BaseException
) -> None:
    """Set a future once, from any thread; a second outcome is dropped."""
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def _bounded(response: ModelResponse) -> ModelResponse:
    """``response``, unless its JSON (what the cache stores and the xdist channel carries) is
    over :data:`MAX_REPLY_BYTES`: the same bound with and without xdist. A character takes at
    most 6 bytes of JSON, so only answers that could be near the bound are measured."""
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
    """The sample part of a cache key: unchanged for the first ask (caches written before
    --gsm8k-repeats stay valid), ``r<i>:`` in front for repeat ``i``."""
    return sample if request.repeat == 0 else f"r{request.repeat}:{sample}"


def _first_sample(request: Request) -> str:
    return "0" if request.n == 1 else f"0..{request.n}"
