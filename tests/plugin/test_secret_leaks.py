"""The API key never leaves the run by a side door: a hostile server echoing it in reply
fields the plugin stores without reading them (``finish_reason``, ``system_fingerprint``),
listing it as a model id, a ``--gsm8k-serve`` command line the shell expanded it into, or a
redirect of the session-start ``GET /models`` to another origin. And what a server names
itself reaches the terminal without escapes or invisible reordering (bidi overrides).

Every check runs the plugin for real against the scripted server
(:mod:`fakeserver`); the key must appear nowhere in the output or in any file the run
wrote (cache, JSON report, HTML page, step summary).
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import FAKESERVER, NO_CACHEPROVIDER, NO_EXTRA_PLUGINS, TEST_KEY, XDIST, output, report

from pytest_gsm8k.core.scrub import REDACTED

#: a served server that never gets ready fails the test in a minute, not in ten
NOISE = [*NO_EXTRA_PLUGINS, *NO_CACHEPROVIDER, "--gsm8k-serve-timeout=60"]


def _all_text_under(root: Path) -> str:
    return "\n".join(
        path.read_bytes().decode("utf-8", "replace") for path in root.rglob("*") if path.is_file()
    )


def _served(data: Path, *args: str, model: str = "fake-model") -> str:
    """A --gsm8k-serve command line running the scripted server with ``args``."""
    words = [sys.executable, str(FAKESERVER), "--data", str(data / "test.jsonl")]
    words += ["--port", "{port}", "--model", model, *args]
    return " ".join(shlex.quote(w) for w in words)


@XDIST
def test_a_key_echoed_in_reply_fields_is_stored_and_printed_nowhere(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server.set_script(Script(echo_auth_fields=True))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "step.md"))
    result = pytester.runpytest(
        *gsm8k_args,
        *xdist,
        "--gsm8k-limit=6",
        "--gsm8k-cache-dir=cache",
        "--gsm8k-report=r.json",
        "--gsm8k-html=page.html",
        "-rA",
    )
    text = output(result)
    assert result.ret == 0, text
    assert TEST_KEY in server.stats()["auth_headers"][0]  # it was sent, and echoed
    rep = report(pytester)
    assert rep["counts"]["correct"] == 6
    reasons = {s["finish_reason"] for p in rep["problems"] for s in p["samples"]}
    assert reasons == {f"Bearer {REDACTED}"}
    assert list((pytester.path / "cache").rglob("*.json"))
    assert (pytester.path / "page.html").is_file()
    assert TEST_KEY not in text
    assert TEST_KEY not in _all_text_under(pytester.path)


def test_a_key_listed_as_a_model_id_is_not_printed(
    pytester: pytest.Pytester, server: FakeOpenAIServer, keyed_env: str
) -> None:
    server.set_script(Script(echo_auth_models=True))
    result = pytester.runpytest(
        "--gsm8k-model=not-served", f"--gsm8k-base-url={server.base_url}", *NOISE
    )
    text = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert f"(it serves: fake-model, {REDACTED})" in text, text
    assert TEST_KEY not in text


def test_a_key_in_the_served_model_list_is_not_printed(
    pytester: pytest.Pytester, gsm8k_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    listing = json.dumps({"echo_auth_models": True})
    command = _served(gsm8k_data, "--script", listing)
    result = pytester.runpytest(f"--gsm8k-serve={command}", "--gsm8k-limit=2", *NOISE)
    text = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert f"the server lists 2 models (fake-model, {REDACTED})" in text, text
    assert TEST_KEY not in text


def test_a_key_in_the_serve_command_is_not_printed_or_stored(
    pytester: pytest.Pytester, gsm8k_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As ``--gsm8k-serve "... --api-key $OPENAI_API_KEY"`` reaches pytest: expanded (the
    server then wants the key on every request, its readiness check included)."""
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    command = _served(gsm8k_data, "--api-key", TEST_KEY)
    result = pytester.runpytest(
        f"--gsm8k-serve={command}",
        "--gsm8k-model=fake-model",
        "--gsm8k-limit=2",
        "--gsm8k-report=r.json",
        "--gsm8k-html=page.html",
        *NOISE,
    )
    text = output(result)
    assert result.ret == 0, text
    assert "gsm8k: serving fake-model with" in text
    assert f"--api-key {REDACTED}" in text
    assert f"--api-key {REDACTED}" in report(pytester)["served"]["command"]
    assert TEST_KEY not in text
    assert TEST_KEY not in _all_text_under(pytester.path)


def test_a_served_model_whose_only_id_is_the_key_is_refused(
    pytester: pytest.Pytester, gsm8k_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Adopting it would make the key the run's model name (terminal, report, baseline)."""
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    command = _served(gsm8k_data, model=TEST_KEY)
    result = pytester.runpytest(f"--gsm8k-serve={command}", "--gsm8k-limit=2", *NOISE)
    text = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    result.stderr.fnmatch_lines(
        ["ERROR: gsm8k: --gsm8k-serve: the server's only model id holds the API key*"]
    )
    assert TEST_KEY not in text


def test_the_preflight_never_sends_the_key_to_another_origin(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    gsm8k_data: Path,
    keyed_env: str,
) -> None:
    with FakeOpenAIServer(gsm8k_data / "test.jsonl", model="fake-model") as elsewhere:
        server.set_script(Script(redirect_models=f"{elsewhere.base_url}/models?redirected=1"))
        result = pytester.runpytest(*gsm8k_args, "--gsm8k-limit=2", "--gsm8k-no-cache")
        seen = elsewhere.stats()
    assert result.ret == 0, output(result)
    assert seen["requests_by_path"] == {"/v1/models": 1}  # the redirect was followed...
    assert seen["auth_headers"] == []
    assert seen["requests_without_auth"] == 1  # ...keyless
    assert any(TEST_KEY in h for h in server.stats()["auth_headers"])  # the origin had it


def test_the_serving_line_shows_the_server_model_id_without_escapes(
    pytester: pytest.Pytester, gsm8k_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    model = "evil\x1b[2J\x1b[31mRED\u202eledom\x1b[0m"
    result = pytester.runpytest(
        f"--gsm8k-serve={_served(gsm8k_data, model=model)}", "--gsm8k-limit=2", *NOISE
    )
    text = output(result)
    assert result.ret == 0, text
    line = next(line for line in text.splitlines() if line.startswith("gsm8k: serving "))
    assert line.startswith("gsm8k: serving evilRED\\u202eledom with "), line
    assert "\x1b" not in text
    assert "\u202e" not in text
