"""pytest-gsm8k: GSM8K as a pytest regression gate for language models.

The pytest entry point is :mod:`pytest_gsm8k.plugin`; the pure parts
(dataset, prompts, scoring, statistics) live in their own modules so they can
be used and tested without pytest or HTTP.
"""

from pytest_gsm8k.core.types import Completion, ModelResponse, Problem, Request

__all__ = ["Completion", "ModelResponse", "Problem", "Request"]
__version__ = "0.1.0"
