"""Scrubbing library log records: message, arguments and traceback lose the key; only the
network libraries' loggers are touched, and the record factory is restored."""

from __future__ import annotations

import logging
import sys

from helpers import TEST_KEY

from pytest_gsm8k.core.scrub import REDACTED, Scrubber
from pytest_gsm8k.runtime.logs import scrub_library_logs


def test_scrub_record_cleans_message_arguments_and_traceback() -> None:
    restore = scrub_library_logs(Scrubber(TEST_KEY, None, ()))
    try:
        raise RuntimeError(f"server said: you sent {TEST_KEY}")
    except RuntimeError:
        record = logging.getLogger("httpcore.http11").makeRecord(
            "httpcore.http11",
            logging.DEBUG,
            __file__,
            1,
            "headers %r",
            ((TEST_KEY,),),
            sys.exc_info(),
        )
    finally:
        restore()
    line = logging.Formatter("%(message)s").format(record)
    assert "headers" in line
    assert "RuntimeError: server said" in line  # text kept
    assert TEST_KEY not in line
    assert line.count(REDACTED) == 2


def test_only_network_loggers_are_scrubbed_and_the_factory_is_restored() -> None:
    before = logging.getLogRecordFactory()
    restore = scrub_library_logs(Scrubber(TEST_KEY, None, ()))
    try:
        ours = logging.getLogger("httpx2._client").makeRecord(
            "httpx2._client", logging.INFO, __file__, 1, "key %s", (TEST_KEY,), None
        )
        theirs = logging.getLogRecordFactory()(
            "myapp", logging.INFO, __file__, 1, "key %s", (TEST_KEY,), None
        )
    finally:
        restore()
    assert logging.getLogRecordFactory() is before
    assert ours.args is None
    assert ours.getMessage() == f"key {REDACTED}"
    assert theirs.args == (TEST_KEY,)  # other loggers' records are left as made
    assert scrub_library_logs(Scrubber(None, None, ()))() is None  # no secret: nothing installed
    assert logging.getLogRecordFactory() is before
