"""Keeping the run's secrets out of what the HTTP libraries log.

The libraries under the engine log on their own (httpcore prints response headers at DEBUG, a
proxy may echo ``Authorization``; openai prints request options), and pytest shows the records
in live logs, captured-log sections and JUnit XML. A filter on ``httpcore`` would miss
``httpcore.http11`` (filters run only for their own logger's records) and pytest's handlers
come and go, so the scrubbing sits where every record is born: a log-record factory that, for
the network libraries' loggers and this plugin's, formats the message at once, replaces the
secrets and drops the arguments (a traceback too). Other loggers' records are left as made.
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
    """Install the scrubbing record factory; returns what uninstalls it.

    Nothing is installed when there is no secret to scrub. Uninstalling puts the
    previous factory back only if nobody replaced ours meanwhile (a nested run
    under pytester installs and removes its own in turn).
    """
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
