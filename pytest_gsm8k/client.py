"""Model clients: the async openai client, or any Python callable.

Both expose ``async complete(request) -> ModelResponse``. Retries with
backoff and ``Retry-After`` are the openai client's own (configured, not
rewritten); this module only adds a transport that watches connection-level
failures so the engine can stop a run in seconds when the endpoint dies.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Protocol

from pytest_gsm8k.types import Completion, ModelResponse, Request


def _httpx() -> Any:
    """The HTTP library the installed openai package is built on (httpx, or httpx2)."""
    try:
        return importlib.import_module("httpx2")
    except ImportError:  # pragma: no cover - depends on the openai release
        return importlib.import_module("httpx")


class ModelClient(Protocol):
    """What the engine needs from a model."""

    #: identifies the endpoint in cache keys (base URL, or ``callable:<name>``)
    endpoint: str
    #: model id sent in requests and stored in cache keys
    model: str
    #: whether answers may be cached across runs
    persistent_cache: bool

    async def complete(self, request: Request) -> ModelResponse: ...

    async def aclose(self) -> None: ...


class Breaker:
    """Counts consecutive connection-level failures across all requests.

    It opens when ``threshold`` failures happened in a row *and* the streak
    has lasted ``min_seconds``: a brief blip (a few refused connections that
    the openai client's retries absorb) does not end a long run, a dead
    endpoint does, within a few seconds.
    """

    def __init__(self, threshold: int = 8, min_seconds: float = 2.0) -> None:
        self.threshold = threshold
        self.min_seconds = min_seconds
        self.count = 0
        self.first: float | None = None
        self.last_error = ""
        self.on_open: Callable[[str], None] | None = None

    def streak_seconds(self) -> float:
        """How long the current streak of failures has lasted."""
        return 0.0 if self.first is None else time.monotonic() - self.first

    def success(self) -> None:
        self.count = 0
        self.first = None

    def failure(self, error: BaseException) -> None:
        now = time.monotonic()
        if self.count == 0:
            self.first = now
        self.count += 1
        self.last_error = f"{type(error).__name__}: {error}".strip()
        if (
            self.count >= self.threshold
            and self.first is not None
            and now - self.first >= self.min_seconds
            and self.on_open is not None
        ):
            self.on_open(self.last_error)


def _watching_transport(breaker: Breaker, limits: Any) -> Any:
    httpx = _httpx()
    base: Any = httpx.AsyncBaseTransport

    class WatchingTransport(base):  # type: ignore[misc]
        """Forwards to the normal transport, telling the breaker what happened."""

        def __init__(self) -> None:
            self.inner = httpx.AsyncHTTPTransport(limits=limits)

        async def handle_async_request(self, request: Any) -> Any:
            try:
                response = await self.inner.handle_async_request(request)
            except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
                breaker.failure(exc)
                raise
            breaker.success()
            return response

        async def aclose(self) -> None:
            await self.inner.aclose()

    return WatchingTransport()


class OpenAIClient:
    """An OpenAI-compatible endpoint through ``openai.AsyncOpenAI``."""

    persistent_cache = True

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        max_retries: int,
        concurrency: int,
        breaker: Breaker,
    ) -> None:
        import openai

        httpx = _httpx()
        limits = httpx.Limits(
            max_connections=max(concurrency, 1), max_keepalive_connections=max(concurrency, 1)
        )
        http_client = openai.DefaultAsyncHttpxClient(
            transport=_watching_transport(breaker, limits), timeout=timeout
        )
        # Local servers (vLLM, llama.cpp, Ollama) need no key, but the client insists on one.
        self._client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "EMPTY",
            timeout=timeout,
            max_retries=max_retries,
            http_client=http_client,
        )
        self.endpoint = str(self._client.base_url).rstrip("/")
        self.model = model

    async def complete(self, request: Request) -> ModelResponse:
        """One call, through the client's own retries (429/5xx/dropped, ``Retry-After``).

        ``post`` with the exact JSON body (the one the cache key hashes) and
        ``cast_to=object`` is the openai client's documented way to call an
        endpoint without its typed layer: same retries, timeouts and errors,
        but no parameter transformation and no pydantic models for the reply,
        which is about a third of the client's CPU time per request, and CPU
        is what the test thread and this loop share.
        """
        path = "/chat/completions" if request.api == "chat" else "/completions"
        data = await self._client.post(path, body=request.body(self.model), cast_to=object)
        return parse_reply(data, chat=request.api == "chat")

    async def aclose(self) -> None:
        await self._client.close()


class BadReply(Exception):
    """The endpoint answered 200 with something that is not a completion."""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(
            str(part.get("text", "")) for part in content
            if isinstance(part, dict) and part.get("type", "text") == "text"
        )
    return ""


def _choice_index(choice: dict[str, Any]) -> int:
    index = choice.get("index")
    return index if isinstance(index, int) else 0


def parse_reply(data: Any, *, chat: bool) -> ModelResponse:
    """A chat or text completion reply (JSON, already decoded) as a ModelResponse."""
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list):
        shown = str(data).strip().splitlines()[0][:200] if data else repr(data)
        raise BadReply(f"the endpoint's reply has no choices: {shown}")
    choices = [c for c in data["choices"] if isinstance(c, dict)]
    choices.sort(key=_choice_index)
    completions = []
    for choice in choices:
        finish = choice.get("finish_reason")
        finish = finish if isinstance(finish, str) else None
        if chat:
            message = choice.get("message")
            message = message if isinstance(message, dict) else {}
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            completions.append(Completion(
                text=_text(message.get("content")),
                finish_reason=finish,
                reasoning=reasoning if isinstance(reasoning, str) else None,
            ))
        else:
            completions.append(Completion(text=_text(choice.get("text")), finish_reason=finish))
    usage = data.get("usage")
    usage_dict: dict[str, int] = {}
    if isinstance(usage, dict):
        for name in ("prompt_tokens", "completion_tokens"):
            value = usage.get(name)
            usage_dict[name] = int(value) if isinstance(value, int | float) else 0
    reported = data.get("model")
    return ModelResponse(
        completions=completions,
        usage=usage_dict,
        model=reported if isinstance(reported, str) else None,
    )


Reply = str | list[str] | Completion | list[Completion] | ModelResponse
UserModel = Callable[[Request], Reply | Awaitable[Reply]]


def _to_response(reply: Any, where: str) -> ModelResponse:
    """Accept the shapes a user's callable may reasonably return."""
    if isinstance(reply, ModelResponse):
        return reply
    if isinstance(reply, str | Completion):
        reply = [reply]
    if isinstance(reply, list | tuple) and all(isinstance(x, str | Completion) for x in reply):
        return ModelResponse(
            completions=[x if isinstance(x, Completion) else Completion(text=x) for x in reply]
        )
    raise TypeError(
        f"{where} returned {type(reply).__name__}; expected a str, a list of str, "
        "a Completion or a ModelResponse"
    )


class CallableClient:
    """A user's Python callable (sync runs in a thread pool, async on the loop)."""

    persistent_cache = False  # the callable's code may change between runs: never reuse answers

    def __init__(self, fn: UserModel, *, concurrency: int, model: str | None = None) -> None:
        self.fn = fn
        name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        self.endpoint = f"callable:{getattr(fn, '__module__', '')}.{name}"
        self.model = model or name
        self._pool = ThreadPoolExecutor(max_workers=max(concurrency, 1), thread_name_prefix="gsm8k")
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            getattr(fn, "__call__", None)  # noqa: B004 - callable objects with async __call__
        )

    async def complete(self, request: Request) -> ModelResponse:
        if self._is_async:
            reply: Any = await self.fn(request)  # type: ignore[misc]
        else:
            loop = asyncio.get_running_loop()
            reply = await loop.run_in_executor(self._pool, self.fn, request)
            if inspect.isawaitable(reply):
                reply = await reply
        return _to_response(reply, f"gsm8k_model {self.endpoint}")

    async def aclose(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def one_sample(request: Request) -> Request:
    """The request for a single extra sample when the endpoint ignored ``n``."""
    return replace(request, n=1)
