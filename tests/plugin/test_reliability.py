"""Fails loud, never hangs, never leaks.

Each test reproduces one finding against the scripted server of tests/fakeserver.py
(its hostile modes: ``echo_auth``, ``reported_model``, the ``hang``, ``nochoices``,
``nullcontent``, ``badjson`` and ``blank`` behaviours, scripted 4xx/429 faults), with and without
``-n 2`` where xdist is involved. Evidence is what the server counted, the output and the
files, never a wall clock (how soon a cancelled run ends: how its workers ended): waits
are bounded by short ``--gsm8k-stall-timeout``, ``--gsm8k-timeout`` and ``--gsm8k-max-retries``.
"""

from __future__ import annotations

import base64
import re
import signal
import socket
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from gsm8k_copy import data_dir
from helpers import (
    NO_EXTRA_PLUGINS,
    TEST_KEY,
    URL_BASIC,
    URL_PASSWORD,
    WORKER_ENDS,
    XDIST,
    GsmRun,
    output,
    output_of,
    processes_in,
    report,
    sent,
    server_behind_a_password,
    spawn_pytest,
    use_proxy,
    wait_until,
    worker_ends,
)

USAGE_ERROR = int(pytest.ExitCode.USAGE_ERROR)
#: the vllm preset's aiohttp client (runtime/wire.py) instead of the openai client
PRESET = "--gsm8k-preset=vllm"
#: a failure through either client is a line, never one of these
CRASHES = ("Traceback", "INTERNALERROR", "aiohttp.")
#: run a test through each client: the openai client and the vllm preset's own
CLIENTS = pytest.mark.parametrize("client", [[], [PRESET]], ids=["openai", "wire"])
#: each client plain, and -n 2 through the openai client: the channel to the workers is the
#: same whichever client the controller holds (an inner -n 2 run costs ~2 CPU-seconds)
CLIENTS_XDIST = pytest.mark.parametrize(
    ("client", "xdist"),
    [([], []), ([PRESET], []), ([], ["-n", "2"])],
    ids=["openai-plain", "wire-plain", "openai-xdist"],
)


def errors(rep: dict[str, Any]) -> Counter[str]:
    return Counter(p["error"] for p in rep["problems"] if p["outcome"] == "error")


def rows_of(*indices: int) -> str:
    """JSONL of the embedded test split's rows at ``indices`` (repeats allowed)."""
    lines = (data_dir() / "test.jsonl").read_text(encoding="utf-8").splitlines()
    return "".join(lines[i] + "\n" for i in indices)


# -- 1. an unwritable or full cache folder ----------------------------------------------


def _one_unwritable_cache_warning(text: str) -> None:
    """A cache folder under a file: one warning naming it and why, and the run goes on."""
    warned = [line for line in text.splitlines() if "gsm8k cache:" in line]
    assert len(warned) == 1, text
    assert "afile/cache" in warned[0]
    assert "Not a directory" in warned[0]


def test_unwritable_cache_folder_is_one_warning_and_a_complete_run(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    """(Under -n 2: the run of a limit above the split, whose cache folder is unwritable.)"""
    (pytester.path / "afile").write_text("a regular file, not a folder\n")
    result = pytester.runpytest(
        *gsm8k_args,
        "--gsm8k-limit=30",
        "--gsm8k-cache-dir=afile/cache",
        "--gsm8k-report=r.json",
    )
    text = output(result)
    assert result.ret == 0, text
    rep = report(pytester)
    assert rep["counts"]["correct"] == 30
    assert rep["complete"] is True
    _one_unwritable_cache_warning(text)
    assert sent(server) == 30


@XDIST
def test_a_full_cache_file_system_is_one_warning(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    folder = pytester.path / "tiny"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a 64k tmpfs here: {mounted.stderr.strip() or 'mount failed'}")
    try:
        (folder / "filler").write_bytes(b"x" * 60_000)  # leave about one page
        result = pytester.runpytest(
            *gsm8k_args,
            *xdist,
            "--gsm8k-limit=40",
            f"--gsm8k-cache-dir={folder}",
            "--gsm8k-report=r.json",
        )
        text = output(result)
        assert result.ret == 0, text
        assert report(pytester)["counts"]["correct"] == 40
        warned = [line for line in text.splitlines() if "gsm8k cache:" in line]
        assert len(warned) == 1, text
        assert "No space left on device" in warned[0], text
    finally:
        subprocess.run(["umount", str(folder)], check=False)


# -- 2. repeated questions; SIGTERM -------------------------------------------------------


def test_repeated_identical_questions_are_all_answered(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    """(Under -n 2: the run of a limit above the split, whose rows repeat too.)"""
    data = pytester.path / "dup.jsonl"
    data.write_text(rows_of(0, 0, 1, 1, 0, 2, 2, 2), encoding="utf-8")
    _, rep = gsm8k_run(f"--gsm8k-data={data}", "--gsm8k-no-cache")
    assert rep["n"] == 8
    assert rep["counts"]["correct"] == 8
    assert rep["complete"] is True


@XDIST
def test_sigterm_ends_the_run_like_ctrl_c_with_summary_and_report(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    # Ten answers come at once, then every request hangs: the run is stuck until the signal.
    hung = {i: "hang" for i in range(1319)}
    from pytest_gsm8k.core.dataset import select
    from pytest_gsm8k.runtime.data import load_split

    chosen = [p.index for p in select(load_split(None, "test", "main").problems, 30, 1234)]
    for index in chosen[:10]:
        hung.pop(index)
    server.set_script(Script(behaviours=hung))
    proc = spawn_pytest(
        pytester,
        *gsm8k_args,
        *xdist,
        "--gsm8k-limit=30",
        "--gsm8k-concurrency=30",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "--gsm8k-stall-timeout=300",
    )
    try:
        head = ""
        if xdist:
            # the controller's head start has requests in flight while xdist still starts
            # the workers: the signal is for a run whose test loop is under way
            assert proc.stdout is not None
            while not re.search(r"\d+ workers \[\d+ items\]", head):
                line = proc.stdout.readline()
                assert line, head
                head += line
        wait_until(lambda: server.stats()["in_flight"] >= 20, 60, interval=0.02)
        assert server.stats()["in_flight"] == 20
        proc.send_signal(signal.SIGTERM)
        out = output_of(proc, 60)
        out = head + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == int(pytest.ExitCode.INTERRUPTED), out
    assert "gsm8k acc (test@1, 0-shot CoT)" in out, out
    assert "INCOMPLETE" in out
    rep = report(pytester)
    # the items that ran before the first hung one in run order, and no more
    assert rep["complete"] is False
    assert rep["counts"]["correct"] <= 10
    assert "Traceback" not in out, out
    # the children (xdist's workers) are stopped too: no process is left in the run's folder
    wait_until(lambda: not processes_in(pytester.path), 15, interval=0.05)
    assert processes_in(pytester.path) == []


@pytest.mark.parametrize("moment", ["head-start", "workers-waiting"])
def test_sigterm_under_xdist_ends_cleanly_and_promptly(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    moment: str,
) -> None:
    """Under xdist the controller has requests in flight before the test loop (its head
    start), possibly while xdist still starts the workers; later each worker waits on the
    controller's answer channel for its item. A SIGTERM at either moment ends the run as
    interrupted, without a traceback, and leaves no process behind; and promptly: the
    channel closes before xdist stops the workers, so none waits out execnet's 5 s grace
    for a busy worker, which then interrupts it (5.5-7 s after the signal before, 0.3-2 s
    now; GitHub's window is 7.5 s): asserted through how each worker ended."""
    server.set_script(Script(behaviours={i: "hang" for i in range(1319)}))
    pytester.makeconftest(WORKER_ENDS)
    proc = spawn_pytest(
        pytester,
        *gsm8k_args,
        "-n",
        "2",
        "--gsm8k-limit=30",
        "--gsm8k-concurrency=5",
        "--gsm8k-no-cache",
        "--gsm8k-stall-timeout=300",
        "--gsm8k-report=r.json",
    )
    try:
        head = ""
        if moment == "workers-waiting":  # the test loop is under way: each worker has asked
            assert proc.stdout is not None
            while not re.search(r"\d+ workers \[\d+ items\]", head):
                line = proc.stdout.readline()
                assert line, head
                head += line
        # the head start's first 5 (the concurrency), hanging: sent before any plan
        assert wait_until(lambda: server.stats()["in_flight"] >= 5, 60, interval=0.01)
        proc.send_signal(signal.SIGTERM)
        out = output_of(proc, 60)
        out = head + out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == int(pytest.ExitCode.INTERRUPTED), out
    assert "Traceback" not in out, out
    assert "INTERNALERROR" not in out, out
    ended = worker_ends(pytester.path)  # promptly: not by execnet's interrupt (exit 2)
    assert int(pytest.ExitCode.INTERRUPTED) not in ended.values(), ended
    assert moment == "head-start" or sorted(ended) == ["gw0", "gw1"], ended
    assert "INCOMPLETE" in out, out  # the summary
    assert report(pytester)["complete"] is False
    wait_until(lambda: not processes_in(pytester.path), 15, interval=0.05)
    assert processes_in(pytester.path) == []


# -- 3. secrets ----------------------------------------------------------------------------


def _all_text_under(root: Path) -> str:
    parts = []
    for path in root.rglob("*"):
        if path.is_file():
            parts.append(path.read_bytes().decode("utf-8", "replace"))
    return "\n".join(parts)


def test_an_echoed_api_key_is_never_printed_or_written(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(Under -n 2: test_log_secrets.py's one run of every echo.)"""
    server.set_script(Script(echo_auth=True, behaviours={i: "error500" for i in range(0, 1319, 3)}))
    step = pytester.path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    tmp = pytester.path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    result = pytester.runpytest(
        *gsm8k_args,
        "--gsm8k-limit=24",
        "--gsm8k-max-retries=0",
        "--gsm8k-cache-dir=cache",
        "--gsm8k-report=r.json",
        "--junitxml=junit.xml",
        "--log-level=DEBUG",
        "-rA",
    )
    text = output(result)
    assert TEST_KEY in server.stats()["auth_headers"][0]  # it was sent, and echoed
    rep = report(pytester)
    assert rep["counts"]["error"]
    assert rep["counts"]["correct"]
    assert all("[redacted]" in p["error"] for p in rep["problems"] if p["outcome"] == "error")
    assert any("[redacted]" in p["response"] for p in rep["problems"] if p["outcome"] != "error")
    assert TEST_KEY not in text
    files = _all_text_under(pytester.path)
    assert "[redacted]" in files
    assert TEST_KEY not in files
    assert (pytester.path / "junit.xml").exists()
    assert step.exists()
    assert list((pytester.path / "cache").rglob("*.json"))


def test_url_credentials_are_never_printed_or_written(
    pytester: pytest.Pytester, gsm8k_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = Script(echo_auth=True, behaviours={i: "error500" for i in range(0, 1319, 3)})
    with server_behind_a_password(gsm8k_data, monkeypatch, script) as (srv, url):
        result = pytester.runpytest(
            "--gsm8k-model=fake-model",
            f"--gsm8k-base-url={url}",
            *NO_EXTRA_PLUGINS,
            "--gsm8k-limit=12",
            "--gsm8k-max-retries=0",
            "--gsm8k-cache-dir=cache",
            "--gsm8k-report=r.json",
            "--junitxml=junit.xml",
        )
        echoed = srv.stats()["auth_headers"]
    text = output(result)
    assert echoed  # what the server saw (and echoed back)
    assert URL_PASSWORD not in text
    assert f"alice:{URL_PASSWORD}" not in text
    files = _all_text_under(pytester.path)
    assert URL_PASSWORD not in files
    assert URL_BASIC not in text + files
    counts = report(pytester)["counts"]
    assert counts["error"]
    assert counts["error"] + counts["correct"] == 12


# -- 4. replies with no usable answer --------------------------------------------------------


@CLIENTS_XDIST
def test_replies_without_an_answer_are_errors_never_cached_and_block_the_baseline(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    client: list[str],
    xdist: list[str],
) -> None:
    """Every kind of reply without an answer is an error, worded alike by both clients (the
    openai client and the vllm preset's own): a body labelled JSON that is not says so,
    with the first 200 characters of its first line (runtime/wire.py's docstring)."""
    from pytest_gsm8k.core.dataset import select
    from pytest_gsm8k.runtime.data import load_split

    chosen = [p.index for p in select(load_split(None, "test", "main").problems, 12, 1234)]
    chosen = list(range(12)) if client else chosen  # the preset runs the first ones
    bad = {chosen[1]: "nochoices", chosen[4]: "nullcontent", chosen[7]: "badjson"}
    bad[chosen[9]] = "blank"  # a text/plain body of whitespace only: said IndexError
    bad |= {chosen[10]: "blankjson", chosen[11]: "badutf8"}  # said JSONDecodeError: ...
    server.set_script(Script(behaviours=bad))
    run = [*gsm8k_args, *client, "--gsm8k-limit=12", "--gsm8k-cache-dir=cache"]
    run.append("--gsm8k-max-retries=0")
    result = pytester.runpytest(*run, *xdist, "--gsm8k-report=r.json", "--snapshot-update")
    text = output(result)
    assert result.ret == 1, text
    rep = report(pytester)
    said = {p["index"]: p["error"] for p in rep["problems"] if p["outcome"] == "error"}
    assert set(said) == set(bad), text
    assert said[chosen[9]] == "the endpoint's reply has no choices: ''"  # the wire client's line
    not_json = "the endpoint's reply is not JSON: "
    assert said[chosen[7]] == not_json + '{"id": "cmpl-broken", "choices": [{"index": 0, "mess'
    assert said[chosen[10]] == not_json + "''"
    assert said[chosen[11]] == not_json + '{"x": "\ufffd"}'
    assert "IndexError" not in text
    assert rep["counts"]["correct"] == 6
    assert len(list((pytester.path / "cache" / "responses").rglob("*.json"))) == 6
    assert "baseline: FAIL: not written" in text
    assert "6 problems ended in an error" in text
    assert not (pytester.path / "__snapshots__").exists()
    server.reset()
    # the follow-up plain (the cache is read by the controller)
    again = pytester.runpytest(*run, "--gsm8k-resume", "--gsm8k-report=r2.json")
    assert again.ret == 1
    assert sent(server) == 6  # only the unanswered ones are asked again


@CLIENTS
@pytest.mark.parametrize(
    ("content_type", "answered"),
    [("application/json; charset=utf-8", True), ("text/plain", False), ("", False)],
    ids=["json-charset", "text-plain", "unlabelled"],
)
def test_a_reply_is_an_answer_by_its_content_type_alike_through_both_clients(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    client: list[str],
    content_type: str,
    answered: bool,
) -> None:
    """A 2xx reply is read as JSON when labelled so (a type ending in ``json``, parameters
    aside) and as text otherwise, through either client: a completion's JSON labelled
    text/plain, or not labelled, is the item's error on both (the openai client reads it as
    text; vLLM's gsm8k script, which the preset mimics, refuses it with aiohttp's json()),
    never an answer on one client and an error on the other."""
    server.set_script(Script(reply_content_type=content_type))
    run = [*gsm8k_args, *client, "--gsm8k-limit=2", "--gsm8k-no-cache", "--gsm8k-max-retries=0"]
    result = pytester.runpytest(*run, "--gsm8k-report=r.json")
    text = output(result)
    rep = report(pytester)
    if answered:
        assert result.ret == 0, text
        assert rep["counts"]["correct"] == 2, text
    else:
        assert result.ret == 1, text
        said = errors(rep)
        assert sum(said.values()) == 2, text
        assert all(e.startswith("the endpoint's reply has no choices: {") for e in said), said
    assert not any(crash in text for crash in CRASHES), text


@CLIENTS
def test_a_key_cut_by_a_replys_excerpt_is_never_printed_or_written(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    client: list[str],
) -> None:
    """A reply's excerpt is cut at 200 characters, before the run's secrets are scrubbed from
    it: a key the cut falls inside (echoed by a server in a body labelled JSON that is not)
    is never shown in part either; its first characters are redacted as the whole key is."""
    server.set_script(Script(default="echojson"))
    run = [*gsm8k_args, *client, "--gsm8k-limit=2", "--gsm8k-no-cache", "--gsm8k-max-retries=0"]
    result = pytester.runpytest(*run, "--gsm8k-report=r.json", "--junitxml=junit.xml", "-rA")
    text = output(result)
    assert result.ret == 1, text
    said = errors(report(pytester))
    assert sum(said.values()) == 2, text
    assert all(e.startswith("the endpoint's reply is not JSON: <<<") for e in said), said
    assert all(e.endswith("Bearer [redacted]") for e in said), said
    head = TEST_KEY[:6]  # as short a part as the scrubber hides (MIN_SECRET)
    assert head not in text, text
    assert head not in _all_text_under(pytester.path)


# -- 5. a hung endpoint; timeouts and the breaker ---------------------------------------------


@XDIST
def test_a_hung_endpoint_is_reported_by_the_stall_detector(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    """An endpoint failure exits 1 the same with and without xdist (the two variants)."""
    server.set_script(Script(default="hang"))
    result = pytester.runpytest(
        *gsm8k_args,
        *xdist,
        "--gsm8k-limit=5",
        "--gsm8k-no-cache",
        "--gsm8k-stall-timeout=1",
        "--gsm8k-report=r.json",
    )
    text = output(result)
    assert result.ret == 1, text
    message = f"no answer from {server.base_url} for 1 s with 5 requests in flight"
    assert set(errors(report(pytester))) == {message + " (see --gsm8k-stall-timeout)"}
    assert message in text
    assert "Traceback" not in text
    assert sent(server) == 5


@CLIENTS
def test_timeouts_open_the_dead_endpoint_breaker(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    client: list[str],
) -> None:
    server.set_script(Script(default="hang"))
    result = pytester.runpytest(
        *gsm8k_args,
        *client,
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
    assert not any(crash in text for crash in CRASHES), text


# -- 6. the same failure on many requests --------------------------------------------------


@CLIENTS_XDIST
def test_a_400_on_the_first_requests_stops_the_run_quoting_the_server(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
    client: list[str],
) -> None:
    server.set_script(Script(echo_auth=True, fail_first={i: {"400": 99} for i in range(1319)}))
    result = pytester.runpytest(
        *gsm8k_args,
        *xdist,
        *client,
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
    # no retries, nothing sent after the first answer; at most what was in flight: under
    # xdist the controller's head start guesses no more once its first guesses are refused,
    # and the plan then takes their failures
    assert sent(server) <= 4
    assert server.stats()["status_counts"].get(400, 0) <= 4


@XDIST
def test_a_429_storm_past_the_retry_budget_stops_once_nothing_gets_through(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    server.set_script(Script(fail_first={i: {"429": 99} for i in range(1319)}, retry_after=0.01))
    result = pytester.runpytest(
        *gsm8k_args,
        *xdist,
        "--gsm8k-limit=60",
        "--gsm8k-concurrency=2",
        "--gsm8k-no-cache",
        "--gsm8k-max-retries=0",
        "--gsm8k-report=r.json",
    )
    text = output(result)
    assert result.ret == 1, text
    each = "HTTP 429 after retries: Rate limit reached (scripted)."
    stop = f"{each} (10 requests in a row failed this way, none answered between them)"
    found = errors(report(pytester))
    assert set(found) == {each, stop + "; stopped sending"}, found
    assert found[each] <= 10 + 2
    assert found[each] + found[stop + "; stopped sending"] == 60
    assert sent(server) <= 10 + 2  # the streak, plus what was in flight
    # The stop is said once in the summary (and once more in pytest's own "! ... !" line when the
    # session stops before its last item); beside it only the items that carried it before the
    # session ended (the one that tripped it and, under xdist, one per worker), each in the ERRORS
    # section and the short summary: a small constant, never one per problem.
    carriers = 1 + (2 if xdist else 0)
    stop_lines = sum("10 requests in a row" in line for line in text.splitlines())
    assert stop_lines <= 2 + 2 * carriers, text


# -- 7. smaller -----------------------------------------------------------------------------


def test_answer_regex_without_group_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--gsm8k-model=m", "--gsm8k-answer-regex=#### \\d+")
    assert result.ret == USAGE_ERROR
    lines = [line for line in output(result).splitlines() if line.startswith("ERROR: gsm8k:")]
    assert len(lines) == 1
    assert "capture group" in lines[0]


def test_model_names_from_the_server_reach_the_terminal_without_escapes(
    server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    server.set_script(Script(reported_model="evil\x1b[2J\x1b[31mRED\x07\rmodel"))
    result, _ = gsm8k_run("--gsm8k-limit=3", "--gsm8k-no-cache", report=None)
    text = output(result)
    assert "server reported: evil" in text
    assert "REDmodel" in text
    assert "\x1b[2J" not in text
    assert "\x07" not in text
    assert "\r" not in text


def test_limit_above_the_split_runs_everything_and_says_so_once(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    """Under -n 2, with rows that repeat (each still answered: the test above) and a cache
    folder that cannot be made (one warning, a complete run: the first test here)."""
    (pytester.path / "afile").write_text("a regular file, not a folder\n")
    data = pytester.path / "six.jsonl"
    data.write_text(rows_of(0, 1, 2, 3, 4, 5, 0, 0, 1, 2, 2), encoding="utf-8")
    result = pytester.runpytest(
        *gsm8k_args,
        f"--gsm8k-data={data}",
        "--gsm8k-limit=50",
        "--gsm8k-cache-dir=afile/cache",
        "--gsm8k-report=r.json",
        "-n",
        "2",
    )
    text = output(result)
    assert result.ret == 0, text
    assert sent(server) == 11
    assert text.count("--gsm8k-limit 50 is above the 11 problems of the split: all 11 run") == 1
    rep = report(pytester)
    assert rep["n"] == 11
    assert rep["counts"]["correct"] == 11
    assert rep["complete"] is True
    _one_unwritable_cache_warning(text)


@pytest.mark.parametrize(
    ("client", "xdist"), [([], ["-n", "2"]), ([PRESET], [])], ids=["openai-xdist", "wire-plain"]
)
def test_a_retry_after_longer_than_the_client_waits_is_reported(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    client: list[str],
    xdist: list[str],
) -> None:
    """Said once and not waited, whichever client; -n 2 through one (the controller holds
    the client and says it, whichever client it is: see CLIENTS_XDIST)."""
    server.set_script(Script(fail_first={i: {"429": 1} for i in range(1319)}, retry_after=600))
    result = pytester.runpytest(*gsm8k_args, *client, "--gsm8k-limit=3", "--gsm8k-no-cache", *xdist)
    text = output(result)
    assert result.ret == 1, text  # the client gives up on a Retry-After over 120 s: errors
    lines = [line for line in text.splitlines() if "asked to wait 600 s" in line]
    assert len(lines) == 1, text
    assert "longer than the client waits (120 s)" in lines[0], text
    assert sent(server) == 3


# -- 8. exit codes ---------------------------------------------------------------------------


def test_the_served_model_list_reaches_the_terminal_without_escapes(
    pytester: pytest.Pytester, keyed_env: str
) -> None:
    from gsm8k_copy import data_dir

    with FakeOpenAIServer(
        data_dir() / "test.jsonl", model="evil\x1b[31mred\x07", api_key=keyed_env
    ) as evil:
        result = pytester.runpytest("--gsm8k-model=other", f"--gsm8k-base-url={evil.base_url}")
    text = result.stdout.str() + result.stderr.str()
    assert result.ret == 4
    line = next(x for x in text.splitlines() if x.startswith("ERROR: gsm8k:"))
    assert "is not served" in line
    assert "(it serves: evilred)" in line  # the escapes dropped
    assert "\x1b" not in text
    assert "\x07" not in text


@XDIST
def test_a_reasoning_models_refusal_names_every_option_that_gets_it_through(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    """OpenAI's reasoning models refuse ``max_tokens``, then any temperature but 1, one 400
    at a time: the run stopped with the server's text twice, one fix each, and the way
    through (``max_completion_tokens``) was left to guess. The first stop names all three
    options; with them the run goes through, its requests holding none of the refused
    fields."""
    server.set_script(Script(reasoning=True))
    common = (*gsm8k_args, *xdist, "--gsm8k-limit=6", "--gsm8k-concurrency=2")
    result = pytester.runpytest(*common, "--gsm8k-report=r.json")
    text = output(result)
    assert result.ret == 1, text
    [message] = errors(report(pytester))
    assert "Unsupported parameter: 'max_tokens'" in message
    for option in (
        "--gsm8k-max-tokens none",
        "--gsm8k-param max_completion_tokens=N",
        "--gsm8k-temperature none",
        "--gsm8k-repeats",
    ):
        assert option in message, message
    server.reset()
    server.set_script(Script(reasoning=True))
    server.record = True
    fixed = pytester.runpytest(  # plain: what the controller sends once told
        *gsm8k_args,
        "--gsm8k-limit=6",
        "--gsm8k-concurrency=2",
        "--gsm8k-max-tokens=none",
        "--gsm8k-param=max_completion_tokens=512",
        "--gsm8k-temperature=none",
    )
    assert fixed.ret == 0, output(fixed)
    bodies: list[dict[str, Any]] = server.stats()["bodies"]
    assert bodies
    assert all("max_tokens" not in b and "temperature" not in b for b in bodies)
    assert all(b["max_completion_tokens"] == 512 for b in bodies)


# -- 9. the vllm preset's aiohttp client ------------------------------------------------------
# It replaces the openai client for ``--gsm8k-preset vllm`` only, for speed; everything the
# openai client gave must still hold through it: retries with the same policy, one line per
# failure the engine already knows how to say, the dead-endpoint breaker, the reply bound, the
# key kept out of every output, and the script's own headers (the cases both clients share
# are parametrized with CLIENTS above).


def outcomes(rep: dict[str, Any]) -> dict[int, str]:
    return {int(p["index"]): p["outcome"] for p in rep["problems"]}


def test_transient_faults_are_retried_and_every_problem_answered(
    server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    """Plain: the retries are the controller's client's (retries under -n 2 through the
    openai client: test_engine_runs.py; the channel is the same whichever client)."""
    faults = {0: {"500": 2}, 1: {"429": 1}, 2: {"drop": 1}, 3: {"503": 1}}
    server.set_script(Script(fail_first=faults, retry_after=0.01))
    _, rep = gsm8k_run(PRESET, "--gsm8k-limit=6", "--gsm8k-no-cache")
    assert set(outcomes(rep).values()) == {"correct"}
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


def test_a_gzip_bomb_and_a_huge_reply_are_their_problems_errors(
    server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    """The preset's aiohttp client has its own bounds; how such an error crosses from an xdist
    worker is the same for both clients (test_hostile_replies.py runs it under -n 2)."""
    server.set_script(Script(behaviours={1: "gzipbomb", 3: "huge"}))
    result, rep = gsm8k_run(PRESET, "--gsm8k-limit=5", "--gsm8k-no-cache", ret=1)
    text = output(result)
    assert not any(crash in text for crash in CRASHES), text
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


@CLIENTS
def test_the_proxy_comes_from_the_environment_and_a_netrc_entry_changes_nothing(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    keyed_env: str,
    monkeypatch: pytest.MonkeyPatch,
    client: list[str],
) -> None:
    """HTTP_PROXY is honoured as openai's httpx honours it (the fake server takes the
    proxied requests), NO_PROXY too, through either client (the openai client's own transport
    once sent the completions directly); a ~/.netrc entry for the host is not read (with it,
    aiohttp's trust_env added Basic auth beside the key and every request failed). The
    proxy's credentials in its URL reach it, never the output, and without a deprecation
    warning (aiohttp 3.14 deprecates ``proxy_auth``: one per request). Plain only: under -n 2
    the controller's client is the one that connects (the workers import no HTTP client:
    test_engine_runs.py's xdist report)."""
    use_proxy(monkeypatch, "HTTP_PROXY", f"http://someone:proxy-secret@127.0.0.1:{server.port}")
    netrc = pytester.path / "netrc"
    netrc.write_text(f"machine {UPSTREAM} login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    run = [
        "--gsm8k-model=fake-model",
        f"--gsm8k-base-url=http://{UPSTREAM}/v1",
        *NO_EXTRA_PLUGINS,
        *client,
        "--gsm8k-limit=4",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "-W",
        "error::DeprecationWarning",
    ]
    result = pytester.runpytest(*run)
    assert result.ret == 0, output(result)
    assert set(outcomes(report(pytester)).values()) == {"correct"}
    stats = server.stats()
    assert stats["proxied"] == {UPSTREAM: 1 + 4}  # GET /models, then each problem
    assert stats["auth_headers"] == [f"Bearer {TEST_KEY}"]
    assert stats["proxy_auth"] == ["Basic " + base64.b64encode(b"someone:proxy-secret").decode()]
    assert "proxy-secret" not in output(result)
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
    assert sent(server) == 4


@CLIENTS
def test_a_proxy_password_is_read_as_httpx_reads_it_and_never_shown(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    keyed_env: str,
    monkeypatch: pytest.MonkeyPatch,
    client: list[str],
) -> None:
    """A proxy password with ``[``, ``]`` or ``\\`` unquoted: httpx quotes it and reaches the
    proxy; aiohttp's URL parser refuses it, and since the vllm preset handed aiohttp the
    credentialed URL, its error (every item's, and the report's) showed the password. The
    preset reads the proxy as httpx does; a secret is never printed."""
    password = "proxy[secret]\\42"
    use_proxy(monkeypatch, "HTTP_PROXY", f"http://someone:{password}@127.0.0.1:{server.port}")
    result = pytester.runpytest(
        "--gsm8k-model=fake-model",
        f"--gsm8k-base-url=http://{UPSTREAM}/v1",
        *NO_EXTRA_PLUGINS,
        *client,
        "--gsm8k-limit=2",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
    )
    text = output(result) + (pytester.path / "r.json").read_text()
    assert "secret]" not in text, text
    assert result.ret == 0, text
    assert set(outcomes(report(pytester)).values()) == {"correct"}
    basic = base64.b64encode(f"someone:{password}".encode()).decode()
    assert server.stats()["proxy_auth"] == [f"Basic {basic}"]


def test_a_proxy_the_client_cannot_use_is_one_line(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    use_proxy(monkeypatch, "ALL_PROXY", "socks5://127.0.0.1:1080")
    result = pytester.runpytest(*gsm8k_args, PRESET, "--gsm8k-limit=2", "--gsm8k-no-cache")
    text = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, text
    assert "gsm8k: the environment names a socks5:// proxy for the endpoint" in text
    assert "Traceback" not in text
    assert sent(server) == 0
