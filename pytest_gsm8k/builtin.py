"""The built-in test (``gsm8k::test_gsm8k[test-0042]``), collected when a model is given. A
wrong answer is a measurement, not a failure: the session gate decides the exit code;
infrastructure errors fail the item inside the ``gsm8k_outcome`` fixture."""

from __future__ import annotations

from typing import Any


def test_gsm8k(gsm8k_outcome: Any) -> None:
    """Ask the model one GSM8K problem and score its answer."""
    assert gsm8k_outcome.outcome in ("correct", "wrong", "unparsed", "truncated")
