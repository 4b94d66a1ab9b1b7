"""What names the model behind a served name, and the first field in which two descriptions
differ."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_gsm8k.core.identity import (
    describe_server,
    difference,
    reply_difference,
    unnamed_answerer,
    unnamed_refusal,
    unnamed_reply,
)


def test_describe_server_keeps_what_names_the_model_behind_the_name() -> None:
    cards: list[dict[str, Any]] = [
        {"id": "other", "root": "/x"},
        {
            "id": "m",
            "object": "model",
            "created": 1700000000,  # vLLM: the time of the request, not of the model
            "owned_by": "vllm",
            "root": "/models/ckpt-7",
            "max_model_len": 8192,
            "parent": None,
        },
    ]
    assert describe_server(cards, "m") == {
        "id": "m",
        "root": "/models/ckpt-7",
        "owned_by": "vllm",
        "max_model_len": 8192,
    }
    assert describe_server(cards, "absent") is None
    assert describe_server([], "m") is None


def test_difference_names_the_first_field_that_changed() -> None:
    old = {"id": "m", "root": "/a", "owned_by": "vllm"}
    assert difference(old, dict(old)) is None
    assert difference(old, {**old, "root": "/b"}) == "root '/a' -> '/b'"
    assert difference(old, {"id": "m", "root": "/a"}) == "owned_by 'vllm' -> (none)"
    assert difference(None, None) is None
    assert difference(None, {"id": "m"}) == "no /v1/models card -> card id='m'"
    assert reply_difference(("m", "fp1"), ("m", "fp2")) == "reply system_fingerprint 'fp1' -> 'fp2'"
    assert reply_difference(("m", None), ("m", None)) is None


# The model under test is the one named: who answers a request with no model field.

BASE = {"id": "base", "object": "model", "root": "/models/base", "parent": None}
#: vLLM's card of a LoRA adapter (--lora-modules my-lora=/adapters/my-lora)
LORA = {"id": "my-lora", "object": "model", "root": "/adapters/my-lora", "parent": "base"}
#: vLLM before ``parent``: the adapter's root named the base's served name
OLD_LORA = {"id": "my-lora", "object": "model", "root": "base"}


@pytest.mark.parametrize(
    ("cards", "model", "why"),
    [
        ([BASE], "base", None),  # vLLM's script case: one model served
        ([BASE, LORA], "base", None),  # the base beside its adapters answers as the base
        ([{"id": "m"}], "m", None),  # a listing that says nothing more
        ([BASE], "absent", None),  # not listed: the preflight says so on its own
        ([BASE, LORA], "my-lora", "GET /v1/models lists it as an adapter of 'base', "),
        ([BASE, OLD_LORA], "my-lora", "GET /v1/models lists it as an adapter of 'base', "),
        (
            [BASE, {"id": "alias", "root": "/models/base"}],  # --served-model-name base alias
            "alias",
            None,
        ),
        ([BASE, {"id": "other", "root": "/models/other"}], "base", "GET /v1/models lists 'other' "),
        (
            [{"id": n} for n in ("m", "a", "b", "c", "d")],
            "m",
            "GET /v1/models lists 'a', 'b', 'c' and 1 more beside it",
        ),
    ],
)
def test_unnamed_answerer_reads_who_answers_from_the_listing(
    cards: list[dict[str, Any]], model: str, why: str | None
) -> None:
    found = unnamed_answerer(cards, model)
    if why is None:
        assert found is None
    else:
        assert found is not None
        assert found.startswith(why), found


def test_unnamed_reply_and_the_refusal_line() -> None:
    assert unnamed_reply(None, "my-lora") is None  # a reply that names nobody proves nothing
    assert unnamed_reply("my-lora", "my-lora") is None
    why = unnamed_reply("base", "my-lora")
    assert why == "the replies name 'base'"
    line = unnamed_refusal("my-lora", why)
    assert line.startswith("'my-lora' is not the model that answers: the replies name 'base'.")
    assert "\n" not in line
    assert "leave out --gsm8k-preset vllm" in line
    assert "as the server's only model" in line
    long = unnamed_refusal("x" * 10_000, unnamed_reply("y" * 10_000, "z") or "")
    assert len(long) < 600  # names from the server and the user are shown bounded
