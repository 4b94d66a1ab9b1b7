"""Issue 12, secrets in logs: what the HTTP libraries log (openai's request and response
lines, httpx's, their retry notes) passes through the run's scrubber, so a key or URL
password that a server echoes back never reaches the terminal's live log, a captured log
section or JUnit XML, with and without ``-n 2``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import TEST_KEY, URL_BASIC, URL_PASSWORD, XDIST, output, server_behind_a_password

from pytest_gsm8k.core.scrub import REDACTED, Scrubber
from pytest_gsm8k.runtime.logs import scrub_library_logs, scrub_record


@XDIST
def test_library_logs_at_debug_are_scrubbed_of_an_echoed_key(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    server.set_script(Script(echo_auth=True, behaviours={i: "error500" for i in range(0, 1319, 3)}))
    result = pytester.runpytest(
        *gsm8k_args,
        *xdist,
        "--gsm8k-limit=12",
        "--gsm8k-max-retries=1",
        "--gsm8k-no-cache",
        "--log-level=DEBUG",
        "-o",
        "log_cli=true",
        "-o",
        "log_cli_level=DEBUG",
        "--junitxml=junit.xml",
        "-o",
        "junit_logging=all",
        "-rA",
    )
    text = output(result)
    junit = (pytester.path / "junit.xml").read_text(encoding="utf-8")
    assert TEST_KEY in server.stats()["auth_headers"][0]  # it was sent, and echoed
    # the libraries did log (so the check below is about their lines, not an empty log)
    logged = text + junit
    assert "openai" in logged.lower() and "HTTP Request" in logged, text[-3000:]
    assert TEST_KEY not in text, [line for line in text.splitlines() if TEST_KEY in line][:5]
    assert TEST_KEY not in junit
    assert "[redacted]" in logged


def test_url_credentials_are_scrubbed_from_library_logs(
    pytester: pytest.Pytester, gsm8k_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with server_behind_a_password(gsm8k_data, monkeypatch, Script(echo_auth=True)) as (srv, url):
        result = pytester.runpytest(
            "--gsm8k-model=fake-model",
            f"--gsm8k-base-url={url}",
            "-p",
            "no:randomly",
            "--gsm8k-limit=4",
            "--gsm8k-no-cache",
            "-o",
            "log_cli=true",
            "-o",
            "log_cli_level=DEBUG",
        )
        echoed = srv.stats()["auth_headers"]
    text = output(result)
    assert echoed and "HTTP Request" in text
    assert URL_BASIC in echoed[0]  # the server saw the credentials (and echoed them back)
    assert URL_PASSWORD not in text and URL_BASIC not in text


def test_scrub_record_cleans_message_arguments_and_traceback() -> None:
    scrubber = Scrubber(TEST_KEY)
    try:
        raise RuntimeError(f"server said: you sent {TEST_KEY}")
    except RuntimeError:
        record = logging.LogRecord(
            "httpcore.http11", logging.DEBUG, __file__, 1, "headers %r", ((TEST_KEY,),), True
        )
        record.exc_info = sys.exc_info()
    scrub_record(record, scrubber)
    line = logging.Formatter("%(message)s").format(record)
    assert "headers" in line and "RuntimeError: server said" in line  # text kept
    assert TEST_KEY not in line and line.count(REDACTED) == 2


def test_only_network_loggers_are_scrubbed_and_the_factory_is_restored() -> None:
    before = logging.getLogRecordFactory()
    restore = scrub_library_logs(Scrubber(TEST_KEY))
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
    assert ours.args is None and ours.getMessage() == f"key {REDACTED}"
    assert theirs.args == (TEST_KEY,)  # other loggers' records are left as made
    assert scrub_library_logs(Scrubber(None))() is None  # no secret: nothing installed
    assert logging.getLogRecordFactory() is before
