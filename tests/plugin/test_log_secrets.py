"""Secrets in logs: what the HTTP libraries log (openai's request and response
lines, httpx's, their retry notes) passes through the run's scrubber, so a key or URL
password that a server echoes back never reaches the terminal's live log, a captured log
section or JUnit XML, with and without ``-n 2`` (one -n 2 run, the last test, for every echo)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import (
    NO_EXTRA_PLUGINS,
    TEST_KEY,
    URL_BASIC,
    URL_PASSWORD,
    output,
    read_json,
    server_behind_a_password,
)

from pytest_gsm8k.core.scrub import REDACTED

#: the libraries' logs at debug, on the terminal and in JUnit
DEBUG_LOGS = (
    *("--log-level=DEBUG", "-o", "log_cli=true", "-o", "log_cli_level=DEBUG"),
    *("--junitxml=junit.xml", "-o", "junit_logging=all", "-rA"),
)


def _logged(
    pytester: pytest.Pytester, result: pytest.RunResult, server: FakeOpenAIServer
) -> tuple[str, str, str]:
    """The terminal, JUnit and both: the key was sent and echoed, and the libraries did log
    (so the checks are about their lines, not an empty log)."""
    text = output(result)
    junit = (pytester.path / "junit.xml").read_text(encoding="utf-8")
    assert TEST_KEY in server.stats()["auth_headers"][0]
    logged = text + junit
    assert "openai" in logged.lower(), text[-3000:]
    assert "HTTP Request" in logged, text[-3000:]
    return text, junit, logged


def test_library_logs_at_debug_are_scrubbed_of_an_echoed_key(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    """(Under -n 2: the one run of every echo below.)"""
    server.set_script(Script(echo_auth=True, behaviours={i: "error500" for i in range(0, 1319, 3)}))
    result = pytester.runpytest(
        *gsm8k_args,
        "--gsm8k-limit=12",
        "--gsm8k-max-retries=1",
        "--gsm8k-no-cache",
        *DEBUG_LOGS,
    )
    text, junit, logged = _logged(pytester, result, server)
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


def test_a_key_echoed_every_way_is_kept_out_of_every_output_under_xdist(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One -n 2 run carries the cross-process part of three tests, each run plain on its own:
    a key a server echoes is scrubbed from the libraries' logs at debug (the first test
    here), from reply text, errors and every file the run writes (test_reliability.py) and
    from the reply fields stored unread (test_secret_leaks.py). Under xdist the workers
    log, report and write what the controller received for them."""
    every_third = {i: "error500" for i in range(0, 1319, 3)}
    server.set_script(Script(echo_auth=True, echo_auth_fields=True, behaviours=every_third))
    step = pytester.path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    tmp = pytester.path / "tmp"  # the run's temporary files among those searched
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    result = pytester.runpytest(
        *gsm8k_args,
        "-n",
        "2",
        "--gsm8k-limit=24",
        "--gsm8k-max-retries=1",
        "--gsm8k-cache-dir=cache",
        "--gsm8k-report=r.json",
        "--gsm8k-html=page.html",
        *DEBUG_LOGS,
    )
    text, _, logged = _logged(pytester, result, server)
    assert REDACTED in logged
    # the errors quoting the server and the replies' text
    rep = read_json(pytester.path / "r.json")
    errors = [p for p in rep["problems"] if p["outcome"] == "error"]
    answered = [p for p in rep["problems"] if p["outcome"] != "error"]
    assert errors
    assert answered
    assert all(REDACTED in p["error"] for p in errors)
    assert any(REDACTED in p["response"] for p in answered)
    # the reply fields stored without being read (finish_reason, system_fingerprint)
    assert {p["outcome"] for p in answered} == {"correct"}
    reasons = {s["finish_reason"] for p in answered for s in p["samples"]}
    assert reasons == {f"Bearer {REDACTED}"}
    # nowhere: the terminal, JUnit, the report, the page, the step summary, the cache
    assert TEST_KEY not in text, [line for line in text.splitlines() if TEST_KEY in line][:5]
    files = "\n".join(
        path.read_bytes().decode("utf-8", "replace")
        for path in pytester.path.rglob("*")
        if path.is_file()
    )
    assert REDACTED in files
    assert TEST_KEY not in files
    assert step.is_file()
    assert (pytester.path / "page.html").is_file()
    assert list((pytester.path / "cache").rglob("*.json"))
