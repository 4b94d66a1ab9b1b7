"""Model clients, each ``async complete(request) -> ModelResponse``: the openai client (its
retries) on a transport that tells the :class:`Breaker` of connection failures and bounds each
reply, or a user's callable; and :func:`get_json`, the plugin's GET requests."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import os
import threading
import time
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from pytest_gsm8k.core.retry import MAX_RETRY_AFTER, retry_after
from pytest_gsm8k.core.settings import DEFAULT_BASE_URL
from pytest_gsm8k.core.types import Completion, ModelCallable, ModelResponse, Request, valid_usage
from pytest_gsm8k.runtime.failures import Said, bad_reply, first_line

#: the most one problem's answer may take, decoded (a gzip bomb stops here) or as the JSON of
#: its samples: answers are kilobytes, and up to --gsm8k-concurrency replies are held at once
MAX_REPLY_BYTES = 32 << 20
#: the largest body :func:`get_json` reads (a model list or a readiness answer is small)
MAX_JSON_BODY = 8 << 20


def _httpx() -> Any:
    """The HTTP library the installed openai package is built on (httpx, or httpx2)."""
    try:
        return importlib.import_module("httpx2")
    except ImportError:  # pragma: no cover - depends on the openai release
        return importlib.import_module("httpx")


class ModelClient(Protocol):
    """What the engine needs from a model. ``endpoint`` is in cache keys unless the client
    has a ``cache_endpoint`` (a name that outlives the URL); ``persistent_cache``: whether
    answers may be cached across runs."""

    endpoint: str
    model: str
    persistent_cache: bool

    async def complete(self, request: Request) -> ModelResponse: ...

    async def aclose(self) -> None: ...


@dataclass(eq=False)
class Breaker:
    """Opens when ``threshold`` connection failures in a row (any HTTP answer resets it) have
    lasted ``min_seconds``. When a server dies, every request in flight fails at once, then
    retries after 0.5, 1, 2, 4, 8 s: the breaker opens at the first retry after 2 s, well
    before the retries run out (~15 s)."""

    threshold: int = 8
    min_seconds: float = 2.0
    count: int = 0
    first: float = 0.0
    on_open: Callable[[str], None] = lambda error: None
    #: one-line remarks on what the transport saw, by kind: each once (read by the engine)
    notes: dict[str, str] = field(default_factory=dict)

    def success(self) -> None:
        self.count = 0

    def failure(self, error: BaseException) -> None:
        now = time.monotonic()
        self.first, self.count = (self.first if self.count else now), self.count + 1
        if self.count >= self.threshold and now - self.first >= self.min_seconds:
            self.on_open(f"{type(error).__name__}: {error}".strip())


#: the most one decoding step produces (zlib's output bound per call)
PIECE = 1 << 20
#: what the transport asks the server for; a reply may use any of these or none
ACCEPTED = ("gzip", "deflate")
#: zlib's window bits by content coding (0: none); another coding could not be bounded
WBITS = {"gzip": 31, "x-gzip": 31, "deflate": 15, "": 0}


class Refused(Exception):
    """The reply cannot be read within the bound (too large, or an encoding not asked for); a
    message quoting the server's headers is cut as :func:`first_line` cuts outside text."""

    def __init__(self, message: str) -> None:
        super().__init__(first_line(message))


def mib(size: int) -> str:
    return f"{size / (1 << 20):g} MiB"


def reply_coding(breaker: Breaker, status: int, headers: Any, encodings: list[str]) -> str:
    """An HTTP reply came: the breaker hears it, a Retry-After longer than the client waits (it
    then fails at once: core/retry.py) is said once; the body's content coding, or
    :class:`Refused` at once for a body over the bound or in a coding not asked for (or in
    more than one: its Content-Encoding values)."""
    breaker.success()
    seconds = retry_after(headers, time.time()) if status in (429, 503) else None
    if seconds is not None and seconds > MAX_RETRY_AFTER:
        breaker.notes.setdefault(
            "retry-after",
            f"gsm8k: the endpoint asked to wait {seconds:g} s (Retry-After on HTTP {status}), "
            f"longer than the client waits ({MAX_RETRY_AFTER:g} s): those requests failed "
            "without waiting",
        )
    codings = [c.strip().lower() for c in ",".join(encodings).split(",")]
    codings = [c for c in codings if c not in ("", "identity")]
    if len(codings) > 1:
        raise Refused(
            f"the endpoint's reply is encoded {len(codings)} times ({', '.join(codings)}); "
            "one encoding was asked for"
        )
    length = str(headers.get("content-length", ""))
    if not codings and length.isdigit() and int(length) > MAX_REPLY_BYTES:
        raise Refused(
            f"the endpoint's reply is over {mib(MAX_REPLY_BYTES)} ({int(length):,} bytes), the "
            "most one problem's answer may take; refused unread"
        )
    if (coding := codings[0] if codings else "") not in WBITS:
        raise Refused(f"the endpoint's reply is encoded as {coding!r}, not as asked for")
    return coding


async def bounded_body(coding: str, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The raw ``chunks`` decoded (``coding``: one :func:`reply_coding` accepted) in pieces of
    at most :data:`PIECE` bytes, :class:`Refused` past :data:`MAX_REPLY_BYTES` in all: a reply
    is held whole in memory, and HTTP libraries decode without a bound (a gzip bomb: 200 KB
    that inflates to 200 MB)."""
    total, first = 0, True
    inflater = zlib.decompressobj(WBITS[coding]) if WBITS[coding] else None

    def counted(piece: bytes) -> bytes:
        nonlocal total
        total += len(piece)
        if total > MAX_REPLY_BYTES:
            raise Refused(
                f"the endpoint's reply is over {mib(MAX_REPLY_BYTES)} decoded, the most one "
                "problem's answer may take; refused, the rest unread"
            )
        return piece

    try:
        async for raw in chunks:
            if inflater is None:
                yield counted(raw)
                continue
            try:
                out = inflater.decompress(raw, PIECE)
            except zlib.error:
                if not (first and coding == "deflate"):
                    raise
                # "deflate" without the zlib wrapper, as some servers send it
                inflater = zlib.decompressobj(-zlib.MAX_WBITS)
                out = inflater.decompress(raw, PIECE)
            first = False
            while out:
                yield counted(out)
                if inflater.eof:
                    break  # anything after the end of the compressed data is ignored
                out = inflater.decompress(inflater.unconsumed_tail, PIECE)
        if inflater is not None and (tail := inflater.flush()):  # bounded: input all consumed
            yield counted(tail)
    except zlib.error:
        raise Refused("the endpoint's reply is not valid compressed data") from None


def _watching_transport(breaker: Breaker, concurrency: int, proxy: str | None) -> Any:
    import openai

    httpx = _httpx()

    class RefusedReply(openai.OpenAIError, Said):
        """A reply read no further (:class:`Refused`) as the openai client raises it: an
        ``OpenAIError`` is never retried nor called a connection error."""

    class WatchingTransport(httpx.AsyncHTTPTransport):  # type: ignore[misc,name-defined]
        """The normal transport (through the environment's proxy: httpx reads it only without
        a transport of ours), telling the breaker what happened, each reply read within
        :data:`MAX_REPLY_BYTES`."""

        async def handle_async_request(self, request: Any) -> Any:
            # only encodings a bounded decoder can read (httpx also offers br and zstd)
            request.headers["Accept-Encoding"] = ", ".join(ACCEPTED)
            try:  # a hung endpoint is as dead as a refusing one
                response = await super().handle_async_request(request)
            except (httpx.NetworkError, httpx.RemoteProtocolError, httpx.TimeoutException) as exc:
                breaker.failure(exc)
                raise
            headers = response.headers
            try:
                encodings = headers.get_list("content-encoding")
                coding = reply_coding(breaker, response.status_code, headers, encodings)
            except Refused as exc:
                await response.aclose()
                raise RefusedReply(str(exc)) from None

            class BoundedStream(httpx.AsyncByteStream):  # type: ignore[misc,name-defined]
                async def __aiter__(self) -> Any:
                    try:
                        async for piece in bounded_body(coding, response.stream):
                            yield piece
                    except Refused as exc:
                        raise RefusedReply(str(exc)) from None

                async def aclose(self) -> None:
                    await response.stream.aclose()

            dropped = ("content-encoding", "content-length")  # of the body decoded here
            kept = [(k, v) for k, v in headers.multi_items() if k.lower() not in dropped]
            status, stream, extensions = response.status_code, BoundedStream(), response.extensions
            return httpx.Response(status, headers=kept, stream=stream, extensions=extensions)

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return WatchingTransport(limits=limits, proxy=proxy)


class PreflightError(Exception):
    """``kind`` is "unreachable", "timeout" (no complete reply within the deadline), "proxy"
    (one httpx cannot use) or "status" (an HTTP ``status`` other than 2xx)."""

    def __init__(self, kind: str, detail: str, status: int | None = None) -> None:
        super().__init__(detail)
        self.kind, self.status = kind, status


@functools.cache
def _tls_context(trust_env: bool) -> Any:
    """httpx's default TLS context, made once: loading the trust store takes tens of ms, and
    a server's readiness is polled many times a second."""
    return _httpx().create_ssl_context(trust_env=trust_env)


def env_proxy(url: str, *, aiohttp: bool = False) -> str | None:
    """The proxy the environment names for ``url`` by httpx's rules (:mod:`~.core.proxy`), or
    None; ValueError (one line) for a bad URL or a proxy the client cannot use: httpx takes
    http, https and (with socksio) socks5 proxies, aiohttp http ones."""
    import importlib.util
    import urllib.request

    from pytest_gsm8k.core.proxy import proxy_for

    try:
        proxy = proxy_for(url, urllib.request.getproxies())
    except ValueError as exc:  # e.g. a port out of range: say which URL, not "proxy"
        raise ValueError(f"the endpoint URL is not usable: {exc}") from None
    socks = ("socks5", "socks5h") if importlib.util.find_spec("socksio") else ()
    usable = ("http",) if aiohttp else ("http", "https", *socks)
    scheme = (proxy or "").partition("://")[0].lower()
    if proxy is not None and scheme not in usable:
        why = (
            "and the vllm preset's client (aiohttp) can use http:// proxies only"
            if aiohttp
            else "which the HTTP client cannot use without socksio (pip install 'httpx[socks]')"
        )
        raise ValueError(
            f"the environment names a {scheme}:// proxy for the endpoint, {why}; name an "
            "http:// proxy or exempt the host in NO_PROXY"
        )
    try:  # httpx takes a port out of range, then fails inside its task group (INTERNALERROR)
        if proxy is not None and not 0 < (_httpx().URL(proxy).port or 1) < 1 << 16:
            raise ValueError  # said below, without the URL
        if aiohttp and proxy is not None:  # quoted as httpx quotes it: aiohttp's parser refuses
            from yarl import URL  # a [ ] or \ in a password, and its error shows the whole URL

            proxy = str(URL(str(_httpx().URL(proxy))))
    except (ValueError, _httpx().InvalidURL):
        raise ValueError(
            "the environment's proxy URL for the endpoint cannot be read: check its port, "
            "percent-encode its user and password"
        ) from None
    return proxy


def get_json(url: str, headers: Mapping[str, str] | None, deadline: float, *, proxies: bool) -> Any:
    """The JSON of a 2xx reply to ``GET url`` (None: not JSON) within ``deadline`` seconds in
    all (httpx bounds each read only: a dripping server would hold the caller), or
    :class:`PreflightError`. httpx keeps ``Authorization`` to the same origin on redirects and
    reads the proxy environment (``proxies=False``: a loopback server). Runs its own loop."""
    import asyncio

    httpx = _httpx()
    if proxies:  # one httpx cannot use is an ImportError (socks without socksio): say why
        try:
            env_proxy(url)
        except ValueError as exc:
            raise PreflightError("proxy", str(exc)) from None

    async def get() -> bytes:
        async with (
            httpx.AsyncClient(
                timeout=deadline,
                follow_redirects=True,
                trust_env=proxies,
                verify=_tls_context(proxies),
            ) as client,
            client.stream("GET", url, headers=dict(headers or {})) as reply,
        ):
            if not 200 <= (status := reply.status_code) < 300:
                raise PreflightError("status", f"HTTP {status}", status)
            body = b""
            async for chunk in reply.aiter_bytes():
                if len(body := body + chunk) > MAX_JSON_BODY:
                    raise PreflightError("unreachable", f"a reply over {mib(MAX_JSON_BODY)}")
            return body

    loop = asyncio.new_event_loop()  # not set as the thread's loop: a user's tests keep theirs
    try:
        body = loop.run_until_complete(asyncio.wait_for(get(), deadline))
    except (TimeoutError, httpx.TimeoutException):
        raise PreflightError("timeout", f"no complete reply within {deadline:g} s") from None
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        cause: BaseException = exc
        while cause.__cause__ or cause.__context__:  # the socket's error, not httpx's wrapper
            cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
        raise PreflightError("unreachable", type(cause).__name__) from None
    finally:
        loop.close()
    with contextlib.suppress(ValueError):
        return json.loads(body)
    return None


def list_models(base_url: str, api_key: str | None, timeout: float) -> list[dict[str, Any]]:
    """The model cards (each with an ``id``) ``GET {base_url}/models`` lists. Without openai
    (its import stays off the path that starts xdist's workers); one retry on a dropped or
    refused connection, as openai would, within ``timeout`` in all."""
    url = base_url.rstrip("/") + "/models"
    if "@" in url.split("//", 1)[-1].split("/", 1)[0]:
        return []  # credentials in the URL: leave it to the real client (httpx handles them)
    key = f"Bearer {api_key or 'EMPTY'}"
    headers = {"Authorization": key, "Accept": "application/json", "User-Agent": "pytest-gsm8k"}
    deadline = time.monotonic() + timeout
    for attempt in (1, 2):
        try:
            data = get_json(url, headers, max(0.001, deadline - time.monotonic()), proxies=True)
            break
        except PreflightError as exc:
            if exc.kind == "timeout":
                raise PreflightError("timeout", f"no complete reply within {timeout:g} s") from None
            if exc.kind != "unreachable" or attempt == 2 or time.monotonic() + 0.5 >= deadline:
                raise
            time.sleep(0.5)
    models = data.get("data") if isinstance(data, dict) else None
    models = models if isinstance(models, list) else []
    return [m for m in models if isinstance(m, dict) and "id" in m]


class OpenAIClient:
    """An OpenAI-compatible endpoint through ``openai.AsyncOpenAI``, built (and openai
    imported, ~0.5 s) on first use: an xdist worker that only follows never pays for it."""

    persistent_cache = True
    via_aiohttp = False  # the vllm preset's client (runtime/wire.py)

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        concurrency: int,
        cache_endpoint: str | None = None,
    ) -> None:
        base = base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL
        self.model, self.endpoint = model, base.rstrip("/")  # as the openai client would use
        self.cache_endpoint = cache_endpoint or self.endpoint
        # ValueError: one line, before any request
        self._proxy = env_proxy(self.endpoint, aiohttp=self.via_aiohttp)
        self._api_key, self._timeout, self._max_retries = api_key, timeout, max_retries
        self._concurrency = max(concurrency, 1)
        # no more failures in a row than requests in flight (3 at least: one burst is no death)
        self.breaker = Breaker(min(8, max(3, self._concurrency)))
        self._client: Any = None
        self._lock = threading.Lock()

    def warm(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._build()
            return self._client

    def _build(self) -> Any:
        import openai

        transport = _watching_transport(self.breaker, self._concurrency, self._proxy)
        return openai.AsyncOpenAI(
            base_url=self.endpoint,
            api_key=self._api_key or "EMPTY",  # local servers need no key; the client wants one
            timeout=self._timeout,
            max_retries=self._max_retries,
            http_client=openai.DefaultAsyncHttpxClient(transport=transport, timeout=self._timeout),
        )

    async def complete(self, request: Request) -> ModelResponse:
        """One request; the reply's JSON read as a completion. The body is the one the cache
        key hashes (a preset's ``wire`` bytes as they are)."""
        client = self._client if self._client is not None else self.warm()
        path = "/chat/completions" if request.api == "chat" else "/completions"
        wire = request.wire if request.wire is not None else json.dumps(request.body(self.model))
        data = await self._post(client, path, wire.encode("utf-8"))
        return parse_reply(data, chat=request.api == "chat", breaker=self.breaker)

    async def _post(self, client: Any, path: str, payload: bytes) -> Any:
        """openai's documented ``post`` with ``cast_to=object``: its retries and errors without
        its typed layer, a third less CPU per request (CPU the test thread shares)."""
        try:
            return await client.post(path, content=payload, cast_to=object)
        except json.JSONDecodeError as exc:  # a reply labelled JSON that is not
            raise bad_reply("is not JSON", exc.doc) from None
        except UnicodeDecodeError as exc:
            raise bad_reply("is not JSON", str(exc.object, "utf-8", "replace")) from None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def parse_reply(data: Any, *, chat: bool, breaker: Breaker) -> ModelResponse:
    """A chat or text completion reply (decoded JSON) as a ModelResponse (:class:`Said`: it is
    none; a retry gets the same); token counts that are not counts are left out, said once."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        raise bad_reply("has no choices", data)
    choices = [c for c in data["choices"] if isinstance(c, dict)]
    if not choices:
        raise Said("the endpoint's reply has no choices (an empty list)")
    choices.sort(key=lambda c: c["index"] if isinstance(c.get("index"), int) else 0)
    completions = []
    for choice in choices:
        message = choice.get("message") if chat else None
        message = message if isinstance(message, dict) else {}
        content = message.get("content") if chat else choice.get("text")
        reasoning = _str(message.get("reasoning_content") or message.get("reasoning"))
        if content is None and reasoning is None:
            null = "message content is null, no reasoning" if chat else "text is null"
            raise Said(f"the endpoint's reply has no answer ({null})")
        if isinstance(content, list):  # content parts
            parts = [p for p in content if isinstance(p, dict) and p.get("type", "text") == "text"]
            content = "".join(str(part.get("text", "")) for part in parts)
        text = content if isinstance(content, str) else ""
        completions.append(Completion(text, _str(choice.get("finish_reason")), reasoning))
    usage, bad = valid_usage(data.get("usage"), ("prompt_tokens", "completion_tokens"))
    if bad:
        breaker.notes.setdefault(
            "usage",
            f"gsm8k: the endpoint reported token counts that are not counts ({', '.join(bad)}); "
            "they are left out of the token totals",
        )
    return ModelResponse(
        completions,
        usage,
        _str(data.get("model")),
        fingerprint=_str(data.get("system_fingerprint")),
    )


class CallableClient:
    """A user's Python callable, called in a thread pool (an async one only makes its coroutine
    there, awaited on the loop). Its answers are never cached across runs: its code may change
    between them."""

    persistent_cache = False

    def __init__(self, fn: ModelCallable, *, concurrency: int, model: str | None = None) -> None:
        self.fn = fn
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        module = getattr(fn, "__module__", None) or ""
        # what a person reads: the dotted path to the function, without ``<locals>``
        dotted = ".".join(p for p in f"{module}.{name}".split(".") if p and p != "<locals>")
        self.endpoint, self.model = f"callable:{dotted}", model or dotted
        self._pool = ThreadPoolExecutor(max_workers=max(concurrency, 1), thread_name_prefix="gsm8k")

    async def complete(self, request: Request) -> ModelResponse:
        import asyncio

        reply: Any = await asyncio.get_running_loop().run_in_executor(self._pool, self.fn, request)
        if inspect.isawaitable(reply):
            reply = await reply
        if isinstance(reply, ModelResponse):
            return reply
        if isinstance(reply, str | Completion):
            reply = [reply]
        if isinstance(reply, list | tuple) and all(isinstance(x, str | Completion) for x in reply):
            return ModelResponse([x if isinstance(x, Completion) else Completion(x) for x in reply])
        raise TypeError(
            f"gsm8k_model {self.endpoint} returned {type(reply).__name__}; expected a str, a "
            "list of str, a Completion or a ModelResponse"
        )

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
