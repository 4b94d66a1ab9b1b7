"""The prefetching engine: one background event loop per process.

Tests run one after another on pytest's thread; model calls must not. The
engine gets the ordered list of requests for the items this process will
run, and ``concurrency`` coroutines on a background loop fetch them ahead
of the tests, in run order, jumping to whatever the test thread is waiting
for. A test mostly finds its answer ready.

Every request goes through the response cache first. Under xdist the cache's
claims make sure each request is sent by exactly one worker; the others wait
for the entry to appear.

Failures are split in two: a request that fails after the openai client's
retries is that item's error; an endpoint that is gone (the breaker opens,
or a 401/404 says the key or the model is wrong) aborts the engine, and every
unfinished item gets the same one-line message at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from pytest_gsm8k.cache import ResponseCache, cache_key
from pytest_gsm8k.client import Breaker, ModelClient, one_sample
from pytest_gsm8k.types import Completion, ModelResponse, Request

POLL_SECONDS = 0.01  # how often a waiter looks for another worker's entry


class EndpointError(Exception):
    """One item's request failed (after retries)."""


class EndpointAborted(EndpointError):
    """The endpoint is unusable; every remaining item fails with this message."""


def describe_error(exc: BaseException) -> tuple[str, bool]:
    """(one-line message, fatal?) for an exception from a model call."""
    try:
        import openai
    except ImportError:  # pragma: no cover
        return f"{type(exc).__name__}: {exc}", False
    if isinstance(exc, openai.AuthenticationError | openai.PermissionDeniedError):
        return (f"the endpoint rejected the credentials (HTTP {exc.status_code}); "
                "check the API key variable"), True
    if isinstance(exc, openai.NotFoundError):
        return f"the endpoint answered 404: {_api_message(exc)}", True
    if isinstance(exc, openai.APIStatusError):
        return f"HTTP {exc.status_code} after retries: {_api_message(exc)}", False
    if isinstance(exc, openai.APITimeoutError):
        return "request timed out after retries (see --gsm8k-timeout)", False
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        return f"connection failed after retries{detail}", False
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": "), False


def _api_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        message = body.get("message") or (body.get("error") or {}).get("message")
        if message:
            return str(message)
    return str(getattr(exc, "message", exc)).splitlines()[0]


@dataclass
class Job:
    request: Request
    position: int
    future: concurrent.futures.Future[ModelResponse] = field(
        default_factory=concurrent.futures.Future
    )
    started: bool = False


class Engine:
    """Owns the loop thread, the client and the scheduling of one model."""

    def __init__(
        self,
        client: ModelClient,
        cache: ResponseCache,
        *,
        concurrency: int,
        use_claims: bool,
        breaker: Breaker | None = None,
        samples: int = 1,
    ) -> None:
        self.client = client
        self.cache = cache
        self.concurrency = max(1, concurrency)
        self.use_claims = use_claims
        self.samples = samples
        self.jobs: list[Job] = []
        self.by_id: dict[str, Job] = {}
        self.aborted: str | None = None
        self.requests_sent = 0
        self.from_cache = 0
        self._scan = 0
        self._pending = 0
        self._priority: deque[Job] = deque()
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._wake: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._thread = threading.Thread(target=self._run_loop, name="gsm8k-engine", daemon=True)
        self._thread.start()
        if breaker is not None:
            breaker.on_open = lambda err: self._loop.call_soon_threadsafe(
                self._abort,
                f"endpoint {client.endpoint} unreachable: {breaker.count} connection failures "
                f"in a row ({err}); stopped sending",
            )

    # -- thread side -------------------------------------------------------

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    def start(self, requests: list[Request]) -> None:
        """Plan and begin fetching ``requests`` in this order."""
        with self._lock:
            for request in requests:
                self._add(request)
        self._loop.call_soon_threadsafe(self._start_workers)

    def _add(self, request: Request) -> Job:
        job = Job(request=request, position=len(self.jobs))
        self.jobs.append(job)
        self.by_id[request.problem_id] = job
        self._pending += 1
        return job

    def result(self, request: Request) -> ModelResponse:
        """The response for ``request``: usually ready; otherwise fetched first, now."""
        with self._lock:
            job = self.by_id.get(request.problem_id)
            if job is None or job.request != request:
                job = self._add(request)
            if not job.started:
                self._priority.appendleft(job)
        self._loop.call_soon_threadsafe(self._kick)
        while True:
            try:
                return job.future.result(timeout=0.5)
            except concurrent.futures.TimeoutError:
                continue

    def close(self) -> None:
        """Cancel what is left, close the client, stop the loop."""
        if not self._loop.is_running():
            return

        async def shutdown() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self.client.aclose()

        try:
            asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(timeout=10)
        except Exception:  # noqa: BLE001 - closing must never fail the run
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    # -- loop side ---------------------------------------------------------

    def _start_workers(self) -> None:
        if self._tasks:
            self._kick()
            return
        self._wake = asyncio.Event()
        self._tasks = [self._loop.create_task(self._worker()) for _ in range(self.concurrency)]

    def _kick(self) -> None:
        if not self._tasks:
            self._start_workers()
        if self._wake is not None:
            self._wake.set()

    def _next_job(self) -> Job | None:
        with self._lock:
            while self._priority:
                job = self._priority.popleft()
                if not job.started:
                    job.started = True
                    self._pending -= 1
                    return job
            if self._pending <= 0:
                return None
            for _ in range(2):  # from the scan point to the end, then once from the start
                while self._scan < len(self.jobs):
                    job = self.jobs[self._scan]
                    self._scan += 1
                    if not job.started:
                        job.started = True
                        self._pending -= 1
                        return job
                self._scan = 0
            return None

    async def _worker(self) -> None:
        assert self._wake is not None
        while True:
            job = self._next_job()
            if job is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            if job.future.done():
                continue
            try:
                response = await self._fetch(job.request)
            except asyncio.CancelledError:
                if not job.future.done():
                    job.future.set_exception(EndpointAborted(self.aborted or "run cancelled"))
                raise
            except Exception as exc:  # noqa: BLE001 - classified below, never lost
                message, fatal = describe_error(exc)
                if fatal:
                    self._abort(message)
                elif not job.future.done():
                    job.future.set_exception(EndpointError(message))
                continue
            if not job.future.done():
                job.future.set_result(response)

    def _abort(self, message: str) -> None:
        if self.aborted is not None:
            return
        self.aborted = message
        error = EndpointAborted(message)
        with self._lock:
            for job in self.jobs:
                job.started = True
                if not job.future.done():
                    job.future.set_exception(error)
            self._pending = 0
        current = asyncio.current_task(self._loop) if self._loop.is_running() else None
        for task in self._tasks:
            if task is not current:
                task.cancel()

    async def _fetch(self, request: Request) -> ModelResponse:
        """All samples of one request: one call with ``n``, more calls if ``n`` was ignored."""
        first = await self._one(request, "0" if request.n == 1 else f"0..{request.n}")
        if len(first.completions) >= request.n:
            first.completions = first.completions[: request.n]
            return first
        completions = list(first.completions)
        usage = dict(first.usage)
        cached = first.cached
        single = one_sample(request)
        for index in range(len(completions), request.n):
            extra = await self._one(single, str(index))
            completions.extend(extra.completions[:1] or [Completion(text="")])
            cached += extra.cached
            for name, value in extra.usage.items():
                usage[name] = usage.get(name, 0) + value
        return ModelResponse(completions=completions, usage=usage, model=first.model, cached=cached)

    async def _one(self, request: Request, sample: str) -> ModelResponse:
        """One API call through the cache, honouring other workers' claims."""
        body = request.body(self.client.model)
        key = cache_key(self.client.endpoint, body, sample)
        while True:
            hit = self.cache.get(key)
            if hit is not None:
                response = ModelResponse.from_json(hit)
                if hit.get("_run") != self.cache.run_id:  # not just another worker's fresh answer
                    response.cached = len(response.completions)
                    self.from_cache += 1
                return response
            if not self.use_claims:
                break
            if self.cache.claim(key):
                hit = self.cache.get(key)  # written and released between our get and claim?
                if hit is None:
                    break
                self.cache.release(key)
                continue
            # Another worker is sending it: wait for its entry, or for its claim to vanish.
            waited = 0
            while self.cache.get(key) is None and self.aborted is None:
                await asyncio.sleep(POLL_SECONDS)
                waited += 1
                if waited % 50 == 0 and not self.cache.claim_owner_alive(key):
                    break
            if self.aborted is not None:
                raise asyncio.CancelledError
        try:
            self.requests_sent += 1
            response = await self.client.complete(request)
            if response.completions:
                self.cache.put(key, body, response.to_json())
            return response
        finally:
            if self.use_claims:
                self.cache.release(key)
