"""JSON and text that always encode as UTF-8, whatever a server sent. Pure.

A JSON reply may hold a lone UTF-16 surrogate (``"\\ud83d"``, half of an emoji):
legal JSON, which Python decodes to a string that UTF-8 cannot encode. Such
text is kept, never dropped or replaced: it is written back as the same
``\\uXXXX`` escape it arrived as, which every JSON reader (Python's, a
browser's ``JSON.parse``) turns into the very same string. Outside JSON (a
terminal line, an HTML page's text) the escape is shown as it is.
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
    """``json.dumps(obj, ensure_ascii=False, **kwargs)`` whose text encodes as UTF-8.

    JSON output holds a raw surrogate only inside a string, where its escape
    means the same character: the result decodes to exactly ``obj``.
    """
    return escape_surrogates(json.dumps(obj, ensure_ascii=False, **kwargs))


def to_json_bytes(obj: Any, **kwargs: Any) -> bytes:
    """:func:`to_json`, encoded as UTF-8."""
    return to_json(obj, **kwargs).encode("utf-8")
