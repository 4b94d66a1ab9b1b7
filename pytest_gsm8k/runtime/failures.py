"""What went wrong with an endpoint, in one line: the failures a model call ends in, and
:func:`describe_error`, which words them (docs/design.md, "Failures")."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

from pytest_gsm8k.core.health import reasoning_model_hint
from pytest_gsm8k.core.retry import RETRIED_STATUSES
from pytest_gsm8k.core.scrub import shown_url
from pytest_gsm8k.core.settings import with_v1


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


def bad_reply(what: str, body: Any) -> Said:
    """A 2xx reply that holds no completion, worded alike by both clients: ``what`` it is and
    the first line of its ``body`` (200 characters; whitespace only: ``''``)."""
    return Said(f"the endpoint's reply {what}: {first_line(str(body)) or repr('')}")


def first_line(text: str) -> str:
    """Outside text as a message quotes it: first line, 200 characters. Always the message's
    end: a key the cut falls inside is hidden only at a line's end (Scrubber.text's ``cut``)."""
    return (text.strip().splitlines() or [""])[0][:200]


class WireFailure(Exception):
    """The vllm preset's client gave up on a request to ``url`` (it never imports openai), with
    what :func:`describe_error` reads of openai's errors (and ``timed_out``: no answer in
    time); the ``headers`` for the retry policy."""

    def __init__(
        self, url: str, status: int | None, body: Any, headers: Any = None, timed_out: bool = False
    ) -> None:
        text = body if isinstance(body, str) else json.dumps(body)
        self.message = first_line(text) or "error"
        super().__init__(f"HTTP {status}: {self.message}" if status else self.message)
        self.status_code, self.body, self.headers = status, body, headers
        self.request, self.timed_out = SimpleNamespace(method="POST", url=url), timed_out


def describe_error(exc: BaseException, own: bool = True) -> tuple[str, bool, bool]:
    """(one-line message, fatal?, refused?) for an exception from a model call; its status
    classifies it, whatever its shape: fatal (401, 403, own 404: no later request gets through)
    ends the run; refused, a 4xx no retry changes, ends it before any answer. Both HTTP
    clients' failures are read by the attributes of openai's errors (the wire client's too):
    ``body``, ``request``, ``status_code`` (None: no answer came); openai is looked up, never
    imported. ``own``: the plugin's own client's, with hints naming its options; a user's
    function reads none (its 404, maybe a lookup's for one problem, is refused); any other
    exception is said as is."""
    if isinstance(exc, Said):
        return str(exc), exc.fatal, False
    status = getattr(exc, "status_code", None)
    fatal = status in (401, 403) or (own and status == 404)
    refused = not fatal and status in range(400, 500) and status not in RETRIED_STATUSES
    # an HTTP client's failure has a body and a request naming its method and URL (the body
    # asked first: an httpx error's unset request raises); anything else is said as it is
    request: Any = getattr(exc, "request", None) if hasattr(exc, "body") else None
    shaped = hasattr(request, "method") and hasattr(request, "url")
    if not (shaped and isinstance(status, int | None)):
        return f"{type(exc).__name__}: {first_line(str(exc))}".rstrip(": "), fatal, refused
    if status is None:  # no answer came
        openai = sys.modules.get("openai")  # none of its errors exists before its import
        timeouts = (openai.APITimeoutError,) if openai else ()
        if getattr(exc, "timed_out", False) or isinstance(exc, timeouts):
            see = " (see --gsm8k-timeout)" if own else ""
            return f"request timed out after retries{see}", False, False
        cause = exc.__cause__
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        return f"connection failed after retries{detail}", False, False
    found = getattr(exc, "body", None)
    body: dict[str, Any] = found if isinstance(found, dict) else {}
    error: dict[str, Any] = body["error"] if isinstance(body.get("error"), dict) else {}
    message = body.get("message") or error.get("message") or body.get("detail")  # FastAPI's 404
    message = first_line(str(message or getattr(exc, "message", exc)))
    if status < 100:  # a client's stand-in (0) where no HTTP answer gave one (600: an answer)
        return f"no HTTP status (status_code {status}): {message}", False, False
    if status in (401, 403):
        see = "; check the API key variable" if own else f": {message}"
        return f"the endpoint rejected the credentials (HTTP {status}){see}", True, False
    if status == 404:  # the URL that answered and, lacking /v1 (the usual cause), the fix
        shown = shown_url(str(request.url))
        paths = ("/chat/completions", "/completions")  # what the clients append to the base
        base = next((shown[: -len(p)] for p in paths if shown.endswith(p)), shown)
        fix = ""
        if own and (suggested := with_v1(base)) is not None:
            fix = f" (the base URL {base} does not end in /v1: try --gsm8k-base-url={suggested})"
        return f"{request.method} {shown} answered 404{fix}: {message}", fatal, refused
    retried = " after retries" if status in RETRIED_STATUSES or status >= 500 else ""
    hint = reasoning_model_hint(message) if status == 400 and own else None
    return f"HTTP {status}{retried}: {f'{hint}; ' if hint else ''}{message}", False, refused
