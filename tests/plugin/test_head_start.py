"""The xdist controller's head start: it sends the first requests of its own plan while the
workers start, never more than its bound, never when an option says the workers will collect
other items, and never an answer twice."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer
from helpers import NO_EXTRA_PLUGINS, output, report

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


@pytest.mark.parametrize(
    "option",
    [
        ["-k", "test-0"],
        ["-m", "gsm8k and not slow"],
        ["--deselect", "gsm8k::test_gsm8k"],
        ["--lf"],
    ],
    ids=["-k", "-m", "--deselect", "--lf"],
)
def test_no_head_start_when_an_option_may_deselect(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_data: Path,
    keyed_env: str,
    option: list[str],
) -> None:
    """Nothing is sent before a worker offers its plan (each waits a second for it)."""
    pytester.makeconftest(WAIT_FOR_HEAD_START.format(port=server.port, want=1, wait=1))
    pytester.makeini("[pytest]\nmarkers =\n    slow: a slow test\n")
    result = _run(pytester, server, gsm8k_data, "--gsm8k-limit=20", *option)
    assert result.ret in (0, 5), output(result)  # --deselect of all runs nothing
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
