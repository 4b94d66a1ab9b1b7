"""Cached answers are reused only for the server that gave them (when a run reads the cache
at all: --gsm8k-resume).

A release gate that graded an old model's cached answers would pass a new,
worse model silently. Each run here records answers from the scripted
server, then "restarts" it as another model under the same name and URL
(only what the server says about itself changes: ``GET /v1/models``, or the
replies' ``model`` and ``system_fingerprint``), and checks, from the server's
own request counters, that the rerun asked again and said so in one line. The runs that
record the answers are set-up, plain in every variant; the -n 2 variants read them under
xdist (a cache written and read under -n 2: test_engine_runs.py, test_resume_runs.py).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import XDIST, output, report, sent, xdist_once

CHANGED_LINE = re.compile(
    r"gsm8k: (\d+) cached answers were recorded against a server that described itself "
    r"differently \((.*)\): asked again"
)


@pytest.fixture
def args(gsm8k_args: list[str]) -> list[str]:
    return [*gsm8k_args, "--gsm8k-cache-dir=cache", "--gsm8k-resume"]


def changed_lines(text: str) -> list[re.Match[str]]:
    return [m for m in (CHANGED_LINE.search(line) for line in text.splitlines()) if m]


#: what GET /v1/models says before and after the restart
LISTED: dict[str, tuple[Any, Any]] = {
    "root": ("/models/good-checkpoint", "/models/worse-checkpoint"),
    "owned_by": ("team-a", "team-b"),
    "max_model_len": (8192, 4096),
}


@pytest.mark.parametrize(
    ("field", "xdist"),
    [
        pytest.param("root", [], id="root-plain"),
        pytest.param("root", ["-n", "2"], id="root-xdist"),
        pytest.param("owned_by", [], id="owned_by-plain"),
        pytest.param("max_model_len", [], id="max_model_len-plain"),
    ],
)
def test_a_restarted_server_that_lists_its_model_differently_is_asked_again(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    args: list[str],
    keyed_env: str,
    xdist: list[str],
    field: str,
) -> None:
    before, after = LISTED[field]
    setattr(server, field, before)
    run = [*args, "--gsm8k-limit=50"]
    first = pytester.runpytest(*run)  # the set-up: plain (see the top)
    assert first.ret == 0, output(first)
    assert sent(server) == 50

    # Restarted: a worse model under the same name, at the same URL.
    server.set_script(Script(default="wrong"))
    server.reset()
    setattr(server, field, after)
    second = pytester.runpytest(*run, *xdist, "--gsm8k-min-acc=0.9", "--gsm8k-report=r.json")
    text = output(second)
    assert second.ret == 1, text
    assert sent(server) == 50, text  # every answer asked again
    assert report(pytester)["counts"]["wrong"] == 50
    assert "answers from cache: 0 of 50" in text
    [line] = changed_lines(text)
    assert line.group(1) == "50"
    assert line.group(2) == f"{field} {before!r} -> {after!r}", line.group(0)

    # The entries now hold the new server's answers: a third run takes them all (plain:
    # cached answers taken under -n 2 without a line is test_an_unchanged_server_...).
    server.reset()
    third = pytester.runpytest(*run)
    assert sent(server) == 0
    assert "answers from cache: 50 of 50" in output(third)
    assert not changed_lines(output(third))


@xdist_once("change", ["model", "system_fingerprint"], ids=["model", "system_fingerprint"])
def test_answers_recorded_from_replies_of_another_model_are_asked_again(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    args: list[str],
    keyed_env: str,
    xdist: list[str],
    change: str,
) -> None:
    """The replies name the model (OpenAI resolves an alias there) and the serving stack's
    fingerprint; a run that sends anything learns them before it trusts a cached answer."""
    first = pytester.runpytest(*args, "--gsm8k-limit=20")  # the set-up: plain (see the top)
    assert first.ret == 0, output(first)
    assert sent(server) == 20

    if change == "model":
        server.set_script(Script(default="wrong", reported_model="fake-model-2025-06-01"))
        before, after = "fake-model", "fake-model-2025-06-01"
    else:
        server.set_script(Script(default="wrong"))
        server.fingerprint = "fp-2"
        before, after = "fake", "fp-2"
    server.reset()
    # 20 of these 50 are cached; the 30 others are asked and reveal the new replies
    second = pytester.runpytest(
        *args, *xdist, "--gsm8k-limit=50", "--gsm8k-min-acc=0.9", "--gsm8k-report=r.json"
    )
    text = output(second)
    assert second.ret == 1, text
    assert sent(server) == 50, text
    assert report(pytester)["counts"]["wrong"] == 50
    assert "answers from cache: 0 of 50" in text
    [line] = changed_lines(text)
    assert line.group(1) == "20"
    assert line.group(2) == f"reply {change} {before!r} -> {after!r}", line.group(0)


@XDIST
def test_an_unchanged_server_reuses_every_answer_without_a_line(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    server.root = "/models/good-checkpoint"
    first = pytester.runpytest(*args, "--gsm8k-limit=20")
    assert first.ret == 0
    assert sent(server) == 20
    server.reset()
    # a partial rerun: the 20 cached answers wait for the first fresh reply, then are used
    second = pytester.runpytest(*args, *xdist, "--gsm8k-limit=30")
    text = output(second)
    assert second.ret == 0, text
    assert sent(server) == 10
    assert "answers from cache: 20 of 30" in text
    assert not changed_lines(text)


@XDIST
def test_an_early_stop_run_takes_held_back_answers_as_it_goes(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    """Early stopping fetches no further ahead than the concurrency: earlier runs' answers
    held back for a reply that never comes are released as the tests ask for them (a
    subprocess with a bound: a hang fails)."""
    run = [*args, "--gsm8k-limit=60", "--gsm8k-concurrency=2"]
    assert pytester.runpytest(*run).ret == 0
    server.reset()
    result = pytester.runpytest_subprocess(
        *run, *xdist, "--gsm8k-early-stop=certain", "--gsm8k-min-acc=0.5", timeout=120
    )
    text = output(result)
    assert result.ret == 0, text
    assert sent(server) == 0
    assert not changed_lines(text)


def test_the_servers_description_is_scrubbed_before_it_is_stored(
    pytester: pytest.Pytester, server: FakeOpenAIServer, args: list[str], keyed_env: str
) -> None:
    server.root = f"/models/{keyed_env}"  # a hostile server echoes the key in its card
    server.fingerprint = f"fp-{keyed_env}"
    result = pytester.runpytest(*args, "--gsm8k-limit=3")
    assert result.ret == 0, output(result)
    files = [p for p in (pytester.path / "cache").rglob("*.json")]
    assert len(files) == 3
    for path in files:
        assert keyed_env not in path.read_text(), path
