"""What went wrong with an endpoint, in one line: the failures a model call ends in, and
:func:`describe_error`, which words either client's and says whether it ends the run (every
unfinished item then fails with that line; docs/design.md, "Failures")."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from pytest_gsm8k.core.health import reasoning_model_hint
from pytest_gsm8k.core.retry import RETRIED_STATUSES
from pytest_gsm8k.core.scrub import shown_url
from pytest_gsm8k.core.settings import with_v1

_PATHS = ("/chat/completions", "/completions")  # what the clients append to the base URL


class EndpointError(Exception):
    """One item's request failed (after retries)."""


class EndpointAborted(EndpointError):
    """The endpoint is unusable; every remaining item fails with this message."""


class SaidElsewhere(EndpointError):
    """Reported in full by another item (a config's server that died): skipped quietly."""


class NotRun(Exception):
    """The run stopped early (the gates' verdicts are settled): this item is not run."""


class Said(Exception):
    """A failure its message says in full (a reply read no further or too large, never retried:
    a retry gets the same reply); ``fatal``: it ends the run (a reply from another model)."""

    def __init__(self, message: str, fatal: bool = False) -> None:
        super().__init__(message)
        self.fatal = fatal


class WireFailure(Exception):
    """The vllm preset's client gave up: ``kind`` timeout, connection or status."""

    status_code: int | None = None
    headers: Any = None

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


class HTTPStatusFailure(WireFailure):
    """An HTTP error status, shaped like ``openai.APIStatusError`` to be worded the same way."""

    def __init__(self, status: int, body: Any, url: str, headers: Any) -> None:
        text = body if isinstance(body, str) else json.dumps(body)
        self.message = (text.strip().splitlines() or ["error"])[0][:200]
        super().__init__(f"HTTP {status}: {self.message}", "status")
        self.status_code, self.body, self.headers = status, body, headers
        self.request = SimpleNamespace(method="POST", url=url)


def refused_first(status: object, succeeded: int) -> bool:
    """A 4xx no retry changes before anything succeeded: the endpoint refuses what we send."""
    client_error = isinstance(status, int) and 400 <= status < 500
    return client_error and status not in RETRIED_STATUSES and not succeeded


def describe_error(exc: BaseException) -> tuple[str, bool]:
    """(one-line message, fatal?) for an exception from a model call."""
    if isinstance(exc, Said):
        return str(exc), exc.fatal
    if isinstance(exc, WireFailure):  # the vllm preset's client: no openai import
        kind = exc.kind
    else:
        import openai

        kinds = {
            "status": openai.APIStatusError,
            "timeout": openai.APITimeoutError,  # a connection error too: asked first
            "connection": openai.APIConnectionError,
        }
        kind = next((k for k, t in kinds.items() if isinstance(exc, t)), "")
    status = getattr(exc, "status_code", 0) if kind == "status" else 0
    if kind == "timeout":
        return "request timed out after retries (see --gsm8k-timeout)", False
    if kind == "connection":
        cause = exc.__cause__
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        return f"connection failed after retries{detail}", False
    if status in (401, 403):
        return (
            f"the endpoint rejected the credentials (HTTP {status}); check the API key variable",
            True,
        )
    if status == 404:  # the URL that answered and, lacking /v1 (the usual cause), the fix
        request: Any = exc.request  # type: ignore[attr-defined]
        shown = shown_url(str(request.url))
        base = next((shown[: -len(p)] for p in _PATHS if shown.endswith(p)), shown)
        line = f"{request.method} {shown} answered 404: {_api_message(exc)}"
        if (suggested := with_v1(base)) is not None:
            line += f" (the base URL {base} does not end in /v1: try --gsm8k-base-url={suggested})"
        return line, True
    if status:
        retried = " after retries" if status in RETRIED_STATUSES or status >= 500 else ""
        message = _api_message(exc)
        hint = reasoning_model_hint(message) if status == 400 else None
        return f"HTTP {status}{retried}: {message}" + (f"; {hint}" if hint else ""), False
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": "), False


def _api_message(exc: Any) -> str:
    found = getattr(exc, "body", None)
    body: dict[str, Any] = found if isinstance(found, dict) else {}
    error: dict[str, Any] = body["error"] if isinstance(body.get("error"), dict) else {}
    message = body.get("message") or error.get("message") or body.get("detail")  # FastAPI's 404
    return str(message) if message else str(getattr(exc, "message", exc)).splitlines()[0]
