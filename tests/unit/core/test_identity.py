"""What names the model behind a served name, and the first field in which two descriptions
differ."""

from __future__ import annotations

from typing import Any

from pytest_gsm8k.core.identity import describe_server, difference, reply_difference


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
