"""What many test files need to read a pytester run and the scripted server: one copy.

Fixtures live in conftest.py; these are plain functions (and the xdist
parametrization) that tests import by name.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, overload

import pytest
import yaml
from fakeserver import FakeOpenAIServer, Script

from pytest_gsm8k.runtime.cache import ResponseCache

#: the tests folder (shared helpers, the fake server, recorded data) and the repository above it
TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
#: the scripted server as a program (``python fakeserver.py ...``), for serve commands
FAKESERVER = TESTS / "fakeserver.py"
#: what lm-evaluation-harness sent and scored, recorded by data/record_lm_eval.py
LM_EVAL_RECORDING = TESTS / "data" / "lm_eval_requests.json"
#: what vLLM's gsm8k_eval.py sent (the bytes) and scored, recorded by data/record_vllm.py
VLLM_RECORDING = TESTS / "data" / "vllm_requests.json"

#: README's example workflow (step 5 of "In your repository")
WORKFLOW = REPO / "examples" / "github" / "gsm8k-gate.yml"

#: the API key the fake servers accept (conftest's ``server``, ``keyed_env``)
TEST_KEY = "sk-test-SECRET-1234567890"

#: Plugins an inner pytest run never loads, whatever the environment has installed:
#: pytest-randomly would reorder the items (tests read outcomes in run order), hypothesis's
#: plugin imports hypothesis at the end of every run (time only), pytest-benchmark warns
#: under xdist, anyio's (installed with openai) imports anyio in every interpreter a run
#: starts (an empty -n 2 run: 1.2 CPU-s with it, 0.85 without). Every run a test starts
#: passes these (``gsm8k_args`` includes them).
NO_EXTRA_PLUGINS = tuple(
    word
    for name in ("randomly", "hypothesispytest", "benchmark", "anyio")
    for word in ("-p", f"no:{name}")
)
#: pytest's cache plugin off as well: the run has no .pytest_cache folder to write into
NO_CACHEPROVIDER = ("-p", "no:cacheprovider")


class GsmRun(Protocol):
    """The ``gsm8k_run`` fixture's call: one inner pytest run, its exit code asserted."""

    @overload
    def __call__(
        self,
        *args: str,
        ret: int | None = 0,
        report: str = "r.json",
        model: bool = True,
        xdist: Sequence[str] | None = None,
    ) -> tuple[pytest.RunResult, dict[str, Any]]: ...

    @overload
    def __call__(
        self,
        *args: str,
        ret: int | None = 0,
        report: None,
        model: bool = True,
        xdist: Sequence[str] | None = None,
    ) -> tuple[pytest.RunResult, None]: ...


#: run a pytester test twice: in one process, and under pytest-xdist with two workers
XDIST = pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "xdist"])


def xdist_once(argnames: str, values: Sequence[Any], ids: Sequence[str]) -> pytest.MarkDecorator:
    """Parametrize ``argnames`` over ``values`` plain, and the first value under -n 2 too
    (``xdist`` as ``XDIST`` gives it): what the values vary (an API, a protocol, where an
    option came from) does not cross processes, and an inner -n 2 run costs 2-5 CPU-s."""
    one = "," not in argnames
    cases: list[tuple[Any, list[str], str]] = [
        (v, [], f"{i}-plain") for v, i in zip(values, ids, strict=True)
    ]
    cases.insert(1, (values[0], ["-n", "2"], f"{ids[0]}-xdist"))
    params = [pytest.param(*((v,) if one else v), x, id=i) for v, x, i in cases]
    return pytest.mark.parametrize(f"{argnames},xdist", params)


#: a user's own test of the same problems beside the built-in one; ``{model}``: its module's
#: own ``gsm8k_model`` (a callable that answers 0, wrong), or none (the plugin's client)
OWN_TEST = """\
import pytest
{model}
def test_mine(gsm8k_outcome):
    assert gsm8k_outcome.outcome in ("correct", "wrong")
"""
ANSWERS_ZERO = """
@pytest.fixture(scope="session")
def gsm8k_model():
    return lambda request: "#### 0"
"""


def use_proxy(monkeypatch: pytest.MonkeyPatch, name: str, url: str) -> None:
    """The environment names only ``url`` as its proxy, in variable ``name`` (``HTTP_PROXY``,
    ``ALL_PROXY``): the machine's own proxy variables are set aside for the test."""
    for other in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "NO_PROXY", "HTTP_PROXY"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(name, url)


def spawn_pytest(pytester: pytest.Pytester, *args: str, **popen: Any) -> subprocess.Popen[str]:
    """pytest in a process of its own in pytester's folder (a signal or a kill reaches it
    alone), its temporary files under that folder (a kill leaves them behind), its output
    unbuffered and merged, its threads' stacks written there on SIGABRT (``output_of``);
    ``popen`` overrides (``stdout=subprocess.DEVNULL``, ``start_new_session=True``)."""
    (tmp := pytester.path / "tmp").mkdir(exist_ok=True)
    options: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, **popen}
    env = {"TMPDIR": str(tmp), "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", *args],
        cwd=pytester.path,
        text=True,
        env={**os.environ, **env},
        **options,
    )


def output_of(proc: subprocess.Popen[str], timeout: float) -> str:
    """The output of a ``spawn_pytest`` run once it ends, within ``timeout`` s; else the test
    fails with its output and where each of its threads stands (faulthandler's dump on
    SIGABRT), not with a ``TimeoutExpired`` that loses both."""
    try:
        return proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        try:
            out = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
        pytest.fail(f"still running {timeout:g} s later; then SIGABRT:\n{out}")


#: the files of each set-up run ``made_once`` ran in this process, by key
_MADE: dict[str, dict[str, bytes]] = {}


def made_once(
    key: str, folder: Path, names: Sequence[str | Path], make: Callable[[], object]
) -> bool:
    """The files ``names`` (relative to ``folder``) that a set-up run, ``make()``, writes: made
    by the first test of this process that asks for ``key``, copied into a later test's
    ``folder``. For a set-up whose only product is those files (a baseline, a report): it
    runs once per process, not once per test. True when ``make()`` ran here. The key is
    the calling file's own: two files that pick the same words never share a set-up."""
    key = f"{sys._getframe(1).f_code.co_filename}::{key}"
    if key not in _MADE:
        make()
        _MADE[key] = {str(name): (folder / name).read_bytes() for name in names}
        return True
    for name, data in _MADE[key].items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    return False


def processes_in(folder: Path) -> list[int]:
    """Processes whose working directory is ``folder`` (Linux /proc): a pytest run's own, and
    the servers and workers it started there (none may outlive a cancelled run)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if Path(os.readlink(entry / "cwd")) == folder:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.01) -> bool:
    """Call ``predicate`` every ``interval`` seconds until it returns something true or
    ``timeout`` seconds have passed, and say whether it did.

    A bound on a wait for something another thread or process does, never a timing
    assertion: the caller asserts the result, or what it waited for, itself.
    """
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def output(result: pytest.RunResult) -> str:
    """Everything a pytester run printed, stdout then stderr."""
    return result.stdout.str() + "\n" + result.stderr.str()


def sent(server: FakeOpenAIServer) -> int:
    """Completion requests (chat and plain) the server received since its last reset."""
    by_path = server.stats()["requests_by_path"]
    return int(by_path.get("/v1/chat/completions", 0) + by_path.get("/v1/completions", 0))


def read_json(path: Path) -> dict[str, Any]:
    """A JSON report (or any JSON file) as a dict."""
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def report(pytester: pytest.Pytester, name: str = "r.json") -> dict[str, Any]:
    """The JSON report a pytester run wrote into its folder (``--gsm8k-report=r.json``)."""
    return read_json(pytester.path / name)


#: the password in the base URL of :func:`server_behind_a_password`
URL_PASSWORD = "hunter2-PASSWORD-42"
#: the same credentials as the Authorization header carries them (HTTP Basic)
URL_BASIC = base64.b64encode(f"alice:{URL_PASSWORD}".encode()).decode()


@contextlib.contextmanager
def server_behind_a_password(
    data: Path, monkeypatch: pytest.MonkeyPatch, script: Script
) -> Iterator[tuple[FakeOpenAIServer, str]]:
    """A fake server running ``script`` (with ``echo_auth``, it sends the credentials
    back) and a base URL that carries user alice's password; no key or base URL comes
    from the environment, so the URL's credentials are the only secret of the run."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with FakeOpenAIServer(data / "test.jsonl", model="fake-model") as srv:
        srv.set_script(script)
        yield srv, f"http://alice:{URL_PASSWORD}@127.0.0.1:{srv.port}/v1"


def config_serve(data: Path, *extra: str) -> str:
    """A ``--gsm8k-serve`` line that starts the fake server for each --gsm8k-config config:
    the config's model, ``extra`` flags, then the config's ``{server_args}`` as words (the
    fake server takes vLLM's flags it does not know: ``--accept-unknown``)."""
    words = [
        sys.executable,
        str(FAKESERVER),
        "--data",
        str(data / "test.jsonl"),
        "--port",
        "{port}",
        "--model",
        "{model}",
        *extra,
        "--accept-unknown",
    ]
    return " ".join(shlex.quote(w) for w in words) + " {server_args}"


def job_command(job: str, marker: str, env: dict[str, str] | None = None) -> list[str]:
    """A job of README's example workflow: its pytest command (its one step whose script
    holds ``marker``), split as a shell would, ``$NAME`` taken from ``env`` (the job's own
    ``env:`` first)."""
    workflow = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    runs = [
        str(step["run"])
        for step in workflow["jobs"][job]["steps"]
        if marker in str(step.get("run", ""))
    ]
    assert len(runs) == 1
    values = {**workflow["jobs"][job].get("env", {}), **(env or {})}
    argv = [re.sub(r"\$(\w+)", lambda m: values[m.group(1)], a) for a in shlex.split(runs[0])]
    assert argv[:3] == ["python", "-m", "pytest"]
    return argv


#: a conftest for a stopped run under xdist: each worker writes its exit status as its session
#: ends, to ``<worker id>.end`` beside it. When xdist stops the workers, execnet gives one
#: still busy 5 s, then interrupts it (a SIGINT: exit status 2, INTERRUPTED); a worker that
#: ended otherwise did not wait out that grace, whatever the machine's load (a wall-clock bound
#: on the run failed under the test suite's own load). A SIGINT (execnet's, a test's Ctrl-C)
#: reaches every process of the run as it would a terminal's foreground job, also when the
#: test suite was started in the background (``pytest &`` in a script: SIGINT ignored, in every
#: process it starts too: a Ctrl-C test waited out its 60 s, the workers ended unseen).
WORKER_ENDS = """
import signal
from pathlib import Path

signal.signal(signal.SIGINT, signal.default_int_handler)

def pytest_sessionfinish(session, exitstatus):
    if (worker := getattr(session.config, "workerinput", None)) is not None:
        Path(__file__).with_name(worker["workerid"] + ".end").write_text(str(int(exitstatus)))
"""


def worker_ends(folder: Path) -> dict[str, int]:
    """What the workers of a run with ``WORKER_ENDS`` in ``folder`` wrote: id -> exit status."""
    return {path.stem: int(path.read_text()) for path in folder.glob("*.end")}


def response_cache(
    root: Path,
    run: str,
    *,
    persistent: bool = True,
    resume: bool = False,
    started: float | None = None,
) -> ResponseCache:
    """A cache as the plugin opens one (session.py): kept, this run's entries only, the run
    started now (``started``: then)."""
    when = time.time() if started is None else started
    return ResponseCache(root, run, persistent=persistent, resume=resume, started=when)
