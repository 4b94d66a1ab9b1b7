"""The run's secrets kept out of what the HTTP libraries log (httpcore's headers at DEBUG,
openai's request options), which pytest shows in live logs, captured logs and JUnit XML. A
filter on ``httpcore`` would miss ``httpcore.http11`` and pytest's handlers come and go, so a
log-record factory scrubs the network libraries' and this plugin's records where they are born.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from pytest_gsm8k.core.scrub import Scrubber

#: top-level logger names whose records are scrubbed: the HTTP stack under the
#: ``openai`` package (httpx/httpcore, or their ``2`` forks), urllib3 for users'
#: clients, asyncio (it logs exceptions of the engine's loop), and this plugin
SCRUBBED_LOGGERS = frozenset(
    {"openai", "httpx", "httpx2", "httpcore", "httpcore2", "urllib3", "asyncio", "pytest_gsm8k"}
)


def scrub_record(record: logging.LogRecord, scrubber: Scrubber) -> None:
    """Replace ``record``'s message, traceback and stack text by scrubbed text."""
    try:
        message = record.getMessage()
    except Exception:  # logging reports a bad format itself, when it emits
        return
    record.msg = scrubber.text(message)
    record.args = None
    if record.exc_info:
        text = logging.Formatter().formatException(record.exc_info)
        record.exc_text = scrubber.text(text)
        record.exc_info = None  # formatters print exc_text when exc_info is gone
    if record.stack_info:
        record.stack_info = scrubber.text(record.stack_info)


def scrub_library_logs(scrubber: Scrubber) -> Callable[[], None]:
    """Install the scrubbing record factory (none without a secret); returns what puts the
    previous one back, unless another replaced ours meanwhile (a nested pytester run)."""
    if not scrubber:
        return lambda: None
    previous = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if record.name.partition(".")[0] in SCRUBBED_LOGGERS:
            scrub_record(record, scrubber)
        return record

    logging.setLogRecordFactory(factory)

    def restore() -> None:
        if logging.getLogRecordFactory() is factory:
            logging.setLogRecordFactory(previous)

    return restore
