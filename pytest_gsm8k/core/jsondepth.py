"""JSON from outside with its nesting capped: ``json.loads`` raises ``RecursionError`` (not a
``ValueError``) on text thousands deep, and nothing read here needs more than a few. Pure."""

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
