"""When a failed model request is tried again, and after how long: the openai client's policy
(openai-python ``_base_client.py``: ``_should_retry``, ``_calculate_retry_timeout``), copied for
the vllm preset's aiohttp client (runtime/wire.py). openai's own cannot serve: it is private to
its client, which the preset does not go through (for speed); tests/unit/core/test_retry.py asks
the installed openai the same questions. Pure: no HTTP, no clock but the one passed in.
"""

from __future__ import annotations

import email.utils
import math
from collections.abc import Callable, Mapping

#: the openai client's defaults (``_constants.py``)
INITIAL_DELAY = 0.5
MAX_DELAY = 8.0
MAX_RETRY_AFTER = 120.0

#: statuses retried besides every 5xx
RETRIED_STATUSES = (408, 409, 429)


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the server asked to wait (``retry-after-ms``, else ``Retry-After`` as seconds
    or an HTTP date), or ``None`` when it asked nothing readable. ``now`` is the Unix time
    an HTTP date is measured from. An overflowing number is a wait over the maximum."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = _header(headers, name)
        if value is None:
            continue
        try:
            delay = float(value)
        except ValueError:
            continue
        if delay == math.inf and value.strip().lower() not in ("inf", "+inf", "infinity"):
            return MAX_RETRY_AFTER + 1
        return delay / divisor
    value = _header(headers, "retry-after")
    if value is None:
        return None
    parsed = email.utils.parsedate_tz(value)
    if parsed is None:
        return None
    return float(email.utils.mktime_tz(parsed)) - now


def should_retry(status: int, headers: Mapping[str, str], now: float) -> bool:
    """Whether an HTTP error reply is worth asking again."""
    wait = retry_after(headers, now)
    if wait is not None and math.isfinite(wait) and wait > MAX_RETRY_AFTER:
        return False
    said = _header(headers, "x-should-retry")
    if said == "true":
        return True
    if said == "false":
        return False
    return status in RETRIED_STATUSES or status >= 500


def retry_delay(
    retries_done: int,
    headers: Mapping[str, str] | None,
    now: float,
    random: Callable[[], float],
) -> float:
    """Seconds to wait before retry number ``retries_done + 1``. ``headers`` are the failed
    reply's (``None`` for a connection failure); ``random`` gives [0, 1) for the jitter."""
    if headers is not None:
        wait = retry_after(headers, now)
        if wait is not None and math.isfinite(wait) and 0 < wait <= MAX_RETRY_AFTER:
            return wait
    base = min(INITIAL_DELAY * 2.0 ** min(retries_done, 1000), MAX_DELAY)
    return max(0.0, base * (1 - 0.25 * random()))


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """A header by name, whatever its case (HTTP libraries differ in how they store it)."""
    value = headers.get(name)
    if value is None:
        value = next((v for k, v in headers.items() if k.lower() == name), None)
    return value
