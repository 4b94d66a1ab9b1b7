"""What a server says about the model behind a name, for the cache to compare. Pure.

A model name is an alias (``prod``, ``default``, vLLM's served name, OpenAI's
``gpt-4o``): the checkpoint behind it can change while the URL and the name
stay. Cached answers are reused only when the server still describes itself
as it did when they were recorded, in two places:

* ``GET /v1/models``, once per run: the listed card of the model (its ``id``
  and, where the server gives them, ``root``, ``owned_by`` and
  ``max_model_len``; never ``created``, which vLLM sets to the time of the
  request): :func:`describe_server`;
* every reply: its ``model`` (OpenAI resolves an alias to a dated snapshot
  there) and ``system_fingerprint`` (the serving stack's build):
  :func:`reply_identity`.

:func:`difference` names the first thing that differs, for the one line
that says why cached answers were asked again.
"""

from __future__ import annotations

from typing import Any

#: the fields of a ``/v1/models`` card that describe the model behind a name
CARD_FIELDS = ("id", "root", "owned_by", "max_model_len")

#: a reply's fields that name the model that answered
REPLY_FIELDS = ("model", "system_fingerprint")

Description = dict[str, Any]


def describe_server(cards: list[dict[str, Any]], model: str) -> Description | None:
    """The card ``GET /v1/models`` lists for ``model``, cut to :data:`CARD_FIELDS` (only
    those given, as strings or numbers); None when the listing has no such card."""
    for card in cards:
        if card.get("id") == model:
            return {
                name: card[name]
                for name in CARD_FIELDS
                if isinstance(card.get(name), str | int | float)
                and not isinstance(card.get(name), bool)
            }
    return None


def reply_identity(model: Any, fingerprint: Any) -> tuple[str | None, str | None]:
    """(model, system_fingerprint) of a reply; anything but a string counts as absent."""
    return (
        model if isinstance(model, str) else None,
        fingerprint if isinstance(fingerprint, str) else None,
    )


def difference(recorded: Description | None, current: Description | None) -> str | None:
    """The first field of a server description that differs, as ``name 'old' -> 'new'``
    (``(none)`` for a field not given); None when the two are the same."""
    if recorded == current:
        return None
    if recorded is None or current is None:
        shown = "no /v1/models card"
        return (
            f"{shown} -> {_card(current)}" if recorded is None else f"{_card(recorded)} -> {shown}"
        )
    for name in sorted(set(recorded) | set(current), key=_field_order):
        old, new = recorded.get(name), current.get(name)
        if old != new:
            return f"{name} {_shown(old)} -> {_shown(new)}"
    return None  # pragma: no cover - equal dicts returned above


def reply_difference(
    recorded: tuple[str | None, str | None], current: tuple[str | None, str | None]
) -> str | None:
    """The first field of two reply identities that differs, as ``reply model 'a' -> 'b'``."""
    for name, old, new in zip(REPLY_FIELDS, recorded, current, strict=True):
        if old != new:
            return f"reply {name} {_shown(old)} -> {_shown(new)}"
    return None


def _field_order(name: str) -> tuple[int, str]:
    return (CARD_FIELDS.index(name) if name in CARD_FIELDS else len(CARD_FIELDS), name)


def _shown(value: Any) -> str:
    return "(none)" if value is None else repr(value)


def _card(description: Description | None) -> str:
    if not description:
        return "an empty card"
    return "card " + ", ".join(
        f"{name}={description[name]!r}" for name in sorted(description, key=_field_order)
    )
