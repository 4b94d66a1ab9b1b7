"""pytest-gsm8k: GSM8K as a pytest regression gate for language models (the entry point is
:mod:`pytest_gsm8k.plugin`). The names users annotate their tests and models with are
imported when first asked for: pytest imports this package in every session of every
repository the plugin is installed in, and a session that does not use it should not pay."""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pytest_gsm8k.core.prompts import Protocol as Protocol
    from pytest_gsm8k.core.records import Outcome as Outcome
    from pytest_gsm8k.core.records import ProblemRecord as ProblemRecord
    from pytest_gsm8k.core.records import Report as Report
    from pytest_gsm8k.core.types import Completion as Completion
    from pytest_gsm8k.core.types import ModelCallable as ModelCallable
    from pytest_gsm8k.core.types import ModelResponse as ModelResponse
    from pytest_gsm8k.core.types import Problem as Problem
    from pytest_gsm8k.core.types import Reply as Reply
    from pytest_gsm8k.core.types import Request as Request
    from pytest_gsm8k.fixtures import GSM8KOutcome as GSM8KOutcome

#: where each exported name lives
_HOMES = {
    "core.prompts": "Protocol",
    "core.records": "Outcome ProblemRecord Report",
    "core.types": "Completion ModelCallable ModelResponse Problem Reply Request",
    "fixtures": "GSM8KOutcome",
}
_HOME = {name: f"pytest_gsm8k.{home}" for home, names in _HOMES.items() for name in names.split()}
__all__ = sorted(_HOME)
__version__ = "0.1.0"

ROLE_NAME = "gsm8k-session"  # the role plugin's: plugin.py registers it, get_session finds it


def __getattr__(name: str) -> Any:
    """An exported name, imported from its module the first time it is asked for."""
    if (home := _HOME.get(name)) is None:
        raise AttributeError(f"module 'pytest_gsm8k' has no attribute {name!r}")
    value = getattr(import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOME})
