"""JSON text from outside (baselines, data rows, option values) with its nesting capped. Pure.

``json.loads`` raises ``RecursionError`` (no ``ValueError``: it escapes every handler for bad
JSON) on text thousands of levels deep, and what walks a value hundreds deep later may
recurse past the limit. Nothing this plugin reads needs more than a handful of levels.
"""

from __future__ import annotations

import json
from typing import Any

#: containers inside containers allowed in JSON text from outside
MAX_DEPTH = 64


class TooDeep(ValueError):
    """JSON text nested deeper than :data:`MAX_DEPTH` levels."""


def loads(text: str | bytes, max_depth: int = MAX_DEPTH) -> Any:
    """``json.loads``, refusing nesting deeper than ``max_depth`` with :class:`TooDeep`."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise TooDeep(f"JSON nested deeper than {max_depth} levels") from None
    if depth_exceeds(value, max_depth):
        raise TooDeep(f"JSON nested deeper than {max_depth} levels")
    return value


def depth_exceeds(value: Any, max_depth: int = MAX_DEPTH) -> bool:
    """Whether ``value`` holds containers nested more than ``max_depth`` deep (no recursion)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if level + 1 > max_depth:
            return True
        stack.extend((child, level + 1) for child in children)
    return False
