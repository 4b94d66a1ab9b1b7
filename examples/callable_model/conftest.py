"""Gate any Python model on GSM8K: override the ``gsm8k_model`` fixture.

Run from this folder:

    pytest --gsm8k-limit=20 test_my_model.py

The callable gets a :class:`pytest_gsm8k.Request` (``messages`` for the chat
API, ``prompt`` for completions, ``n``, ``temperature``, ``max_tokens``,
``stop``) and returns a text, or a list of ``n`` texts. It may be ``async``.
Sync callables run in a thread pool of ``--gsm8k-concurrency`` threads, so
the plugin still prefetches answers ahead of the tests.
"""

from __future__ import annotations

import re

import pytest

from pytest_gsm8k import Request


def tiny_calculator_model(request: Request) -> str:
    """A stand-in for a local transformers pipeline: adds up the numbers it sees."""
    question = request.messages[-1][1] if request.messages else request.prompt
    numbers = [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*(?:\.\d+)?", question)]
    total = sum(numbers)
    return f"Adding everything up gives {total:g}.\n#### {total:g}"


@pytest.fixture(scope="session")
def gsm8k_model():
    return tiny_calculator_model
