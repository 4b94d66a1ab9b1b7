"""JSON and text that always encode as UTF-8: a lone surrogate (half an emoji) a server sent is
kept as the ``\\uXXXX`` escape it arrived as, which every JSON reader reads back the same. Pure."""

from __future__ import annotations

import json
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def escape_surrogates(text: str) -> str:
    """``text`` with each lone surrogate written as its ``\\uXXXX`` escape (UTF-8-safe)."""
    return text if text.isascii() else _SURROGATE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


def to_json(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, **kwargs)`` that encodes as UTF-8 and decodes to
    exactly ``obj`` (a raw surrogate only occurs inside a string)."""
    return escape_surrogates(json.dumps(obj, ensure_ascii=False, **kwargs))


def to_json_bytes(obj: Any, **kwargs: Any) -> bytes:
    return to_json(obj, **kwargs).encode("utf-8")
