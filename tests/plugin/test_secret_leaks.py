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
import os
import shlex
import sys
import tempfile
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import (
    FAKESERVER,
    NO_CACHEPROVIDER,
    NO_EXTRA_PLUGINS,
    TEST_KEY,
    XDIST,
    GsmRun,
    output,
    report,
)

from pytest_gsm8k.core.scrub import REDACTED

#: secrets a server is given in other shapes than ``--api-key``: a URL's password, an option
#: whose name holds a secret word before its end, a secret-named key inside a JSON argument
SHAPED_SECRETS = ("SECRETppp000", "SECRETqqq000", "SECRETsss000")
SHAPES = [
    "--x",
    "https://u:SECRETppp000@h/",
    "--secret-key",
    "SECRETqqq000",
    "--hf-overrides",
    '{"hf_token": "SECRETsss000"}',
]

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


def test_a_key_echoed_in_reply_fields_is_stored_and_printed_nowhere(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(Under -n 2: test_log_secrets.py's one run of every echo.)"""
    server.set_script(Script(echo_auth_fields=True))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "step.md"))
    result, _ = gsm8k_run(
        "--gsm8k-limit=6",
        "--gsm8k-cache-dir=cache",
        "--gsm8k-report=r.json",
        "--gsm8k-html=page.html",
        "-rA",
        report=None,
    )
    text = output(result)
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
    command = _served(gsm8k_data, "--api-key", TEST_KEY, "--accept-unknown", *SHAPES)
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
    for secret in (TEST_KEY, *SHAPED_SECRETS):
        assert secret not in text, secret
        assert secret not in _all_text_under(pytester.path), secret


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


def _keyed_vllm(tmp_path: Path, data: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The run's key in OPENAI_API_KEY, a ``vllm`` program on PATH that serves the scripted
    server after printing its arguments and environment (as vLLM prints its non-default
    args, ``api_key`` among them), and the temp folder moved under ``tmp_path`` (returned),
    so that every file the run writes is where a test can read it."""
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    folder = tmp_path / "bin"
    folder.mkdir()
    program = folder / "vllm"
    fake = [sys.executable, str(FAKESERVER), "--data", str(data / "test.jsonl")]
    program.write_text(
        "#!/bin/sh\n"
        'echo "INFO vllm args: $*"\n'
        'echo "INFO vllm env: HF_TOKEN=$HF_TOKEN SHAPED=$SHAPED"\n'
        'shift; model="$1"; shift\n'
        f'exec {shlex.join(fake)} --model "$model" --accept-unknown "$@"\n',
        encoding="utf-8",
    )
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def _files_holding(secret: str, *roots: Path) -> list[Path]:
    return [
        path
        for root in roots
        for path in root.rglob("*")
        if path.is_file() and secret.encode() in path.read_bytes()
    ]


@XDIST
def test_a_key_the_served_command_prints_is_kept_out_of_its_log(
    pytester: pytest.Pytester,
    gsm8k_data: Path,
    tmp_path: Path,
    xdist: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rule: nothing the run writes holds a secret. ``--gsm8k-serve "vllm serve ... --api-key
    $OPENAI_API_KEY"`` reaches pytest expanded, and the server prints its arguments into its
    log, which stays under the cache folder after the run."""
    temp = _keyed_vllm(tmp_path, gsm8k_data, monkeypatch)
    command = f"vllm serve fake-model --api-key {TEST_KEY} --host 127.0.0.1 --port {{port}}"
    result = pytester.runpytest(
        f"--gsm8k-serve={command}",
        "--gsm8k-limit=2",
        "--gsm8k-report=r.json",
        *NO_EXTRA_PLUGINS,
        *xdist,
    )
    text = output(result)
    assert result.ret == 0, text
    log = (pytester.path / ".pytest_cache/d/gsm8k/serve.log").read_text("utf-8")
    assert f"args: serve fake-model --api-key {REDACTED} --host" in log, log
    assert TEST_KEY not in text
    assert not _files_holding(TEST_KEY, pytester.path, temp)


#: secrets a config's env holds: named like one, and shaped like a token under a plain name
ENV_TOKEN = "hf_SECRETenvTOKEN0987654321"
ENV_SHAPED = "ghp_SECRETshapedTOKEN1122334455"


def _config(server_args: str, env: str = "") -> str:
    return (
        'model_name: "org/m"\naccuracy_threshold: 0.5\nnum_questions: 3\nnum_fewshot: 0\n'
        f"server_args: {json.dumps(server_args)}\n{env}"
    )


@XDIST
def test_a_key_in_a_configs_server_args_or_env_is_written_nowhere(
    pytester: pytest.Pytester,
    gsm8k_data: Path,
    tmp_path: Path,
    xdist: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rule: nothing the run writes holds a secret. A config's ``server_args`` with
    ``--api-key KEY``, ``--api-key=KEY`` or ``a=KEY`` (KEY the run's OPENAI_API_KEY), and its
    ``env`` tokens, went verbatim into the JSON report (``configs[].config.server_args``,
    ``served.argv_args``), and the server's own output (its arguments) into its log under
    the cache folder; a server that dies shows that log's tail on the terminal. Under -n 2
    the config that dies alone (-k): its log's tail reaches the terminal through the worker
    that runs its first item; the others' records are the controller's (plain)."""
    temp = _keyed_vllm(tmp_path, gsm8k_data, monkeypatch)
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "step.md"))
    configs = tmp_path / "configs"
    configs.mkdir()
    env = f"env:\n  HF_TOKEN: {ENV_TOKEN}\n  SHAPED: {ENV_SHAPED}\n"
    for name, text in {
        "Spaced": _config(f"--api-key {TEST_KEY} --enforce-eager", env),
        "Joined": _config(f"--api-key={TEST_KEY}"),
        "Bare": _config(f"a={TEST_KEY}"),
        "Dies": _config(f"--api-key {TEST_KEY} --exit-at-once 3 {shlex.join(SHAPES)}"),
    }.items():
        (configs / f"{name}.yaml").write_text(text, encoding="utf-8")
    result = pytester.runpytest(
        f"--gsm8k-config={configs}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-cache-dir=cache",
        "--gsm8k-report=r.json",
        "--gsm8k-html=page.html",
        "--gsm8k-markdown=summary.md",
        "--junitxml=junit.xml",
        "-rA",
        *NO_EXTRA_PLUGINS,
        *(["-k", "Dies", *xdist] if xdist else []),
    )
    text = output(result)
    assert result.ret == 1, text  # Dies fails; the three others pass
    assert "exited with exit code 3" in text, text  # its log's tail was shown...
    assert f"args: serve org/m --api-key {REDACTED} --exit-at-once 3" in text, text  # ...scrubbed
    if not xdist:
        assert "gsm8k vLLM configs: 3 of 4 pass" in text, text
        rep = report(pytester)
        by_name = {c["config"]["name"]: c for c in rep["configs"]}
        spaced = by_name["Spaced"]["config"]["server_args"]
        assert spaced == ["--api-key", REDACTED, "--enforce-eager"]
        assert by_name["Joined"]["served"]["argv_args"][0] == f"--api-key={REDACTED}"
        assert by_name["Bare"]["config"]["server_args"] == [f"a={REDACTED}"]
        log = (pytester.path / ".pytest_cache/d/gsm8k/serve-Spaced.log").read_text("utf-8")
        assert f"args: serve org/m --api-key {REDACTED} --enforce-eager" in log, log
        assert f"HF_TOKEN={REDACTED} SHAPED={REDACTED}" in log, log
    for secret in (TEST_KEY, ENV_TOKEN, ENV_SHAPED, *SHAPED_SECRETS):
        assert secret not in text
        assert not _files_holding(secret, pytester.path, temp), secret
