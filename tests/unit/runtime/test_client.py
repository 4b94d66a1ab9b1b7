"""The OpenAI-compatible client against the scripted server: bounded replies, the model list's
deadline, redirects that keep the key on the same origin."""

from __future__ import annotations

import asyncio
import email.utils
import socket
import time
import tracemalloc

import openai
import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import TEST_KEY, sent, use_proxy

from pytest_gsm8k.core.dataset import select
from pytest_gsm8k.core.types import Request
from pytest_gsm8k.runtime.client import (
    MAX_REPLY_BYTES,
    Breaker,
    OpenAIClient,
    PreflightError,
    env_proxy,
    get_json,
    list_models,
    reply_coding,
)
from pytest_gsm8k.runtime.data import load_split


def chosen(limit: int) -> list[int]:
    """The problem indices ``--gsm8k-limit=limit`` runs, in run order."""
    return [p.index for p in select(load_split(None, "test", "main").problems, limit, 1234)]


def test_a_gzip_bomb_is_refused_before_it_is_decoded(
    server: FakeOpenAIServer, keyed_env: str
) -> None:
    """200 KB on the wire that inflate to 200 MB: the transport stops decoding at the bound,
    so the request costs about the bound in memory, not the bomb's size."""
    index = chosen(1)[0]
    server.set_script(Script(behaviours={index: "gzipbomb"}))
    problem = load_split(None, "test", "main").problems[index]
    request = Request(problem_id=problem.id, api="chat", messages=(("user", problem.question),))
    client = OpenAIClient(
        model="fake-model",
        base_url=server.base_url,
        api_key=keyed_env,
        timeout=60,
        max_retries=2,
        concurrency=1,
    )
    client.warm()

    async def ask_twice() -> tuple[BaseException | None, int, str]:
        """The bomb (its error, and the peak memory of asking), then the same reply small."""
        error: BaseException | None = None
        tracemalloc.start()
        try:
            await client.complete(request)
        except Exception as exc:  # what was raised is the point
            error = exc
        finally:
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        server.set_script(Script(behaviours={index: "gzipbomb"}, bomb_chars=100_000))
        try:
            return error, peak, (await client.complete(request)).completions[0].text
        finally:
            await client.aclose()

    error, peak, answer = asyncio.run(ask_twice())
    assert type(error).__name__ == "RefusedReply", error
    assert "over 32 MiB decoded" in str(error)
    assert peak < 2 * MAX_REPLY_BYTES + (16 << 20), f"peak {peak:,} bytes"
    assert sent(server) == 2  # the bomb once (refused at once, not retried), then the small one
    # the same reply compressed, but small: decoded and answered as usual
    assert answer.strip().endswith(f"#### {server.golds[index]}")
    assert len(answer) > 100_000


def test_a_same_origin_redirect_keeps_the_key(server: FakeOpenAIServer) -> None:
    """The server requires the key: the redirected listing answers only with it."""
    server.set_script(Script(redirect_models=f"{server.base_url}/models?redirected=1"))
    cards = list_models(server.base_url, TEST_KEY, timeout=10.0)
    assert [card["id"] for card in cards] == ["fake-model"]
    assert server.stats()["requests_by_path"] == {"/v1/models": 2}


def test_list_models_has_one_deadline_for_the_whole_reply(server: FakeOpenAIServer) -> None:
    server.set_script(Script(drip_models=0.2))
    with pytest.raises(PreflightError) as info:
        list_models(server.base_url, TEST_KEY, timeout=1.0)
    assert info.value.kind == "timeout"


def _client(base_url: str, key: str, *, timeout: float = 60) -> OpenAIClient:
    return OpenAIClient(
        model="fake-model",
        base_url=base_url,
        api_key=key,
        timeout=timeout,
        max_retries=0,
        concurrency=4,
    )


def _first_request() -> Request:
    problem = load_split(None, "test", "main").problems[0]
    return Request(problem_id=problem.id, api="chat", messages=(("user", problem.question),))


def _failure(client: OpenAIClient) -> BaseException:
    async def ask() -> BaseException:
        try:
            await client.complete(_first_request())
        except Exception as exc:  # what was raised is the point
            return exc
        finally:
            await client.aclose()
        raise AssertionError("the request succeeded")

    return asyncio.run(ask())


def test_a_refused_connection_is_a_connection_error_not_a_timeout(keyed_env: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: nothing listens there
    client = _client(f"http://127.0.0.1:{port}/v1", keyed_env)
    error = _failure(client)
    assert type(error) is openai.APIConnectionError, repr(error)
    assert type(error.__cause__).__name__ == "ConnectError", repr(error.__cause__)
    assert client.breaker.count == 1  # counted towards a dead endpoint


def test_a_dropped_connection_is_a_connection_error_not_a_timeout(
    server: FakeOpenAIServer, keyed_env: str
) -> None:
    server.set_script(Script(fail_first={0: {"drop": 1}}))
    client = _client(server.base_url, keyed_env)
    error = _failure(client)
    assert type(error) is openai.APIConnectionError, repr(error)
    assert type(error.__cause__).__name__ == "RemoteProtocolError", repr(error.__cause__)
    assert client.breaker.count == 1


def test_a_silent_endpoint_is_a_timeout(server: FakeOpenAIServer, keyed_env: str) -> None:
    server.set_script(Script(behaviours={0: "hang"}))
    client = _client(server.base_url, keyed_env, timeout=0.5)
    error = _failure(client)
    assert isinstance(error, openai.APITimeoutError), repr(error)
    assert client.breaker.count == 1


@pytest.mark.parametrize("via_aiohttp", [False, True], ids=["openai", "aiohttp"])
def test_an_http_status_over_599_is_said_as_the_http_status_it_was_after_retries(
    server: FakeOpenAIServer, keyed_env: str, via_aiohttp: bool
) -> None:
    """A server that answers status 600 gave an HTTP answer, retried as a 5xx by either
    client: its line says so (``HTTP 600 after retries``), never ``no HTTP status``, which is
    only for a client's stand-in below 100 (status_code 0) where no HTTP answer came."""
    from pytest_gsm8k.runtime.failures import describe_error
    from pytest_gsm8k.runtime.wire import WireClient

    server.set_script(Script(fail_first={0: {"600": 99}}))
    kind = WireClient if via_aiohttp else OpenAIClient
    client = kind(
        model="fake-model",
        base_url=server.base_url,
        api_key=keyed_env,
        timeout=60,
        max_retries=1,
        concurrency=1,
    )
    error = _failure(client)
    assert sent(server) == 2  # an HTTP answer, asked again
    assert describe_error(error) == ("HTTP 600 after retries: Scripted fault 600.", False, False)


@pytest.mark.parametrize("wait", ["600", "date"])
def test_a_retry_after_longer_than_the_client_waits_is_noted_once_in_any_form(wait: str) -> None:
    """The client gives up at once on a Retry-After over 120 s, as seconds or as an HTTP date
    (core/retry.should_retry): either way the run says so, once."""
    value = email.utils.formatdate(time.time() + 600, usegmt=True) if wait == "date" else wait
    breaker = Breaker()
    for _ in range(2):
        reply_coding(breaker, 429, {"retry-after": value}, [])
    reply_coding(breaker, 503, {"retry-after": "120"}, [])  # waited for: no note
    [line] = breaker.notes.values()
    assert "longer than the client waits (120 s)" in line
    assert "(Retry-After on HTTP 429)" in line


@pytest.mark.parametrize(
    ("data", "said"),
    [
        ({"x": 1}, "has no choices: {'x': 1}"),
        # a blank body as the openai client hands it on (the wire client strips it first)
        (" \r\n ", "has no choices: ''"),
        ("", "has no choices: ''"),
        ({"choices": []}, "has no choices (an empty list)"),
        (
            {"choices": [{"message": {"content": None}}]},
            "has no answer (message content is null, no reasoning)",
        ),
    ],
)
def test_a_reply_without_an_answer_is_said_in_full(data: object, said: str) -> None:
    """A 200 that holds no completion is the item's error in one line of its own (no class
    name in front), not fatal."""
    from pytest_gsm8k.runtime.client import parse_reply
    from pytest_gsm8k.runtime.failures import describe_error

    with pytest.raises(Exception, match=r"^the endpoint's reply ") as info:
        parse_reply(data, chat=True, breaker=Breaker())
    assert describe_error(info.value) == (f"the endpoint's reply {said}", False, False)


def test_a_chat_answer_in_content_parts_is_their_text_joined() -> None:
    """A ``content`` sent as a list of parts: the answer is its text parts, in order."""
    from pytest_gsm8k.runtime.client import parse_reply

    parts = [
        {"type": "text", "text": "The answer "},
        {"type": "image_url", "image_url": {"url": "x"}},
        {"text": "is 42."},
        "stray",
    ]
    data = {"choices": [{"message": {"content": parts}, "finish_reason": "stop"}]}
    response = parse_reply(data, chat=True, breaker=Breaker())
    assert [c.text for c in response.completions] == ["The answer is 42."]


@pytest.mark.parametrize("port", ["8080", "99999"])
def test_a_proxy_url_aiohttp_cannot_read_is_one_line_without_its_password(
    monkeypatch: pytest.MonkeyPatch, port: str
) -> None:
    """aiohttp's error for a proxy URL it cannot read is the whole URL, password and all
    (every request's error, the report): the vllm preset refuses it first, in one line."""
    use_proxy(monkeypatch, "HTTP_PROXY", f"http://someone:pass#secret@127.0.0.1:{port}")
    with pytest.raises(ValueError, match="proxy URL for the endpoint cannot be read") as caught:
        env_proxy("http://gsm8k-upstream.invalid/v1", aiohttp=True)
    assert "secret" not in str(caught.value)
    monkeypatch.setenv("HTTP_PROXY", f"http://someone:proxy-secret@127.0.0.1:{port}")
    if port == "8080":
        assert env_proxy("http://gsm8k-upstream.invalid/v1", aiohttp=True) == (
            "http://someone:proxy-secret@127.0.0.1:8080"
        )
    else:
        with pytest.raises(ValueError, match="check its port") as caught:
            env_proxy("http://gsm8k-upstream.invalid/v1", aiohttp=True)
        assert "secret" not in str(caught.value)


@pytest.mark.parametrize("aiohttp", [False, True])
def test_a_proxy_port_out_of_range_is_one_line_not_an_internal_error(
    monkeypatch: pytest.MonkeyPatch, aiohttp: bool
) -> None:
    """httpx failed on it inside its task group: the preflight's check ended the session with
    an INTERNALERROR traceback (either client)."""
    use_proxy(monkeypatch, "HTTP_PROXY", "http://someone:proxy-secret@127.0.0.1:99999")
    said = r"cannot be read: check its port, percent-encode its user and password$"
    with pytest.raises(ValueError, match=said) as caught:
        env_proxy("http://gsm8k-upstream.invalid/v1", aiohttp=aiohttp)
    assert "secret" not in str(caught.value)
    with pytest.raises(PreflightError, match="cannot be read: check its port"):
        get_json("http://gsm8k-upstream.invalid/v1/models", None, 5, proxies=True)
