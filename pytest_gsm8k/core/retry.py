"""When a failed model request is tried again, and after how long: the openai client's policy
(openai-python ``_base_client.py``, private to its client), copied for the vllm preset's
aiohttp client (runtime/wire.py); tests/unit/core/test_retry.py asks the installed openai the
same questions."""

from __future__ import annotations

import email.utils
import math
from collections.abc import Callable, Mapping

#: the openai client's default (``_constants.py``)
MAX_RETRY_AFTER = 120.0

#: statuses retried besides every 5xx
RETRIED_STATUSES = (408, 409, 429)


def retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the server asked to wait (``retry-after-ms``, else ``Retry-After`` as seconds
    or an HTTP date measured from ``now``), or ``None``; an overflowing number is too long."""
    said = _lower(headers)
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        try:
            delay = float(said[name])
        except (KeyError, ValueError):
            continue
        if delay == math.inf and said[name].strip().lower() not in ("inf", "+inf", "infinity"):
            return MAX_RETRY_AFTER + 1
        return delay / divisor
    parsed = email.utils.parsedate_tz(said.get("retry-after", ""))
    return None if parsed is None else float(email.utils.mktime_tz(parsed)) - now


def should_retry(status: int, headers: Mapping[str, str], now: float) -> bool:
    wait = retry_after(headers, now)
    if wait is not None and math.isfinite(wait) and wait > MAX_RETRY_AFTER:
        return False
    said = _lower(headers).get("x-should-retry")
    if said in ("true", "false"):
        return said == "true"
    return status in RETRIED_STATUSES or status >= 500


def retry_delay(
    retries_done: int, headers: Mapping[str, str] | None, now: float, random: Callable[[], float]
) -> float:
    """Seconds to wait before retry number ``retries_done + 1`` after a reply with ``headers``
    (``None``: a connection failure); ``random`` gives [0, 1) for the jitter."""
    wait = None if headers is None else retry_after(headers, now)
    if wait is not None and math.isfinite(wait) and 0 < wait <= MAX_RETRY_AFTER:
        return wait
    # openai's INITIAL_RETRY_DELAY 0.5 and MAX_RETRY_DELAY 8.0 (``_constants.py``)
    base = min(0.5 * 2.0 ** min(retries_done, 1000), 8.0)
    return max(0.0, base * (1 - 0.25 * random()))


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    """Header names in lower case (HTTP libraries differ in how they store them); a header
    sent twice keeps its first value, as ``headers.get`` reads it."""
    return {name.lower(): value for name, value in reversed(list(headers.items()))}
