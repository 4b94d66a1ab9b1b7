"""The vllm preset's aiohttp client (runtime/wire.py) in real runs, with and without xdist.

It replaces the openai client for ``--gsm8k-preset vllm`` only, for speed; everything the
openai client gave must still hold through it: retries with the same policy, one line per
failure the engine already knows how to say, the dead-endpoint breaker, the reply bound, the
key kept out of every output, and the script's own headers. Each test talks HTTP to the
scripted fake server; the counts are the server's.
"""

from __future__ import annotations

import socket
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_EXTRA_PLUGINS, TEST_KEY, XDIST, output, report, sent

PRESET = "--gsm8k-preset=vllm"
CRASHES = ("Traceback", "INTERNALERROR", "aiohttp.")


def errors(rep: dict[str, Any]) -> Counter[str]:
    return Counter(p["error"] for p in rep["problems"] if p["outcome"] == "error")


def outcomes(rep: dict[str, Any]) -> dict[int, str]:
    return {int(p["index"]): p["outcome"] for p in rep["problems"]}


@XDIST
def test_transient_faults_are_retried_and_every_problem_answered(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    faults = {0: {"500": 2}, 1: {"429": 1}, 2: {"drop": 1}, 3: {"503": 1}}
    server.set_script(Script(fail_first=faults, retry_after=0.01))
    result = pytester.runpytest(
        *gsm8k_args, *xdist, PRESET, "--gsm8k-limit=6", "--gsm8k-no-cache", "--gsm8k-report=r.json"
    )
    text = output(result)
    assert result.ret == 0, text
    assert set(outcomes(report(pytester)).values()) == {"correct"}
    assert sent(server) == 6 + 2 + 1 + 1 + 1  # each fault asked again, nothing more


def test_retries_stop_at_max_retries_with_the_status_in_one_line(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    server.set_script(Script(fail_first={2: {"500": 99}}))
    result = pytester.runpytest(
        *gsm8k_args,
        PRESET,
        "--gsm8k-limit=4",
        "--gsm8k-no-cache",
        "--gsm8k-max-retries=2",
        "--gsm8k-report=r.json",
    )
    text = output(result)
    assert result.ret == 1, text
    rep = report(pytester)
    [(message, count)] = errors(rep).items()
    assert count == 1
    assert message.startswith("HTTP 500 after retries: "), message
    assert outcomes(rep)[2] == "error"
    assert sent(server) == 3 + 3  # the failing one: first ask and two retries
    assert not any(crash in text for crash in CRASHES), text


@XDIST
def test_a_400_on_the_first_requests_stops_the_run_quoting_the_server(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    server.set_script(Script(echo_auth=True, fail_first={i: {"400": 99} for i in range(1319)}))
    result = pytester.runpytest(
        *gsm8k_args,
        *xdist,
        PRESET,
        "--gsm8k-limit=40",
        "--gsm8k-concurrency=4",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
    )
    text = output(result)
    assert result.ret == 1, text
    [message] = errors(report(pytester))
    assert message.startswith("the endpoint refused the first requests: HTTP 400: Scripted fault")
    assert "after retries" not in message
    assert "[redacted]" in message
    assert TEST_KEY not in text
    # at most what was in flight: under xdist the controller's head start guesses no more
    # once its first guesses are refused, and the plan then takes their failures
    assert sent(server) <= 4


def test_a_rejected_key_ends_the_run_with_one_line(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    server.set_script(Script(fail_first={i: {"401": 99} for i in range(1319)}))
    result = pytester.runpytest(
        *gsm8k_args,
        PRESET,
        "--gsm8k-limit=10",
        "--gsm8k-concurrency=2",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
    )
    text = output(result)
    assert result.ret == 1, text
    [message] = errors(report(pytester))
    assert message == (
        "the endpoint rejected the credentials (HTTP 401); check the API key variable"
    )
    assert sent(server) <= 2  # fatal at the first answer: never retried
    assert TEST_KEY not in text


def test_a_retry_after_longer_than_the_client_waits_is_said_once_and_not_waited(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    server.set_script(Script(fail_first={i: {"429": 1} for i in range(1319)}, retry_after=600))
    result = pytester.runpytest(
        *gsm8k_args, PRESET, "--gsm8k-limit=3", "--gsm8k-no-cache", "-n", "2"
    )
    text = output(result)
    assert result.ret == 1, text
    lines = [line for line in text.splitlines() if "asked to wait 600 s" in line]
    assert len(lines) == 1, text
    assert "longer than the client waits (120 s)" in lines[0], text
    assert sent(server) == 3


def test_timeouts_open_the_dead_endpoint_breaker(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    server.set_script(Script(default="hang"))
    result = pytester.runpytest(
        *gsm8k_args,
        PRESET,
        "--gsm8k-limit=8",
        "--gsm8k-concurrency=4",
        "--gsm8k-no-cache",
        "--gsm8k-timeout=0.3",
        "--gsm8k-max-retries=5",
        "--gsm8k-report=r.json",
    )
    text = output(result)
    assert result.ret == 1, text
    [message] = errors(report(pytester))
    assert "unreachable" in message, message
    assert "Timeout" in message, message
    assert sent(server) < 8 * 6  # stopped before every request spent its retries


@XDIST
def test_a_gzip_bomb_and_a_huge_reply_are_their_problems_errors(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    server.set_script(Script(behaviours={1: "gzipbomb", 3: "huge"}))
    result = pytester.runpytest(
        *gsm8k_args, *xdist, PRESET, "--gsm8k-limit=5", "--gsm8k-no-cache", "--gsm8k-report=r.json"
    )
    text = output(result)
    assert result.ret == 1, text
    assert not any(crash in text for crash in CRASHES), text
    rep = report(pytester)
    by_index = {int(p["index"]): p for p in rep["problems"]}
    assert "over 32 MiB decoded" in by_index[1]["error"]
    assert by_index[3]["error"].startswith("the endpoint's reply is over 32 MiB (7")
    assert [by_index[i]["outcome"] for i in (0, 2, 4)] == ["correct"] * 3
    assert sent(server) == 5  # a refused reply is not asked for again


def test_a_dead_endpoint_is_one_line(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    server.die_after = 2  # the server closes everything after two answers
    result = pytester.runpytest(
        *gsm8k_args,
        PRESET,
        "--gsm8k-limit=30",
        "--gsm8k-concurrency=2",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
    )
    text = output(result)
    assert result.ret == 1, text
    found = errors(report(pytester))
    assert any("unreachable" in m for m in found), found
    assert not any(crash in text for crash in CRASHES), text


def test_the_request_carries_the_scripts_headers_and_the_key_only_when_set(
    pytester: pytest.Pytester, gsm8k_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's script sends aiohttp's headers and no Authorization; so does the preset,
    unless a key is set (a server started with --api-key needs it)."""
    keyless = FakeOpenAIServer(gsm8k_data / "test.jsonl", model="fake-model", record=True)
    keyless.start()
    try:
        run = [
            "--gsm8k-model=fake-model",
            f"--gsm8k-base-url={keyless.base_url}",
            *NO_EXTRA_PLUGINS,
            PRESET,
            "--gsm8k-limit=2",
            "--gsm8k-no-cache",
        ]
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        result = pytester.runpytest(*run)
        assert result.ret == 0, output(result)
        seen = keyless.stats()["request_headers"]
        assert len(seen) == 2
        for headers in seen:
            assert headers["content-type"] == "application/json"
            assert "authorization" not in headers  # vLLM's script sends none
            assert not any(k.startswith("x-stainless") for k in headers)  # no openai client
        monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
        keyless.reset()
        result = pytester.runpytest(*run)
        assert result.ret == 0, output(result)
        seen = keyless.stats()["request_headers"]
        assert [h.get("authorization") for h in seen] == [f"Bearer {TEST_KEY}"] * 2
        assert TEST_KEY not in output(result)
    finally:
        keyless.stop()


UPSTREAM = "gsm8k-upstream.invalid"  # never resolves (RFC 6761): reached only through a proxy


@XDIST
def test_the_proxy_comes_from_the_environment_and_a_netrc_entry_changes_nothing(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    keyed_env: str,
    monkeypatch: pytest.MonkeyPatch,
    xdist: list[str],
) -> None:
    """HTTP_PROXY is honoured as openai's httpx honours it (the fake server takes the
    proxied requests), NO_PROXY too; a ~/.netrc entry for the host is not read (with it,
    aiohttp's trust_env added Basic auth beside the key and every request failed)."""
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{server.port}")
    netrc = pytester.path / "netrc"
    netrc.write_text(f"machine {UPSTREAM} login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    run = [
        "--gsm8k-model=fake-model",
        f"--gsm8k-base-url=http://{UPSTREAM}/v1",
        *NO_EXTRA_PLUGINS,
        *xdist,
        PRESET,
        "--gsm8k-limit=4",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
    ]
    result = pytester.runpytest(*run)
    assert result.ret == 0, output(result)
    assert set(outcomes(report(pytester)).values()) == {"correct"}
    stats = server.stats()
    assert stats["proxied"] == {UPSTREAM: 1 + 4}  # GET /models, then each problem
    assert stats["auth_headers"] == [f"Bearer {TEST_KEY}"]
    # NO_PROXY as httpx reads it (a network here): the endpoint itself, the proxy unused
    # (it is a closed port: through it nothing would arrive)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{closed.getsockname()[1]}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.0/8")
    server.reset()
    direct = [
        f"--gsm8k-base-url={server.base_url}" if a.startswith("--gsm8k-base-url") else a
        for a in run
    ]
    result = pytester.runpytest(*direct)
    assert result.ret == 0, output(result)
    stats = server.stats()
    assert stats["proxied"] == {}
    assert stats["requests_by_path"]["/v1/completions"] == 4


def test_a_proxy_the_client_cannot_use_is_one_line(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "NO_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    result = pytester.runpytest(*gsm8k_args, PRESET, "--gsm8k-limit=2", "--gsm8k-no-cache")
    text = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "gsm8k: the environment names a socks5:// proxy for the endpoint" in text
    assert "Traceback" not in text
    assert sent(server) == 0
