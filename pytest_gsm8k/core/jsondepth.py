"""JSON text from outside (baselines, data rows, option values) with its nesting capped. Pure.

``json.loads`` raises ``RecursionError`` (no ``ValueError``: it escapes every handler for bad
JSON) on text thousands of levels deep, and what walks a value hundreds deep later may recurse
past the limit. Nothing this plugin reads needs more than a handful of levels.
"""

from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 64


class TooDeep(ValueError):
    """JSON text nested deeper than :data:`MAX_DEPTH` levels."""


def loads(text: str | bytes) -> Any:
    """``json.loads``, refusing nesting deeper than :data:`MAX_DEPTH` with :class:`TooDeep`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"JSON nested deeper than {MAX_DEPTH} levels") from None
    level = [value]  # one level at a time, without recursion
    for _ in range(MAX_DEPTH):
        level = [v for c in level if isinstance(c, dict | list) for v in _children(c)]
    if any(isinstance(c, dict | list) for c in level):
        raise TooDeep(f"JSON nested deeper than {MAX_DEPTH} levels")
    return value


def _children(container: dict[str, Any] | list[Any]) -> Any:
    return container.values() if isinstance(container, dict) else container
