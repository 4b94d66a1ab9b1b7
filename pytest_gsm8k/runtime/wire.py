"""The ``vllm`` preset's client: its exact request bytes over aiohttp, as vLLM's script sends them.

Every other protocol goes through the openai client (:class:`~.client.OpenAIClient`).
This one exists for speed, measured (``benchmarks/bench_sidebyside.py``): vLLM's
``gsm8k_eval.py`` is an aiohttp loop, and a CI that switches to the plugin should not wait
longer for the same 1,319 requests. Through the openai client the plugin took 1.25-1.33x
the script's wall time on one machine, about 4.5x its CPU: importing openai (~0.4 s) and
its per-request layers over httpx/httpcore (~0.9 ms a request) share one interpreter lock
with pytest's items. The same requests through aiohttp cost ~0.3 ms each and no openai
import (the bench's table in benchmarks/README.md).

What the openai client gave is kept, not dropped:

* retries with its policy, numbers and ``Retry-After`` handling
  (:mod:`pytest_gsm8k.core.retry`, copied from openai-python and tested against it);
* failures the engine already knows how to say: :class:`HTTPStatusFailure` carries
  ``status_code``, ``body`` and ``request`` as ``openai.APIStatusError`` does, timeouts and
  connection failures have their own classes (``engine.describe_error`` words them all);
* what the plugin's own transport adds (:mod:`.client`): the breaker hears every
  connection failure and every answer, a long ``Retry-After`` is said once, and a reply is
  decoded here within :data:`~.client.MAX_REPLY_BYTES` (``auto_decompress`` off: a gzip
  bomb is refused after that much, never inflated).

The headers are the script's (aiohttp's, ``Content-Type: application/json``), plus
``Authorization`` only when a key is set (the script sends none) and the encodings the
bounded decoder reads.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from typing import Any

from pytest_gsm8k.core.retry import MAX_RETRY_AFTER, retry_delay, should_retry
from pytest_gsm8k.core.types import ModelResponse, Request
from pytest_gsm8k.runtime.bounded import ACCEPTED, Counter, Decoder, Refused, encoding_of, mib
from pytest_gsm8k.runtime.client import (
    MAX_REPLY_BYTES,
    OpenAIClient,
    note_long_retry_after,
    parse_reply,
)

#: bytes read from the socket at a time (the decoder's own pieces are bounded separately)
CHUNK = 1 << 16


class WireFailure(Exception):
    """A request the wire client gave up on (after its retries, when they apply)."""


class HTTPStatusFailure(WireFailure):
    """The endpoint answered with an HTTP error status. Shaped like ``openai.APIStatusError``
    (``status_code``, ``body``, ``message``, ``request.url``/``method``) so the engine words
    it the same way."""

    def __init__(self, status: int, body: Any, url: str, headers: dict[str, str]) -> None:
        message = _first_line(body) or "error"
        super().__init__(f"HTTP {status}: {message}")
        self.status_code = status
        self.body = body
        self.message = message
        self.request = _RequestLine("POST", url)
        #: the reply's headers: its Retry-After decides the wait before a retry
        self.headers = headers


class _RequestLine:
    def __init__(self, method: str, url: str) -> None:
        self.method = method
        self.url = url


class RequestTimeout(WireFailure):
    """No whole reply within ``--gsm8k-timeout`` (the config's timeout), retries included."""


class ConnectionFailure(WireFailure):
    """The connection failed (refused, dropped, reset), retries included; the cause is chained."""


class ReplyRefused(WireFailure):
    """A reply read no further: larger than the bound, or in an encoding not asked for.
    Never retried: asking again fetches the same reply."""


def env_proxy(endpoint: str) -> str | None:
    """The proxy the environment names for ``endpoint``, as openai's httpx reads it
    (``core/proxy.py``), or None: read once per client, not once per request.

    Raises ValueError (one line) for a proxy aiohttp cannot use: only ``http://`` proxies
    (an ``https://`` endpoint is tunnelled through them with CONNECT).
    """
    import urllib.request

    from pytest_gsm8k.core.proxy import proxy_for

    try:
        proxy = proxy_for(endpoint, urllib.request.getproxies())
    except ValueError as exc:  # e.g. a port out of range: say which URL, not "proxy"
        raise ValueError(f"the endpoint URL is not usable: {exc}") from None
    if proxy is not None and not proxy.lower().startswith("http://"):
        scheme = proxy.partition("://")[0]
        raise ValueError(
            f"the environment names a {scheme}:// proxy for the endpoint, and the "
            "vllm preset's client (aiohttp) can use http:// proxies only; name an http:// "
            "proxy or exempt the host in NO_PROXY"
        )
    return proxy


class WireClient(OpenAIClient):
    """An OpenAI-compatible endpoint for requests with exact bytes (:attr:`Request.wire`).

    Same construction, endpoint, cache identity and breaker as :class:`OpenAIClient`; only
    the sending differs. A request without wire bytes (none in the ``vllm`` preset) goes as
    its JSON body, so the client never refuses a request it is given.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._session: Any = None
        self._session_lock = threading.Lock()
        #: the proxy for the endpoint, read from the environment once (ValueError: unusable)
        self._proxy_url = env_proxy(self.endpoint)
        self._proxy: Any = None  # as aiohttp takes it, and its credentials: made by warm()
        self._proxy_auth: Any = None

    def warm(self) -> Any:
        """The aiohttp session, made now if it was not yet (on the engine's loop: aiohttp
        binds a session to the loop it is made on)."""
        with self._session_lock:
            if self._session is None:
                import aiohttp

                headers = {
                    "Content-Type": "application/json",
                    "Accept-Encoding": ", ".join(ACCEPTED),
                }
                if self._api_key:
                    headers["Authorization"] = f"Bearer {self._api_key}"
                if self._proxy_url is not None:
                    from yarl import URL

                    proxy = URL(self._proxy_url)
                    if proxy.user is not None:
                        self._proxy_auth = aiohttp.BasicAuth(proxy.user, proxy.password or "")
                    self._proxy = proxy.with_user(None)
                self._session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=self._concurrency),
                    headers=headers,
                    auto_decompress=False,
                    timeout=aiohttp.ClientTimeout(total=self._timeout),
                    # not trust_env: it reads ~/.netrc and the proxy variables again for
                    # every request, each on a thread of its own, and a netrc entry for the
                    # host makes every request with a key fail (Basic auth beside Bearer);
                    # openai's httpx takes the proxy from the environment and no netrc
                    trust_env=False,
                )
            return self._session

    async def complete(self, request: Request) -> ModelResponse:
        """One request, retried as the openai client would retry it."""
        session = self._session if self._session is not None else self.warm()
        path = "/chat/completions" if request.api == "chat" else "/completions"
        url = self.endpoint + path
        payload = (
            request.wire.encode("utf-8")
            if request.wire is not None
            else json.dumps(request.body(self.model)).encode("utf-8")
        )
        retries = 0
        while True:
            try:
                data = await self._once(session, url, payload)
            except HTTPStatusFailure as exc:
                headers = exc.headers
                if retries >= self._max_retries or not should_retry(
                    exc.status_code, headers, time.time()
                ):
                    raise
                delay = retry_delay(retries, headers, time.time(), random.random)
            except (RequestTimeout, ConnectionFailure):
                if retries >= self._max_retries:
                    raise
                delay = retry_delay(retries, None, time.time(), random.random)
            else:
                return parse_reply(data, chat=request.api == "chat", on_bad_usage=self._bad_usage)
            retries += 1
            await asyncio.sleep(delay)

    async def _once(self, session: Any, url: str, payload: bytes) -> Any:
        """One attempt: the decoded JSON of a 2xx reply, or one of this module's failures."""
        import aiohttp

        try:
            async with session.post(
                url, data=payload, proxy=self._proxy, proxy_auth=self._proxy_auth
            ) as response:
                self.breaker.success()
                if response.status in (429, 503):
                    note_long_retry_after(
                        self.breaker, response.status, response.headers, MAX_RETRY_AFTER
                    )
                raw = await _read_bounded(response)
                if response.status >= 400:
                    raise HTTPStatusFailure(
                        response.status, _json_or_text(raw), url, dict(response.headers)
                    )
        except (asyncio.TimeoutError, aiohttp.ServerTimeoutError) as exc:
            self.breaker.failure(exc)
            raise RequestTimeout("the request timed out") from exc
        except aiohttp.ClientConnectionError as exc:
            self.breaker.failure(exc)
            raise ConnectionFailure(str(exc) or type(exc).__name__) from exc
        except aiohttp.ClientPayloadError as exc:  # a reply cut off mid-body
            self.breaker.failure(exc)
            raise ConnectionFailure(str(exc) or type(exc).__name__) from exc
        try:
            return json.loads(raw)
        except ValueError:
            shown = raw[:200].decode("utf-8", "replace").strip().splitlines()
            return shown[0] if shown else ""

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


async def _read_bounded(response: Any) -> bytes:
    """The reply's body, decoded here within :data:`MAX_REPLY_BYTES` (see :mod:`.bounded`)."""
    encoding = encoding_of(_split(response.headers.getall("Content-Encoding", [])))
    length = response.headers.get("Content-Length", "")
    try:
        if not encoding and length.isdigit() and int(length) > MAX_REPLY_BYTES:
            raise Refused(
                f"the endpoint's reply is over {mib(MAX_REPLY_BYTES)} ({int(length):,} bytes), "
                "the most one problem's answer may take; refused unread"
            )
        decoder = Decoder(encoding)
        counter = Counter(MAX_REPLY_BYTES)
        parts: list[bytes] = []
        async for raw in response.content.iter_chunked(CHUNK):
            parts.extend(counter.add(piece) for piece in decoder.feed(raw))
        tail = decoder.finish()
        if tail:
            parts.append(counter.add(tail))
    except Refused as exc:
        response.close()
        raise ReplyRefused(str(exc)) from None
    return b"".join(parts)


def _split(values: list[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]


def _json_or_text(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _first_line(body: Any) -> str:
    """An error reply's text, shortened (a JSON body's message is read by the engine)."""
    text = body if isinstance(body, str) else json.dumps(body)
    lines = text.strip().splitlines()
    return lines[0][:200] if lines else ""
