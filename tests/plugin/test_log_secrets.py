"""Secrets in logs: what the HTTP libraries log (openai's request and response
lines, httpx's, their retry notes) passes through the run's scrubber, so a key or URL
password that a server echoes back never reaches the terminal's live log, a captured log
section or JUnit XML, with and without ``-n 2``."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import (
    NO_EXTRA_PLUGINS,
    TEST_KEY,
    URL_BASIC,
    URL_PASSWORD,
    XDIST,
    output,
    server_behind_a_password,
)


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
    assert "openai" in logged.lower(), text[-3000:]
    assert "HTTP Request" in logged, text[-3000:]
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
            *NO_EXTRA_PLUGINS,
            "--gsm8k-limit=4",
            "--gsm8k-no-cache",
            "-o",
            "log_cli=true",
            "-o",
            "log_cli_level=DEBUG",
        )
        echoed = srv.stats()["auth_headers"]
    text = output(result)
    assert echoed
    assert "HTTP Request" in text
    assert URL_BASIC in echoed[0]  # the server saw the credentials (and echoed them back)
    assert URL_PASSWORD not in text
    assert URL_BASIC not in text
