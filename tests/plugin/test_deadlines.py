"""Every wait on a server has a whole-request deadline, not a per-read one: a ``/v1/models``
that drips its reply one byte at a time (each read answered in time, the reply never
complete) ends the session start within ``--gsm8k-timeout`` with one line, and a
``--gsm8k-serve`` server whose readiness answer drips fails within
``--gsm8k-serve-timeout``.

The runs are pytest subprocesses with a generous bound of their own: a hang fails the test
(``Pytester.TimeoutExpired``) instead of hanging it.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import FAKESERVER, NO_EXTRA_PLUGINS, output

#: how long a run may take before the test calls it a hang (the drips below take minutes)
BOUND = 60.0


def test_a_dripping_model_list_ends_the_session_start_within_the_timeout(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    server.set_script(Script(drip_models=1.0))
    result = pytester.runpytest_subprocess(*gsm8k_args, "--gsm8k-timeout=2", timeout=BOUND)
    text = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    errors = [line for line in text.splitlines() if line.startswith("ERROR: gsm8k:")]
    assert len(errors) == 1, text
    assert "did not answer GET /models within 2 s" in errors[0], errors
    assert "Traceback" not in text


def test_a_served_server_whose_readiness_answer_drips_fails_within_the_serve_timeout(
    pytester: pytest.Pytester, gsm8k_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    words = [sys.executable, str(FAKESERVER), "--data", str(gsm8k_data / "test.jsonl")]
    words += ["--port", "{port}", "--script", json.dumps({"drip_models": 1.0})]
    command = " ".join(shlex.quote(w) for w in words)
    result = pytester.runpytest_subprocess(
        f"--gsm8k-serve={command}", "--gsm8k-serve-timeout=3", *NO_EXTRA_PLUGINS, timeout=BOUND
    )
    text = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "did not answer GET http://127.0.0.1:" in text, text
    assert "within 3 s" in text, text
