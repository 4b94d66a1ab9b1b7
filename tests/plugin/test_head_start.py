"""The xdist controller's head start: it sends the first requests of its own plan while the
workers start, never more than its bound, never when an option says the workers will collect
other items, and never an answer twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_EXTRA_PLUGINS, output, report, sent

from pytest_gsm8k.serving import head_start_allowed

#: the workers wait in collection (up to ``wait`` seconds) until the endpoint has seen
#: ``want`` completions, and write down how many it had: only a controller that sends before
#: any worker offered its plan can get them there
WAIT_FOR_HEAD_START = """
import json, os, time, urllib.request

def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):
        return
    deadline = time.monotonic() + {wait}
    while True:
        with urllib.request.urlopen("http://127.0.0.1:{port}/_stats") as reply:
            seen = json.load(reply)["requests_by_path"].get("/v1/chat/completions", 0)
        if seen >= {want} or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    with open("seen-" + config.workerinput["workerid"], "w") as fh:
        fh.write(str(seen))
"""


def _seen(pytester: pytest.Pytester) -> list[int]:
    """What each worker found at the end of its collection."""
    return sorted(int(p.read_text()) for p in pytester.path.glob("seen-gw*"))


#: a conftest's own gsm8k_model or gsm8k_protocol: what the plugin's would give
OWN_FIXTURE = """
import pytest
from pytest_gsm8k.session import get_session

@pytest.fixture(scope="session")
def gsm8k_model(pytestconfig):
    return get_session(pytestconfig).sources.default_client()

@pytest.fixture(scope="session")
def gsm8k_protocol(pytestconfig):
    return get_session(pytestconfig).plan.protocol
"""

#: deselects every GSM8K item but the last three, where the controller cannot see it
KEEP_LAST_THREE = """
def pytest_collection_modifyitems(config, items):
    items[:] = items[-3:]
"""


def _completions(server: FakeOpenAIServer) -> int:
    return int(server.stats()["requests_by_path"].get("/v1/chat/completions", 0))


def _run(
    pytester: pytest.Pytester, server: FakeOpenAIServer, data: Path, *extra: str
) -> pytest.RunResult:
    return pytester.runpytest(
        "-n",
        "2",
        "--gsm8k-model=fake-model",
        f"--gsm8k-base-url={server.base_url}",
        f"--gsm8k-data={data}",
        "--gsm8k-concurrency=2",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        *extra,
        *NO_EXTRA_PLUGINS,
    )


def test_the_controller_sends_its_plan_before_the_workers_offer_it_each_problem_once(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_data: Path, keyed_env: str
) -> None:
    pytester.makeconftest(WAIT_FOR_HEAD_START.format(port=server.port, want=8, wait=20))
    result = _run(pytester, server, gsm8k_data, "--gsm8k-limit=20")
    assert result.ret == 0, output(result)
    # the first worker to offer its plan found the head start's 4 x 2 there, and no more
    # (the other may have found the first one's plan at work)
    assert _seen(pytester)[0] == 8
    assert report(pytester)["n"] == 20
    # 4 rounds of --gsm8k-concurrency=2 ahead, then the offered plan: each problem once
    assert _completions(server) == 20


def test_a_head_start_without_an_option_that_may_deselect(pytester: pytest.Pytester) -> None:
    """The control of the next test's cases: without their option, a head start."""
    assert head_start_allowed(pytester.parseconfigure())


@pytest.mark.parametrize(
    "option",
    [
        ["-k", "test-0"],
        ["-m", "gsm8k and not slow"],
        ["--deselect", "gsm8k::test_gsm8k"],
        ["--lf"],
        ["--sw"],
        ["conftest-model"],
        ["conftest-protocol"],
    ],
    ids=["-k", "-m", "--deselect", "--lf", "--sw", "conftest-model", "conftest-protocol"],
)
def test_no_head_start_when_an_option_may_deselect(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_data: Path,
    keyed_env: str,
    option: list[str],
) -> None:
    """Nothing is sent before a worker offers its plan (each waits a second for it). The
    controller decides at session start from its configuration (head_start_allowed): each
    option is read there; one -n 2 run for each kind of reason (a filter on the command line,
    a conftest's own fixture) shows that the decision is what the run does."""
    conftest = WAIT_FOR_HEAD_START.format(port=server.port, want=1, wait=1)
    end_to_end = option[0] in ("-k", "conftest-model")
    if option[0].startswith("conftest-"):
        # the plugin's own fixture, passed through: the workers ask their own engines
        name = "gsm8k_" + option[0].split("-")[1]
        own = OWN_FIXTURE.split("@pytest.fixture")
        conftest += own[0] + "".join("@pytest.fixture" + f for f in own[1:] if f" {name}(" in f)
        option = []
    pytester.makeconftest(conftest)
    pytester.makeini("[pytest]\nmarkers =\n    slow: a slow test\n")
    assert not head_start_allowed(pytester.parseconfigure(*option))
    if end_to_end:
        result = _run(pytester, server, gsm8k_data, "--gsm8k-limit=20", *option)
        assert result.ret in (0, 5), output(result)
        # the first worker to offer its plan waited a second and found nothing sent
        assert _seen(pytester)[0] == 0


def test_a_deselection_the_controller_cannot_see_costs_at_most_the_head_start(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_data: Path, keyed_env: str
) -> None:
    pytester.makeconftest(KEEP_LAST_THREE)
    result = _run(pytester, server, gsm8k_data, "--gsm8k-limit=40")
    assert result.ret == 0, output(result)
    data = report(pytester)
    assert data["n"] == 3
    assert data["counts"]["correct"] == 3
    # the three kept problems, and at most the head start's 4 x 2 guessed from the plan
    # (the three are its last: none of them is among the guessed)
    assert 3 <= _completions(server) <= 3 + 8


#: the first 8 problems of the run order only (a run interrupted early, say)
KEEP_FIRST_EIGHT = """
def pytest_collection_modifyitems(config, items):
    items[:] = items[:8]
"""


def test_cached_answers_the_head_start_finds_are_checked_against_a_fresh_reply(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_data: Path, keyed_env: str
) -> None:
    """The head start's requests are the run order's first: exactly what an interrupted
    run left in the cache. Those answers wait for this run's first fresh reply (here from
    a server that now replies as another build) instead of being used on the card alone."""
    args = [
        "--gsm8k-model=fake-model",
        f"--gsm8k-base-url={server.base_url}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-concurrency=2",
        "--gsm8k-limit=50",
        "--gsm8k-cache-dir=cache",
        *NO_EXTRA_PLUGINS,
    ]
    pytester.makeconftest(KEEP_FIRST_EIGHT)
    first = pytester.runpytest(*args)
    assert first.ret == 0, output(first)
    assert sent(server) == 8
    (pytester.path / "conftest.py").unlink()
    server.set_script(Script(default="wrong"))
    server.fingerprint = "fp-2"
    server.reset()
    second = pytester.runpytest(*args, "-n", "2", "--gsm8k-resume", "--gsm8k-report=r.json")
    text = output(second)
    assert second.ret == 0, text
    assert sent(server) == 50, text  # the 8 cached answers asked again
    assert report(pytester)["counts"]["correct"] == 0
    assert "8 cached answers" in text, text
