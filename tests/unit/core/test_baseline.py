"""Baseline files on their own: hand-edited or inconsistent files are refused naming the file,
and default names are readable, stable and distinct."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_gsm8k.core import baseline as bl


def _baseline(problems: dict[str, Any], accuracy: float) -> str:
    return json.dumps(
        {
            "schema": bl.SCHEMA,
            "kind": bl.KIND,
            "protocol": {},
            "dataset": {},
            "accuracy": accuracy,
            "problems": problems,
        }
    )


@pytest.mark.parametrize(
    ("problems", "accuracy", "needle"),
    [
        ({"test-0000": "correct", "test-0001": None}, 0.5, "outcome None"),
        ({"test-0000": "corect"}, 1.0, "outcome 'corect'"),
        ({"test-0000": {"outcome": "right"}}, 1.0, "outcome 'right'"),
        ({"test-0000": "correct", "test-0001": "wrong"}, 1.0, "edited by hand"),
    ],
)
def test_hand_edited_baselines_are_refused_naming_the_file(
    problems: dict[str, Any], accuracy: float, needle: str
) -> None:
    with pytest.raises(bl.BaselineError) as info:
        bl.loads(_baseline(problems, accuracy), "snap/b.gsm8k")
    message = str(info.value)
    assert message.startswith("snap/b.gsm8k: ")
    assert needle in message
    assert "\n" not in message
    assert bl.loads(_baseline({"test-0000": "correct", "test-0001": "wrong"}, 0.5), "x")


def _document(**fields: Any) -> str:
    base = {
        "schema": bl.SCHEMA,
        "kind": bl.KIND,
        "protocol": {},
        "dataset": {},
        "accuracy": 0.5,
        "problems": {"test-0000": "correct", "test-0001": "wrong"},
    }
    return json.dumps(base | fields)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"n": 5}, "its n 5 is not the 2 problems it holds"),
        ({"partial": {"reason": "-k", "of": 9, "ids": ["test-0000"]}}, "its partial ids"),
        ({"partial": {"reason": "-k", "ids": ["test-0000", "test-0001"]}}, "no ids or no 'of'"),
    ],
)
def test_a_stored_problem_set_that_is_not_its_outcomes_is_refused(
    fields: dict[str, Any], needle: str
) -> None:
    with pytest.raises(bl.BaselineError) as info:
        bl.loads(_document(**fields), "snap/b.gsm8k")
    assert str(info.value).startswith("snap/b.gsm8k: corrupt baseline (")
    assert needle in str(info.value)
    partial = {"reason": "-k", "of": 9, "ids": ["test-0001", "test-0000"]}
    assert bl.loads(_document(n=2, partial=partial), "x")["partial"] == partial


def test_default_name_is_readable_stable_and_distinct() -> None:
    short = "test@1, 0-shot CoT"
    assert bl.default_name(short) == "test@1_0-shot_CoT"
    one, two = ("test@1, 0-shot CoT, params " + "x" * 400 + end for end in ("a", "b"))
    assert bl.default_name(one) == bl.default_name(one)
    assert bl.default_name(one) != bl.default_name(two)
    assert len(bl.default_name(one)) == bl.NAME_LIMIT
    assert bl.default_name(one).startswith("test@1_0-shot_CoT_params_xxx")
