"""core/retry.py: the vllm preset's retry policy, checked against the openai client's own.

The policy is a copy (the preset's aiohttp client does not go through openai); these tests
ask the installed openai client the same questions and fail when the two disagree, so an
openai release that changes its retries is noticed here.
"""

from __future__ import annotations

import email.utils
import functools
import importlib
from typing import Any

import openai
import pytest

from pytest_gsm8k.core import retry

#: the client's private module: what is compared is its own retry code
base_client: Any = importlib.import_module("openai._base_client")

NOW = 1_800_000_000.0
STATUSES = [400, 401, 404, 408, 409, 422, 429, 500, 502, 503, 504]
HEADERS: list[dict[str, str]] = [
    {},
    {"retry-after": "3"},
    {"retry-after": "0.5"},
    {"retry-after": "600"},
    {"retry-after": "121"},
    {"retry-after": "120"},
    {"retry-after": "-1"},
    {"retry-after": "soon"},
    {"retry-after": "1e999"},
    {"retry-after-ms": "250"},
    {"retry-after-ms": "250", "retry-after": "9"},
    {"retry-after": email.utils.formatdate(NOW + 30, usegmt=True)},
    {"x-should-retry": "true"},
    {"x-should-retry": "false"},
    {"x-should-retry": "false", "retry-after": "1"},
]


@functools.cache
def _client() -> Any:
    return openai.AsyncOpenAI(api_key="unused", base_url="http://127.0.0.1:9/v1", max_retries=5)


def _httpx() -> Any:
    try:
        return importlib.import_module("httpx2")
    except ImportError:  # pragma: no cover - depends on the openai release
        return importlib.import_module("httpx")


@pytest.mark.parametrize("status", STATUSES)
@pytest.mark.parametrize(
    "headers", HEADERS, ids=lambda h: ",".join(f"{k}={v}" for k, v in h.items()) or "none"
)
def test_should_retry_is_the_openai_clients_answer(
    status: int, headers: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base_client.time, "time", lambda: NOW)
    httpx = _httpx()
    response = httpx.Response(status, headers=headers)
    assert retry.should_retry(status, headers, NOW) == _client()._should_retry(response)


@pytest.mark.parametrize(
    "headers", HEADERS, ids=lambda h: ",".join(f"{k}={v}" for k, v in h.items()) or "none"
)
@pytest.mark.parametrize("done", [0, 1, 2, 3, 4, 10])
@pytest.mark.parametrize("jitter", [0.0, 0.37, 0.999])
def test_the_wait_is_the_openai_clients_wait(
    headers: dict[str, str], done: int, jitter: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(base_client, "random", lambda: jitter)
    monkeypatch.setattr(base_client.time, "time", lambda: NOW)
    client = _client()
    options = base_client.FinalRequestOptions.construct(method="post", url="/completions")
    theirs = client._calculate_retry_timeout(
        client.max_retries - done, options, _httpx().Headers(headers)
    )
    ours = retry.retry_delay(done, headers, NOW, lambda: jitter)
    assert ours == pytest.approx(theirs, abs=1e-9)


def test_backoff_doubles_from_half_a_second_up_to_eight() -> None:
    waits = [retry.retry_delay(n, None, NOW, lambda: 0.0) for n in range(7)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert retry.retry_delay(0, None, NOW, lambda: 0.999) == pytest.approx(0.5 * (1 - 0.24975))


def test_header_names_in_any_case_are_read() -> None:
    assert retry.retry_after({"Retry-After": "7"}, NOW) == 7.0
    assert retry.retry_after({"Retry-After-Ms": "1500"}, NOW) == 1.5
    assert not retry.should_retry(500, {"X-Should-Retry": "false"}, NOW)


def test_a_header_sent_twice_is_read_by_its_first_value() -> None:
    """The vllm preset's aiohttp hands over a multidict: ``Retry-After`` sent twice is read by
    its first value (``headers.get``), as before the shrink; reading the last turned a 429
    the server asked to retry in 2 s into an answer given up (a second value past 120 s)."""
    from multidict import CIMultiDict, CIMultiDictProxy

    said = [("Retry-After", "2"), ("retry-after", "100000")]
    headers = CIMultiDictProxy(
        CIMultiDict([*said, ("X-Should-Retry", "true"), ("x-should-retry", "false")])
    )
    assert retry.retry_after(headers, NOW) == 2.0
    assert retry.should_retry(429, headers, NOW)
    assert retry.retry_delay(0, headers, NOW, lambda: 0.0) == 2.0
    assert retry.should_retry(400, headers, NOW)  # the first x-should-retry: true
