"""JSON and text that always encode as UTF-8, whatever a server sent. Pure.

A JSON reply may hold a lone UTF-16 surrogate (half an emoji), which UTF-8 cannot encode.
It is kept, written back as the ``\\uXXXX`` escape it arrived as: every JSON reader turns
that into the same string, and elsewhere the escape is shown as it is.
"""

from __future__ import annotations

import json
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match.group()):04x}"


def escape_surrogates(text: str) -> str:
    """``text`` with each lone surrogate written as its ``\\uXXXX`` escape (UTF-8-safe)."""
    if text.isascii():
        return text
    return _SURROGATE.sub(_escape, text)


def to_json(obj: Any, **kwargs: Any) -> str:
    """``json.dumps(obj, ensure_ascii=False, **kwargs)`` whose text encodes as UTF-8 and
    decodes to exactly ``obj`` (a raw surrogate only occurs inside a string)."""
    return escape_surrogates(json.dumps(obj, ensure_ascii=False, **kwargs))


def to_json_bytes(obj: Any, **kwargs: Any) -> bytes:
    """:func:`to_json`, encoded as UTF-8."""
    return to_json(obj, **kwargs).encode("utf-8")
