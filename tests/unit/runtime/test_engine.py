"""The engine on its own, driven with scripted clients: priority, early stop, one item's
error, fatal errors; the circuit breaker; how errors are described."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer
from helpers import response_cache, wait_until

from pytest_gsm8k.core.types import Completion, ModelResponse, Request, stable_hash
from pytest_gsm8k.runtime.cache import ResponseCache, cache_key
from pytest_gsm8k.runtime.client import Breaker, OpenAIClient
from pytest_gsm8k.runtime.engine import Engine
from pytest_gsm8k.runtime.failures import EndpointAborted, EndpointError, NotRun


class ScriptedClient:
    """A model client whose answers and failures the test decides."""

    endpoint = "scripted:"
    model = "scripted"
    persistent_cache = False

    def __init__(self, delay: float = 0.0, fail: dict[str, Exception] | None = None) -> None:
        self.delay = delay
        self.fail = fail or {}
        self.order: list[str] = []
        self.closed = False

    async def complete(self, request: Request) -> ModelResponse:
        self.order.append(request.problem_id)
        await asyncio.sleep(self.delay)
        if request.problem_id in self.fail:
            raise self.fail[request.problem_id]
        return ModelResponse(completions=[Completion(text=f"#### {request.problem_id[-1]}")])

    async def aclose(self) -> None:
        self.closed = True


def requests(n: int) -> list[Request]:
    return [
        Request(problem_id=f"p{i:03d}", api="chat", messages=(("user", f"q{i}"),)) for i in range(n)
    ]


@pytest.fixture
def memory_cache(tmp_path: Path) -> ResponseCache:
    return response_cache(tmp_path / "c", "run", persistent=False)


def test_the_item_a_test_waits_for_jumps_the_queue(memory_cache: ResponseCache) -> None:
    client = ScriptedClient(delay=0.05)
    engine = Engine(client, memory_cache, concurrency=1)
    planned = requests(30)
    try:
        engine.start(planned)
        assert engine.result(planned[25]).completions[0].text == "#### 5"
        assert client.order.index("p025") <= 2  # fetched next, not after 25 others
        assert engine.result(planned[0]).completions
    finally:
        engine.close()
    assert client.closed
    assert len(client.order) <= 30
    assert not (memory_cache.root / "responses").exists()  # no-cache: memory only


def test_an_engine_with_no_plan_fetches_each_item_when_asked_and_nothing_more(
    memory_cache: ResponseCache,
) -> None:
    """How a worker calls its own model under xdist: one item at a time, nothing planned or
    prefetched (xdist spreads the items over the workers)."""
    client = ScriptedClient(delay=0.01)
    engine = Engine(client, memory_cache, concurrency=4)
    asked = requests(6)
    try:
        engine.start([])
        for count, request in enumerate(asked[:3], start=1):
            assert engine.result(request).completions[0].text == f"#### {count - 1}"
            assert client.order == [r.problem_id for r in asked[:count]]  # that one, no other
        engine.stop("decided")
        with pytest.raises(NotRun, match=r"^decided$"):
            engine.result(asked[3])  # never asked before the stop: not run
        assert engine.result(asked[0]).completions  # an answer in hand stays one
    finally:
        engine.close()
    assert len(client.order) == 3


def test_an_answer_another_worker_stored_is_read_not_asked_again(tmp_path: Path) -> None:
    """Two workers of one run on the shared persistent cache, each asked per item: the one
    that asks second for the same request finds the first one's entry (what the shared
    cache gives workers that call a model of their own, when the timing allows)."""
    first_client, second_client = ScriptedClient(), ScriptedClient()
    first = Engine(first_client, response_cache(tmp_path / "c", "run"), concurrency=2)
    second = Engine(second_client, response_cache(tmp_path / "c", "run"), concurrency=2)
    [request, other] = requests(2)
    try:
        assert first.result(request).completions[0].text == "#### 0"  # on disk once returned
        answer = second.result(request)
        assert answer.completions[0].text == "#### 0"
        assert answer.cached == 0  # this run's own entry, not an earlier run's
        assert second.result(other).completions[0].text == "#### 1"
    finally:
        first.close()
        second.close()
    assert first_client.order == ["p000"]
    assert second_client.order == ["p001"]
    assert (len(first_client.order), len(second_client.order)) == (1, 1)


def test_an_item_asked_for_just_before_an_early_stop_is_not_run_at_once(
    memory_cache: ResponseCache,
) -> None:
    """The stop drops the queue; a test (or an xdist worker's answer) already waiting for a
    job that had not started must learn it is not run, not wait for a fetch that never comes."""
    client = ScriptedClient(delay=0.5)
    engine = Engine(client, memory_cache, concurrency=1)
    planned = requests(5)
    outcome: list[BaseException | ModelResponse] = []

    def wait_for_the_last() -> None:
        try:
            outcome.append(engine.result(planned[4]))
        except BaseException as exc:  # the test inspects it
            outcome.append(exc)

    try:
        engine.start(planned)
        assert wait_until(lambda: client.order, 5)
        waiter = threading.Thread(target=wait_for_the_last)
        waiter.start()
        time.sleep(0.1)  # p000 under way (0.5 s), p004 first in the queue, not started
        engine.stop("decided")
        waiter.join(timeout=3)
        assert not waiter.is_alive(), "still waiting for an answer that will never be fetched"
        assert isinstance(outcome[0], NotRun), (outcome, client.order)
        assert str(outcome[0]) == "decided"
        assert client.order == ["p000"]
    finally:
        engine.close()


def test_one_failed_request_is_that_items_error_only(memory_cache: ResponseCache) -> None:
    client = ScriptedClient(fail={"p003": RuntimeError("boom\nsecond line")})
    engine = Engine(client, memory_cache, concurrency=4)
    planned = requests(8)
    try:
        engine.start(planned)
        with pytest.raises(EndpointError, match=r"^RuntimeError: boom$") as info:
            engine.result(planned[3])
        assert not isinstance(info.value, EndpointAborted)
        assert all(engine.result(r).completions for r in planned if r.problem_id != "p003")
    finally:
        engine.close()


def test_fatal_error_aborts_every_unfinished_item_with_one_message(
    memory_cache: ResponseCache,
    server: FakeOpenAIServer,
) -> None:
    import openai

    reply = openai.AuthenticationError("bad key", response=_fake_response(401), body=None)
    client = ScriptedClient(delay=0.02, fail={"p002": reply})
    engine = Engine(client, memory_cache, concurrency=2)
    planned = requests(200)
    try:
        engine.start(planned)
        errors = set()
        for request in planned[2:]:
            with pytest.raises(EndpointAborted) as info:
                engine.result(request)
            errors.add(str(info.value))
        assert len(errors) == 1
        assert "credentials" in errors.pop()
        assert len(client.order) < 20  # it stopped sending
    finally:
        engine.close()


def _fake_response(status: int) -> Any:
    import httpx2 as httpx  # what this openai release is built on

    return httpx.Response(status, request=httpx.Request("POST", "http://x/v1/chat/completions"))


class FakeClock:
    """A monotonic clock that moves only when the test says so (the client module's ``time``)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


def test_breaker_needs_a_streak_in_numbers_and_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_gsm8k.runtime import client as client_module

    clock = FakeClock()
    monkeypatch.setattr(client_module, "time", clock)
    opened: list[str] = []
    breaker = Breaker(threshold=8, min_seconds=2.0)
    breaker.on_open = opened.append
    for _ in range(20):  # many at once: the requests in flight when a server dies
        breaker.failure(ConnectionError("refused"))
    clock.now = 1.5
    breaker.failure(ConnectionError("refused"))
    assert not opened  # numbers, but not yet 2 s: a blip the client's retries may absorb
    breaker.success()
    clock.now = 10.0
    breaker.failure(ConnectionError("refused"))
    assert not opened
    assert breaker.count == 1  # the success reset the streak
    clock.now = 12.0
    for _ in range(6):
        breaker.failure(ConnectionError("refused"))
    assert not opened
    assert breaker.count == 7  # 2 s since the streak began, 7 failures
    breaker.failure(ConnectionError("refused"))
    assert opened == ["ConnectionError: refused"]
    # a client's breaker: no more failures in a row than requests in flight, 3 at least
    for concurrency, threshold in ((1, 3), (5, 5), (64, 8)):
        client = OpenAIClient(
            model="m",
            base_url="http://x/v1",
            api_key=None,
            timeout=1,
            max_retries=0,
            concurrency=concurrency,
        )
        assert client.breaker.threshold == threshold


@pytest.mark.parametrize(
    ("url", "body", "expected"),
    [
        (
            "http://alice:pw@h:8000/chat/completions?x=1",
            {"detail": "Not Found"},
            "POST http://h:8000/chat/completions answered 404 (the base URL http://h:8000 does "
            "not end in /v1: try --gsm8k-base-url=http://h:8000/v1): Not Found",
        ),
        (
            "http://h:8000/api/completions",
            {"detail": "Not Found"},
            "POST http://h:8000/api/completions answered 404 (the base URL http://h:8000/api "
            "does not end in /v1: try --gsm8k-base-url=http://h:8000/api/v1): Not Found",
        ),
        (
            "http://h:8000/v1/chat/completions",
            {"message": "The model `x` does not exist"},
            "POST http://h:8000/v1/chat/completions answered 404: The model `x` does not exist",
        ),
    ],
)
def test_a_404_names_the_url_and_suggests_v1(url: str, body: dict[str, str], expected: str) -> None:
    import httpx2 as httpx
    import openai

    from pytest_gsm8k.runtime.failures import describe_error

    request = httpx.Request("POST", url)
    response = httpx.Response(404, request=request, json=body)
    error = openai.NotFoundError("Error code: 404", response=response, body=body)
    assert describe_error(error) == (expected, True, False)


@pytest.mark.parametrize(
    ("url", "status", "said"),
    [
        ("http://h:8000/chat/completions", 404, "the base URL http://h:8000 does not end in /v1"),
        ("http://h:8000/v1/chat/completions", 400, "--gsm8k-max-tokens none"),
    ],
)
def test_a_key_the_servers_message_is_cut_inside_is_never_shown(
    url: str, status: int, said: str
) -> None:
    """A server's message is quoted to 200 characters; the scrubber hides a key the cut falls
    inside only at the end of the line, so the message ends the line whatever hint the own
    client adds (the /v1 fix of a 404, the reasoning model's options of a 400)."""
    import httpx2 as httpx
    import openai

    from pytest_gsm8k.core.scrub import Scrubber
    from pytest_gsm8k.runtime.failures import describe_error

    key = "sk-test-" + "K" * 40
    refusal = "Unsupported parameter: 'max_tokens' is not supported, use 'max_completion_tokens'"
    text = f"{refusal} " + "x" * (184 - len(refusal)) + f" key={key}"  # the cut keeps 10 of it
    assert text[190:200] == key[:10]
    response = httpx.Response(status, request=httpx.Request("POST", url), json={"message": text})
    exc = openai.APIStatusError(text, response=response, body={"message": text})
    line = Scrubber(key, None, ()).text(describe_error(exc)[0], cut=True)
    assert said in line, line
    assert key[:6] not in line, line


def test_describe_error_says_after_retries_only_when_the_status_is_retried() -> None:
    import httpx2 as httpx
    import openai

    from pytest_gsm8k.runtime.failures import describe_error

    def status_error(code: int) -> openai.APIStatusError:
        request = httpx.Request("POST", "http://x/v1/chat/completions")
        response = httpx.Response(code, request=request, json={"error": {"message": "boom"}})
        return openai.APIStatusError("boom", response=response, body={"message": "boom"})

    # (a 4xx no retry changes is a refusal: before any answer, the run ends)
    assert describe_error(status_error(400)) == ("HTTP 400: boom", False, True)
    assert describe_error(status_error(422)) == ("HTTP 422: boom", False, True)
    assert describe_error(status_error(429)) == ("HTTP 429 after retries: boom", False, False)
    assert describe_error(status_error(503)) == ("HTTP 503 after retries: boom", False, False)


def test_a_status_code_of_0_is_said_as_no_http_status_never_as_http_0() -> None:
    """A client that sets ``status_code=0`` had no HTTP answer to give a status: the item's
    error says so, with the number it was given, and no HTTP status is made up."""
    from pytest_gsm8k.runtime.failures import WireFailure, describe_error

    said = describe_error(WireFailure("http://x/v1/completions", 0, {"message": "reset"}))
    assert said == ("no HTTP status (status_code 0): reset", False, False)
    assert "HTTP 0" not in said[0]


def test_either_clients_failures_are_worded_alike_and_a_users_exception_as_it_is() -> None:
    """describe_error reads both HTTP clients' failures by their attributes (the vllm preset's
    client never imports openai): a timeout, a failed connection, an HTTP status; a user's
    callable's exception is said as it is."""
    import httpx2 as httpx
    import openai

    from pytest_gsm8k.runtime.failures import WireFailure, describe_error

    request = httpx.Request("POST", "http://x/v1/chat/completions")
    timed_out = ("request timed out after retries (see --gsm8k-timeout)", False, False)
    assert describe_error(openai.APITimeoutError(request)) == timed_out
    assert describe_error(WireFailure("u", None, "timed out", timed_out=True)) == timed_out
    for failed in (openai.APIConnectionError(request=request), WireFailure("u", None, "no")):
        failed.__cause__ = ConnectionRefusedError("refused")
        expected = "connection failed after retries (ConnectionRefusedError: refused)"
        assert describe_error(failed) == (expected, False, False)
    status = WireFailure("http://x/v1/completions", 503, {"error": {"message": "busy"}})
    assert describe_error(status) == ("HTTP 503 after retries: busy", False, False)
    assert describe_error(WireFailure("u", 401, "no"))[1] is True
    assert describe_error(TimeoutError("mine")) == ("TimeoutError: mine", False, False)

    class UsersError(Exception):  # a user's client's: no body, so not read as an HTTP failure
        request, status_code = object(), 503

    assert describe_error(UsersError("down")) == ("UsersError: down", False, False)


def test_a_users_functions_http_failure_is_said_without_the_plugin_clients_hints() -> None:
    """A user's function (its own SDK call, e.g. anthropic's, shaped like openai's errors) is
    classified as the plugin's own client would be (a 401, 403 or 404 ends the run), but
    worded with the status and the server's message only: the hints name options and the
    key variable the plugin's own client reads, which the function never did."""
    import httpx2 as httpx
    import openai

    from pytest_gsm8k.runtime.failures import describe_error

    request = httpx.Request("POST", "http://h:8000/chat/completions")

    def error(status: int, message: str) -> openai.APIStatusError:
        response = httpx.Response(status, request=request, json={"message": message})
        return openai.APIStatusError(message, response=response, body={"message": message})

    refusal = "Unsupported parameter: 'max_tokens' is not supported, use 'max_completion_tokens'"
    for exc, users in [
        (error(401, "invalid x-api-key"), "the endpoint rejected the credentials (HTTP 401): "),
        (error(403, "no access"), "the endpoint rejected the credentials (HTTP 403): no access"),
        (error(404, "Not Found"), "POST http://h:8000/chat/completions answered 404: Not Found"),
        (error(400, refusal), f"HTTP 400: {refusal}"),
        (openai.APITimeoutError(request), "request timed out after retries"),
    ]:
        own, theirs = describe_error(exc), describe_error(exc, own=False)
        assert theirs[0].startswith(users), theirs
        # the same classification, but a function's 404 may be its own lookup's: refused
        # (it ends the run before any answer; after one, it is the item's error)
        assert theirs[1:] == ((False, True) if own[0].startswith("POST") else own[1:])
        assert theirs[0] != own[0]  # the plugin's own client's line has the hint
        for hint in ("--gsm8k", "API key variable"):
            assert hint not in theirs[0], theirs
    said = describe_error(error(401, "invalid x-api-key"), own=False)[0]
    assert said == "the endpoint rejected the credentials (HTTP 401): invalid x-api-key"


class _UsersError(Exception):
    """Has a ``body`` and a 404 ``status_code`` but a ``request`` naming no method or URL:
    not an HTTP client's failure."""

    body, request, status_code = {"detail": "no such model"}, None, 404


class _Unsayable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no words")


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (_UsersError("gone"), r"_UsersError: gone$"),
        (_Unsayable(), r"^_Unsayable \(RuntimeError\)$"),
    ],
    ids=["body-but-no-usable-request", "str-raises"],
)
def test_a_users_exception_is_its_items_error_never_a_hang(
    memory_cache: ResponseCache, exc: Exception, said: str
) -> None:
    """Failures are never a hang: a user's callable's exception that describe_error could not
    read (a body and a 404 but no request; a ``__str__`` that raises) killed the engine's
    worker with the job running, and the item waited until the stall timeout. The first is said
    as it is, the second by its class and what raised."""
    from pytest_gsm8k.runtime.failures import describe_error

    if isinstance(exc, _UsersError):  # the status classifies, whatever the shape: a
        assert describe_error(exc) == ("_UsersError: gone", True, False)  # client's 404 ends
        assert describe_error(exc, own=False) == ("_UsersError: gone", False, True)  # refused
    engine = Engine(ScriptedClient(fail={"p000": exc}), memory_cache, concurrency=1)
    planned = requests(2)
    try:
        engine.start(planned)
        asked = asyncio.run_coroutine_threadsafe(engine.answer(planned[0]), engine.loop)
        with pytest.raises(EndpointError, match=said):
            asked.result(timeout=10)
    finally:
        engine.close()


def test_repeats_are_separate_requests_each_with_its_own_cache_entry(tmp_path: Path) -> None:
    """--gsm8k-repeats: repeat 0 keeps the key a run without repeats had (old caches stay
    valid); each further repeat is a request of its own (same body) under its own key, and a
    later run with more repeats asks only for those it has not got."""
    client = ScriptedClient()
    [request] = requests(1)
    body = request.body(client.model)
    legacy = {"v": 1, "base_url": client.endpoint, "body": body, "sample": "0"}  # before repeats
    assert cache_key(client.endpoint, body, "0", None, 0) == stable_hash(legacy)
    assert cache_key(client.endpoint, body, "0", None, 2) == cache_key(
        client.endpoint, body, "r2:0", None, 0
    )
    keys = {cache_key(client.endpoint, body, "0", None, r.repeat) for r in request.asks(3)}
    assert len(keys) == 3
    assert cache_key(client.endpoint, body, "0", None, 0) in keys  # the key without repeats

    cache = response_cache(tmp_path / "c", "run1")
    engine = Engine(client, cache, concurrency=2)
    try:
        assert engine.result(request).completions  # a run without repeats
    finally:
        engine.close()
        cache.close()  # that run ended (a run still going is never read)
    assert client.order == ["p000"]
    client = ScriptedClient()
    engine = Engine(client, response_cache(tmp_path / "c", "run2", resume=True), concurrency=2)
    try:
        answers = [engine.result(ask) for ask in request.asks(3)]
    finally:
        engine.close()
    assert [a.cached for a in answers] == [1, 0, 0]  # repeat 0 from the first run's cache
    assert client.order == ["p000", "p000"]  # repeats 1 and 2 asked, each once


def test_an_ignored_n_asks_each_repeats_samples_under_its_own_keys(tmp_path: Path) -> None:
    """An endpoint that ignores ``n`` gets one call per sample; those calls' cache keys carry
    the repeat too, or repeat 1's later samples would be repeat 0's answers read again."""
    [request] = requests(1)
    request = replace(request, n=2)
    client = ScriptedClient()  # one completion a call, whatever n says
    cache = response_cache(tmp_path / "c", "run1")
    engine = Engine(client, cache, concurrency=2)
    try:
        assert len(engine.result(request).completions) == 2
    finally:
        engine.close()
        cache.close()
    assert client.order == ["p000"] * 2
    client = ScriptedClient()
    engine = Engine(client, response_cache(tmp_path / "c", "run2", resume=True), concurrency=2)
    try:
        answers = [engine.result(ask) for ask in request.asks(2)]
    finally:
        engine.close()
    assert [a.cached for a in answers] == [2, 0]  # repeat 1: both samples asked
    assert client.order == ["p000"] * 2


class _Refusal(Exception):
    """A 400 as the vllm preset's client raises it (``status_code`` is what counts)."""

    status_code = 400


@pytest.mark.parametrize(
    ("failing", "storm"),
    [
        pytest.param({1, 3, 5, 7, 9, 11, 12, 13, 14, 15}, False, id="answers-between"),
        pytest.param(set(range(16)), True, id="all-fail"),
    ],
)
def test_guessed_failures_count_toward_a_storm_as_they_happened(
    tmp_path: Path, failing: set[int], storm: bool
) -> None:
    """The xdist head start's failures are held until a plan takes them; the verdict on
    the endpoint must be the one the same requests planned directly get. Ten failures
    with answers between them are ten errors, not a storm (replaying them in a row at
    adoption once aborted such a run); sixteen in a row are a storm either way."""
    planned = requests(16)
    fail = {f"p{i:03d}" for i in failing}
    for guessed in (False, True):
        aborted = _run_with_failures(tmp_path / str(guessed), planned, fail, guessed=guessed)
        assert (aborted is not None) == storm, (guessed, aborted)
        if storm:
            assert "10 requests in a row failed this way" in str(aborted)


def _run_with_failures(
    folder: Path, planned: list[Request], fail: set[str], *, guessed: bool
) -> str | None:
    """Plan ``planned`` (first guessed when ``guessed``), fail ``fail``; the abort message."""
    client = ScriptedClient(delay=0.01, fail={p: RuntimeError("scripted failure") for p in fail})
    engine = Engine(client, response_cache(folder, "run", persistent=False), concurrency=4)
    try:
        if guessed:
            engine.start(planned, guess=True)
            assert wait_until(lambda: len(client.order) == 16 or engine.aborted, 5)
            time.sleep(0.05)
        engine.start(planned)
        assert wait_until(lambda: all(engine.by_request[r].future.done() for r in planned), 5)
        for r in planned:
            error = engine.by_request[r].future.exception()
            if engine.aborted is None:
                assert (error is not None) == (r.problem_id in fail), r.problem_id
                assert error is None or isinstance(error, EndpointError)
            else:  # the storm's first failures are errors, the rest aborted
                assert isinstance(error, (EndpointError, EndpointAborted))
        return engine.aborted
    finally:
        engine.close()


def test_refused_guesses_no_plan_takes_do_not_stop_the_plans_prefetch(
    memory_cache: ResponseCache,
) -> None:
    """Guesses the endpoint refuses (400 before any answer) stop further guessing; a plan
    that takes none of them (a conftest deselected them) must still be fetched ahead, even
    when a guess left over is refused again after the plan."""
    client = ScriptedClient(delay=0.01, fail={"p000": _Refusal(), "p001": _Refusal()})
    engine = Engine(client, memory_cache, concurrency=1)
    planned = requests(9)
    try:
        engine.start(planned[:3], guess=True)
        assert wait_until(lambda: client.order == ["p000"], 5)
        time.sleep(0.1)
        assert client.order == ["p000"]  # no more guesses at a refusing endpoint
        engine.start(planned[3:])
        assert wait_until(lambda: len(client.order) == 9, 5), client.order
        assert engine.aborted is None
        assert client.order[3:] == [r.problem_id for r in planned[3:]]
    finally:
        engine.close()


def test_answers_an_earlier_run_cached_break_a_storm_as_fresh_answers_do(tmp_path: Path) -> None:
    """--gsm8k-resume before this run's first fresh reply: an earlier run's answers wait
    (parked) for a reply to check them against, and are the run's answers all the same. Ten
    failures with such answers between them are ten errors, not a storm "with none answered
    between them" (the rule the xdist head start's failures follow too)."""
    planned = requests(20)
    cache = response_cache(tmp_path / "c", "earlier")
    earlier = Engine(ScriptedClient(), cache, concurrency=1)
    try:
        for request in planned[::2]:
            assert earlier.result(request).completions
    finally:
        earlier.close()
        cache.close()  # that run ended (a run still going is never read)
    fail: dict[str, Exception] = {r.problem_id: RuntimeError("failed") for r in planned[1::2]}
    client = ScriptedClient(fail=fail)
    engine = Engine(client, response_cache(tmp_path / "c", "resumed", resume=True), concurrency=1)
    try:
        engine.start(planned)
        assert wait_until(lambda: all(engine.by_request[r].future.done() for r in planned), 5)
        assert engine.aborted is None, engine.aborted
        for request in planned:
            error = engine.by_request[request].future.exception()
            assert isinstance(error, EndpointError) == (request.problem_id in fail)
            assert error is None or not isinstance(error, EndpointAborted)
    finally:
        engine.close()
    assert sorted(client.order) == sorted(fail)  # the cached ones were not asked again


def test_a_servers_error_message_is_said_bounded_through_either_client() -> None:
    """A server's error message (a JSON body's ``message``) is text from outside: an item's
    error quotes 200 characters of it at most, as it quotes a reply that is not JSON, never a
    megabyte a line (a hostile or broken server's)."""
    import httpx2 as httpx
    import openai

    from pytest_gsm8k.runtime.failures import WireFailure, describe_error

    body = {"error": {"message": "z" * 1_000_000}}
    request = httpx.Request("POST", "http://x/v1/chat/completions")
    response = httpx.Response(500, request=request, json=body)
    for exc in (
        openai.APIStatusError("boom", response=response, body=body),
        WireFailure("http://x/v1/chat/completions", 500, body),
    ):
        said = describe_error(exc)[0]
        assert said == "HTTP 500 after retries: " + "z" * 200, said[:300]


def test_any_exceptions_first_line_is_said_bounded() -> None:
    """Rule: text from outside is never printed unbounded. A model call's exception that is no
    HTTP client's (a gsm8k_model function's ``RuntimeError(reply.text)``, an SDK's own) was
    quoted with its whole first line, a megabyte included (seen failing before the fix). Cut
    without an ellipsis: the engine's scrubber then hides a key the cut falls inside."""
    from pytest_gsm8k.runtime.failures import describe_error

    for own in (True, False):
        said = describe_error(RuntimeError("z" * 1_000_000 + "\nmore"), own)[0]
        assert said == "RuntimeError: " + "z" * 200, said[:300]
