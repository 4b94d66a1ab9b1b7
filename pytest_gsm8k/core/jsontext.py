"""In: JSON from outside with its nesting capped (``json.loads`` raises ``RecursionError``, not
a ``ValueError``, on text thousands deep; nothing read here needs more than a few levels). Out:
JSON text that always encodes as UTF-8, a lone surrogate (half an emoji) a server sent kept as
the ``\\uXXXX`` escape it arrived as, which every JSON reader reads back the same."""

from __future__ import annotations

import json
import re
from typing import Any

MAX_DEPTH = 64
_SURROGATE = re.compile("[\ud800-\udfff]")


class TooDeep(ValueError):
    """JSON text nested deeper than :data:`MAX_DEPTH` levels."""


def loads(text: str | bytes) -> Any:
    """``json.loads``, refusing nesting deeper than :data:`MAX_DEPTH` with :class:`TooDeep`."""
    try:
        level = [value := json.loads(text)]
        for _ in range(MAX_DEPTH + 1):  # one level's containers at a time, without recursion
            if not (level := [c for c in level if isinstance(c, dict | list)]):
                return value  # (no level left to walk: a row or a reply is 2-3 deep, not 64)
            level = [v for c in level for v in (c.values() if isinstance(c, dict) else c)]
    except RecursionError:
        pass
    raise TooDeep(f"JSON nested deeper than {MAX_DEPTH} levels")


def escape_surrogates(text: str) -> str:
    """``text`` with each lone surrogate written as its ``\\uXXXX`` escape (UTF-8-safe)."""
    return text if text.isascii() else _SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def to_json(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, **kwargs)`` that encodes as UTF-8 and decodes to
    exactly ``obj`` (a raw surrogate only occurs inside a string)."""
    return escape_surrogates(json.dumps(obj, ensure_ascii=False, **kwargs))
