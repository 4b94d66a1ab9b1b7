"""What a server says about the model behind a name (an alias whose checkpoint can change):
cached answers are reused only while the ``/v1/models`` card and each reply's ``model`` and
``system_fingerprint`` say what they said; they also say who answers an unnamed request. Pure."""

from __future__ import annotations

from typing import Any

from pytest_gsm8k.core.scrub import clip

#: a /v1/models card's fields that describe the model (never ``created``: vLLM sets it per request)
CARD_FIELDS = ("id", "root", "owned_by", "max_model_len")
Description = dict[str, Any]
ReplyIdentity = tuple[str | None, str | None]  # a reply's model and system_fingerprint


def describe_server(cards: list[dict[str, Any]], model: str) -> Description | None:
    for card in cards:
        if card.get("id") == model:
            return {n: card[n] for n in CARD_FIELDS if type(card.get(n)) in (str, int, float)}
    return None


def reply_identity(model: Any, fingerprint: Any) -> ReplyIdentity:
    return (model if isinstance(model, str) else None), (
        fingerprint if isinstance(fingerprint, str) else None
    )


def difference(recorded: Description | None, current: Description | None) -> str | None:
    """The first field of two descriptions that differs, as ``name 'old' -> 'new'``."""
    if recorded is None or current is None:
        return None if recorded == current else f"{_card(recorded)} -> {_card(current)}"
    for name in _ordered({**recorded, **current}):
        if (old := recorded.get(name)) != (new := current.get(name)):
            shown = ["(none)" if value is None else repr(value) for value in (old, new)]
            return f"{name} {shown[0]} -> {shown[1]}"
    return None  # {"x": None} against {}


def reply_difference(recorded: ReplyIdentity, current: ReplyIdentity) -> str | None:
    """The first field of two reply identities that differs, as ``reply model 'a' -> 'b'``."""
    names = ("model", "system_fingerprint")
    why = difference(*(dict(zip(names, reply, strict=True)) for reply in (recorded, current)))
    return None if why is None else f"reply {why}"


def unnamed_answerer(cards: list[dict[str, Any]], model: str) -> str | None:
    """Why the listing shows that ``model`` does not answer a request with no ``model`` field,
    or None (one model served, a base beside its adapters and aliases, or not listed)."""
    ids = {card.get("id") for card in cards if isinstance(card.get("id"), str)}
    named = next((card for card in cards if card.get("id") == model), None)
    if named is None:
        return None
    if (base := _base_of(named, ids)) is not None:
        return f"GET /v1/models lists it as an adapter of {_brief(base)}, which answers instead"
    others = [
        str(card["id"])
        for card in cards
        if card.get("id") in ids - {model}
        and _base_of(card, ids) is None
        and not (isinstance(named.get("root"), str) and card.get("root") == named.get("root"))
    ]
    shown = ", ".join(_brief(name) for name in others[:3])
    more = f" and {len(others) - 3} more" if len(others) > 3 else ""
    why = f"GET /v1/models lists {shown}{more} beside it, and which one answers is the server's"
    return f"{why} choice" if others else None


def unnamed_reply(reply_model: str | None, model: str) -> str | None:
    """Why a reply shows that ``model`` did not answer (asked only without a listing: a listed
    model's replies may name its file, as llama.cpp's do)."""
    return None if reply_model in (None, model) else f"the replies name {_brief(str(reply_model))}"


def unnamed_refusal(model: str, why: str) -> str:
    """The one line that refuses unnamed requests when ``why`` shows ``model`` does not answer."""
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
    return repr(clip(name, 80))


def _card(description: Description | None) -> str:
    if description is None:
        return "no /v1/models card"
    shown = ", ".join(f"{name}={description[name]!r}" for name in _ordered(description))
    return f"card {shown}" if shown else "an empty card"


def _ordered(description: Description) -> list[str]:
    rank = {name: i for i, name in enumerate(CARD_FIELDS)}
    return sorted(description, key=lambda name: (rank.get(name, len(rank)), name))
