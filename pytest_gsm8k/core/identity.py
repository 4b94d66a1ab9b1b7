"""What a server says about the model behind a name, for the cache to compare. Pure.

A name is an alias (``prod``, vLLM's served name, ``gpt-4o``): the checkpoint behind it can
change while URL and name stay, so cached answers are reused only while ``GET /v1/models``'s
card (:func:`describe_server`; never ``created``, which vLLM sets per request) and each
reply's ``model`` and ``system_fingerprint`` (:func:`reply_identity`) still say what they
said (docs/design.md#the-cache-and-its-identity-rule). The same two say whether the model
named answers at all: a request with no ``model`` field (the ``vllm`` preset) is answered by
the server's default model, the base under LoRA adapters (:func:`unnamed_answerer`,
:func:`unnamed_reply`, :func:`unnamed_refusal`).
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


def unnamed_answerer(cards: list[dict[str, Any]], model: str) -> str | None:
    """Why the listing shows that a request with no ``model`` field is not answered by
    ``model``, or None (the one model served, a base beside its own adapters and aliases, or
    not listed at all: the preflight refuses that)."""
    ids = {card.get("id") for card in cards if isinstance(card.get("id"), str)}
    named = next((card for card in cards if card.get("id") == model), None)
    if named is None:
        return None
    base = _base_of(named, ids)
    if base is not None:
        return f"GET /v1/models lists it as an adapter of {_brief(base)}, which answers instead"
    others = [
        str(card["id"])
        for card in cards
        if card.get("id") in ids - {model}
        and _base_of(card, ids) is None
        and not (isinstance(named.get("root"), str) and card.get("root") == named.get("root"))
    ]
    if not others:
        return None
    shown = ", ".join(_brief(name) for name in others[:3])
    more = f" and {len(others) - 3} more" if len(others) > 3 else ""
    return (
        f"GET /v1/models lists {shown}{more} beside it, and which one answers is the server's "
        "choice"
    )


def unnamed_reply(reply_model: str | None, model: str) -> str | None:
    """Why a reply shows that ``model`` did not answer, or None; only without a listing
    that says who answers (a listed model's replies may name its file, as llama.cpp's do)."""
    if reply_model is None or reply_model == model:
        return None
    return f"the replies name {_brief(reply_model)}"


def unnamed_refusal(model: str, why: str) -> str:
    """The one line that refuses a run of requests without a ``model`` field when ``why``
    (:func:`unnamed_answerer`, :func:`unnamed_reply`) shows that ``model`` does not answer."""
    return (
        f"{_brief(model)} is not the model that answers: {why}. The vllm preset sends no "
        "model field (as vLLM's gsm8k_eval.py), so the server's default model answers under "
        "this name; to run an adapter, send its name (leave out --gsm8k-preset vllm, with "
        "--gsm8k-api chat for chat mode) or serve it, merged, as the server's only model"
    )


def _base_of(card: dict[str, Any], ids: set[Any]) -> str | None:
    """The base model an adapter's card names: its ``parent`` (vLLM), or a ``root`` that is
    another listed id (vLLM before ``parent``); None for a base model."""
    for name in ("parent", "root"):
        value = card.get(name)
        named = isinstance(value, str) and value and value != card.get("id")
        if named and (name == "parent" or value in ids):
            return str(value)
    return None


def _brief(name: str) -> str:
    """A model name as a message shows it: quoted, at most 80 characters of it."""
    return repr(name if len(name) <= 80 else name[:77] + "...")


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
