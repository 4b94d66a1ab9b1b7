"""pytest-gsm8k: GSM8K as a pytest regression gate for language models.

The pytest entry point is :mod:`pytest_gsm8k.plugin`; the pure parts
(dataset, prompts, scoring, statistics) live in their own modules so they can
be used and tested without pytest or HTTP. What users annotate their own tests
and models with is exported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.records import Outcome, ProblemRecord, Report
from pytest_gsm8k.core.types import (
    Completion,
    ModelCallable,
    ModelResponse,
    Problem,
    Reply,
    Request,
)

if TYPE_CHECKING:
    from pytest_gsm8k.fixtures import GSM8KOutcome

__all__ = [
    "Completion",
    "GSM8KOutcome",
    "ModelCallable",
    "ModelResponse",
    "Outcome",
    "Problem",
    "ProblemRecord",
    "Protocol",
    "Reply",
    "Report",
    "Request",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``GSM8KOutcome`` lives with the fixtures (it needs pytest): imported when asked."""
    if name == "GSM8KOutcome":
        from pytest_gsm8k.fixtures import GSM8KOutcome

        return GSM8KOutcome
    raise AttributeError(f"module 'pytest_gsm8k' has no attribute {name!r}")
