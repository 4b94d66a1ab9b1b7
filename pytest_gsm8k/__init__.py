"""pytest-gsm8k: GSM8K as a pytest regression gate for language models (the entry point is
:mod:`pytest_gsm8k.plugin`). The names users annotate their tests and models with are
imported when first asked for: pytest imports this package in every session of every
repository the plugin is installed in, and a session that does not use it should not pay."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
    from pytest_gsm8k.fixtures import GSM8KOutcome

#: where each name of ``__all__`` lives
_HOMES = {
    "Completion": "pytest_gsm8k.core.types",
    "GSM8KOutcome": "pytest_gsm8k.fixtures",
    "ModelCallable": "pytest_gsm8k.core.types",
    "ModelResponse": "pytest_gsm8k.core.types",
    "Outcome": "pytest_gsm8k.core.records",
    "Problem": "pytest_gsm8k.core.types",
    "ProblemRecord": "pytest_gsm8k.core.records",
    "Protocol": "pytest_gsm8k.core.prompts",
    "Reply": "pytest_gsm8k.core.types",
    "Report": "pytest_gsm8k.core.records",
    "Request": "pytest_gsm8k.core.types",
}

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

#: the role plugin's name: plugin.py registers it, session.get_session finds it
ROLE_NAME = "gsm8k-session"


def __getattr__(name: str) -> Any:
    """An exported name, imported from its module the first time it is asked for."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'pytest_gsm8k' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
