"""The run's secrets kept out of what the HTTP libraries log (httpcore's headers at DEBUG,
openai's request options), which pytest shows in live and captured logs and JUnit XML. A
filter on ``httpcore`` would miss ``httpcore.http11`` and pytest's handlers come and go: a
record factory scrubs the records where they are born."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pytest_gsm8k.core.scrub import Scrubber

#: the HTTP stack under ``openai`` (httpx/httpcore, or their ``2`` forks), urllib3 for users'
#: clients, asyncio (it logs the engine loop's exceptions), and this plugin
SCRUBBED_LOGGERS = frozenset(
    {"openai", "httpx", "httpx2", "httpcore", "httpcore2", "urllib3", "asyncio", "pytest_gsm8k"}
)


def scrub_library_logs(scrubber: Scrubber) -> Callable[[], None]:
    """Install the scrubbing factory (none without a secret); what it returns puts the previous
    one back, unless another replaced ours meanwhile (a nested pytester run)."""
    if not scrubber:
        return lambda: None
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if record.name.partition(".")[0] not in SCRUBBED_LOGGERS:
            return record
        try:
            message = record.getMessage()
        except Exception:  # logging reports a bad format itself, when it emits
            return record
        record.msg, record.args = scrubber.text(message), None
        if record.exc_info:  # formatters print exc_text when exc_info is gone
            record.exc_text = scrubber.text(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        if record.stack_info:
            record.stack_info = scrubber.text(record.stack_info)
        return record

    def restore() -> None:
        if logging.getLogRecordFactory() is factory:
            logging.setLogRecordFactory(previous)

    logging.setLogRecordFactory(factory)
    return restore
