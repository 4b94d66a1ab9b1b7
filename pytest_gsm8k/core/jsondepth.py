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
        level = [value := json.loads(text)]
        for _ in range(MAX_DEPTH):  # one level at a time, without recursion
            level = [v for c in level if isinstance(c, dict | list) for v in _values(c)]
        if not any(isinstance(c, dict | list) for c in level):
            return value
    except RecursionError:
        pass
    raise TooDeep(f"JSON nested deeper than {MAX_DEPTH} levels")


def _values(container: dict[str, Any] | list[Any]) -> Any:
    return container.values() if isinstance(container, dict) else container
