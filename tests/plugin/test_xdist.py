"""xdist without surprises: the controller's one engine, one call per item, nothing left.

The plugin's own client under ``-n``: the controller fetches for every worker
through :mod:`pytest_gsm8k.runtime.answers`; the workers never import an HTTP
client (test_engine_runs.py's xdist report). A user's model is called exactly once
per item and sample whatever its fixture scope. Killing the controller leaves no
process behind. Every run is the real plugin against the loopback fake server; the
evidence is the server's (or the user's callable's) own count.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_EXTRA_PLUGINS, XDIST, output, report, sent, wait_until

SCOPED_CONFTEST = """
import os
import pytest

def model(request):
    with open(os.environ["CALLS_FILE"], "a") as fh:  # O_APPEND: whole lines, any process
        fh.write(request.problem_id + "\\n")
    return "#### 0"

@pytest.fixture(scope="{SCOPE}")
def gsm8k_model():
    return lambda request: model(request)  # a new object per fixture instance
"""


@XDIST
@pytest.mark.parametrize("scope", ["function", "module", "session"])
def test_a_model_of_any_scope_is_called_once_per_item(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, scope: str, xdist: list[str]
) -> None:
    calls = pytester.path / "calls.txt"
    monkeypatch.setenv("CALLS_FILE", str(calls))
    pytester.makeconftest(SCOPED_CONFTEST.replace("{SCOPE}", scope))
    test = "def test_mine(gsm8k_outcome):\n    assert gsm8k_outcome\n"
    pytester.makepyfile(test_a=test, test_b=test)  # two modules: module scope makes two models
    result = pytester.runpytest(
        *xdist,
        "--gsm8k-limit=10",
        "--gsm8k-concurrency=4",
        *NO_EXTRA_PLUGINS,
        "-W",
        "default",
    )
    assert result.ret == 0, output(result)
    ids = calls.read_text().split()
    # 20 items over 10 problems: in one process a session-scoped model answers each problem
    # once for both modules; a narrower one is called for each item, once (not once per
    # item per engine). Under xdist a user's model is asked per item, as xdist hands the
    # items out: at most once per item, so the two modules' items of a problem that land on
    # two workers may each ask it (the run's shared cache spares the second when it can).
    assert len(set(ids)) == 10, ids
    if scope == "session" and not xdist:
        assert all(ids.count(i) == 1 for i in ids), ids
    elif scope == "session":
        assert all(1 <= ids.count(i) <= 2 for i in ids), ids
    else:
        assert all(ids.count(i) == 2 for i in ids), ids
    said = "not session-scoped" in output(result)
    assert said == (scope != "session"), output(result)


#: a conftest's gsm8k_model that hands on the plugin's own client (to add a marker, say)
PASS_THROUGH = """
import pytest

@pytest.fixture(scope="{SCOPE}")
def gsm8k_model(gsm8k_model):
    return gsm8k_model
"""


@XDIST
@pytest.mark.parametrize("scope", ["function", "session"])
def test_the_plugins_own_client_handed_on_by_a_conftest_asks_each_problem_once(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    scope: str,
    xdist: list[str],
) -> None:
    """docs/design.md: under xdist no request is sent twice. A conftest that returns the
    plugin's own client from its ``gsm8k_model`` (any scope) hands on that very client: its
    items read the controller's answers, as without the conftest (each worker once
    prefetched every problem itself: 40 requests for 20 problems at -n 2)."""
    pytester.makeconftest(PASS_THROUGH.replace("{SCOPE}", scope))
    result = pytester.runpytest(
        *gsm8k_args, *xdist, "--gsm8k-limit=20", "--gsm8k-no-cache", "--gsm8k-report=r.json"
    )
    assert result.ret == 0, output(result)
    assert report(pytester)["counts"]["correct"] == 20
    assert sent(server) == 20
    assert set(server.stats()["requests_by_index"].values()) == {1}
    assert "not session-scoped" not in output(result)  # its own client: nothing to warn of


#: a conftest's own gsm8k_protocol: equal to the plugin's, but another object
EQUAL_PROTOCOL = """
import dataclasses
import pytest
from pytest_gsm8k.session import get_session

@pytest.fixture(scope="session")
def gsm8k_protocol(pytestconfig):
    return dataclasses.replace(get_session(pytestconfig).plan.protocol)
"""


@XDIST
def test_a_protocol_equal_to_the_plans_asks_each_problem_once(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    """docs/design.md: under xdist no request is sent twice. A user's own test beside the
    built-in one, given a ``gsm8k_protocol`` equal to the plan's (another object), reads the
    controller's answers as the built-in test does: protocols compare by value (at -n 2 its
    workers once asked their problems again: 26 to 32 requests for 20 problems)."""
    pytester.makeconftest(EQUAL_PROTOCOL)
    pytester.makepyfile(test_mine="def test_mine(gsm8k_outcome):\n    assert gsm8k_outcome\n")
    result = pytester.runpytest(
        *gsm8k_args, *xdist, "--gsm8k-limit=20", "--gsm8k-no-cache", "--gsm8k-report=r.json"
    )
    assert result.ret == 0, output(result)
    assert report(pytester)["counts"]["correct"] == 20
    assert sent(server) == 20
    assert set(server.stats()["requests_by_index"].values()) == {1}


#: a conftest's own protocol that asks differently (a system line of its own) while its
#: ``__eq__`` calls it equal to the plugin's (it compares the fields a baseline compares)
OWN_REQUESTS_EQUAL_FIELDS = """
import dataclasses
import pytest
from pytest_gsm8k import Protocol
from pytest_gsm8k.session import get_session

class Careful(Protocol):
    def request(self, problem):
        asked = super().request(problem)
        return dataclasses.replace(asked, messages=(("system", "Be careful."), *asked.messages))

    def __eq__(self, other):
        return self.identity() == other.identity()

    __hash__ = Protocol.__hash__

@pytest.fixture(scope="session")
def gsm8k_protocol(pytestconfig):
    plan = get_session(pytestconfig).plan.protocol
    return Careful(**{f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)})
"""


@XDIST
def test_a_protocol_of_another_class_asks_its_own_requests(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    """A conftest's ``gsm8k_protocol`` (the built-in test's too) is asked as it asks, plain
    and under -n 2 alike: only a Protocol of the plan's own class that equals it reads the
    controller's answers, never a subclass whose ``request`` differs, whatever its ``__eq__``
    says (under -n 2 every item read the plan's answers: 20 requests without its system line,
    the gate measured a protocol the run was not given)."""
    server.record = True
    pytester.makeconftest(OWN_REQUESTS_EQUAL_FIELDS)
    result = pytester.runpytest(*gsm8k_args, *xdist, "--gsm8k-limit=20", "--gsm8k-no-cache")
    assert result.ret == 0, output(result)
    bodies = server.stats()["bodies"]
    assert len(bodies) == 20
    assert {json.dumps(body["messages"][0]) for body in bodies} == {
        json.dumps({"role": "system", "content": "Be careful."})
    }


def _session_processes(sid: int) -> list[int]:
    """Live (non-zombie) processes of session ``sid`` (Linux /proc)."""
    alive = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] != "Z" and int(fields[3]) == sid:  # state, ..., session id
            alive.append(int(entry.name))
    return alive


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_sigkill_of_the_xdist_controller_leaves_no_process_and_a_rerun_sends_the_rest(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    server.set_script(Script(latency=0.05))
    cache = pytester.path / "cache"
    run = [
        *gsm8k_args,
        "-n",
        "2",
        "--gsm8k-limit=120",
        "--gsm8k-concurrency=4",
        f"--gsm8k-cache-dir={cache}",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest", *run],
        cwd=pytester.path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: len(list(cache.glob("responses/*/*.json"))) >= 20, 60)
        os.kill(proc.pid, signal.SIGKILL)  # the controller alone, as the OOM killer would
        proc.wait()
        wait_until(lambda: not _session_processes(proc.pid), 10, interval=0.05)
        left = _session_processes(proc.pid)
    finally:
        for pid in _session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived the controller by 10 s: {left}"
    time.sleep(0.3)  # answers in flight at the kill may still land on the server
    kept = len(list(cache.glob("responses/*/*.json")))
    assert 20 <= kept < 120
    assert kept <= sent(server) < 120
    server.reset()
    result = pytester.runpytest(*run, "--gsm8k-resume", "--gsm8k-report=r.json")
    assert result.ret == 0, output(result)
    assert sent(server) == 120 - kept  # only the missing ones
    assert set(server.stats()["requests_by_index"].values()) == {1}
    # (test_engine_runs.py's rerun after a SIGKILL, under -n 2)
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["counts"]["correct"] == 120
    assert report["from_cache"] == kept
    result.stdout.fnmatch_lines([f"*answers from cache: {kept} of 120*"])
