"""Installed but unused, the plugin changes nothing in a pytest session: no SIGTERM handler,
no log-record factory, no temp folder; with GSM8K work it installs the first two.

Issue 34 #4: and it costs little. pytest imports ``pytest_gsm8k.plugin`` (and the package)
in every session of every repository it is installed in: that import, and a session with no
GSM8K work, load the option table and the fixtures' definitions and nothing else of the
package, and none of the libraries only a GSM8K run needs
(benchmarks/bench_installed.py measures the time; these pin what is imported)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_EXTRA_PLUGINS, XDIST, GsmRun, output, xdist_once

PROBE = """
import glob, logging, os, signal, tempfile

def test_probe():
    with open(os.environ["PROBE_OUT"], "w") as out:
        out.write(repr(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL) + "\\n")
        out.write(repr(logging.getLogRecordFactory() is logging.LogRecord) + "\\n")
"""


def _tmp_runs(tmp: str) -> set[str]:
    import glob

    return set(glob.glob(f"{tmp}/gsm8k-run-*"))


def test_a_gsm8k_run_installs_them(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, server: FakeOpenAIServer
) -> None:
    """The probe can see the difference: with --gsm8k-model both are installed."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-1234567890")
    monkeypatch.setenv("PROBE_OUT", str(pytester.path / "probe.txt"))
    pytester.makepyfile(test_probe=PROBE)
    result = pytester.runpytest_subprocess(
        *NO_EXTRA_PLUGINS,
        "--gsm8k-model=fake-model",
        f"--gsm8k-base-url={server.base_url}",
        "--gsm8k-limit=2",
    )
    assert result.ret == 0, output(result)
    handler_default, factory_default = (pytester.path / "probe.txt").read_text().split()
    assert handler_default == "False"
    assert factory_default == "False"


#: what importing the plugin may load of the package: the option table (settings, with the
#: JSON depth check it uses) and the fixtures pytest registers from the plugin module
PLUGIN_IMPORTS = [
    "pytest_gsm8k",
    "pytest_gsm8k.core",
    "pytest_gsm8k.core.jsontext",
    "pytest_gsm8k.core.settings",
    "pytest_gsm8k.fixtures",
    "pytest_gsm8k.plugin",
]
#: libraries a session without GSM8K work has no use for
HEAVY = ("openai", "httpx", "aiohttp", "yaml", "statistics", "asyncio", "ssl", "datasets")


def _new_modules(code: str) -> list[str]:
    """The modules ``code`` imports in a fresh interpreter that has imported pytest."""
    probe = (
        "import json, sys, pytest\n"
        "before = set(sys.modules)\n"
        f"{code}\n"
        "print(json.dumps(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return list(json.loads(out.stdout))


def test_importing_the_plugin_loads_only_the_options_and_fixtures() -> None:
    new = _new_modules("import pytest_gsm8k.plugin")
    assert [m for m in new if m.startswith("pytest_gsm8k")] == PLUGIN_IMPORTS
    assert [m for m in new if m.split(".")[0] in HEAVY] == []


def test_the_package_exports_its_names_when_asked() -> None:
    """``from pytest_gsm8k import Request`` (README, the examples) still works; importing
    the package alone loads nothing else of it."""
    assert _new_modules("import pytest_gsm8k") == ["pytest_gsm8k"]
    new = _new_modules(
        "import pytest_gsm8k\n"
        "from pytest_gsm8k import GSM8KOutcome, Request\n"
        "assert Request.__module__ == 'pytest_gsm8k.core.types'\n"
        "assert GSM8KOutcome.__module__ == 'pytest_gsm8k.fixtures'\n"
        "for name in pytest_gsm8k.__all__:\n"
        "    getattr(pytest_gsm8k, name)"
    )
    assert "pytest_gsm8k.core.prompts" in new


#: writes, once pytest is done, which modules the session loaded
MODULES_PROBE = """
import json, os, sys

def pytest_unconfigure(config):
    loaded = sorted(sys.modules)
    process = getattr(config, "workerinput", {}).get("workerid", "main")
    with open(os.environ["PROBE_OUT"] + "." + process, "w") as out:
        json.dump(loaded, out)
"""


#: README's "In your repository" ini: the model stays on the command line
README_INI = """
[pytest]
gsm8k_base_url = http://127.0.0.1:8000/v1
gsm8k_min_acc = 0.85
gsm8k_require_baseline = true
"""


@xdist_once("ini", [README_INI, ""], ids=["readme-ini", "no-ini"])
def test_a_session_without_gsm8k_work_is_left_alone_and_loads_only_the_options(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ini: str, xdist: list[str]
) -> None:
    """A session with no gsm8k option on the command line and no GSM8K item (ini values as
    README sets them or none) is left alone: no SIGTERM handler, no log-record factory, no
    temp folder, in the process that runs the tests (a worker under -n 2).

    Issue 34 #4: and a suite that never uses the plugin does not pay for it: each process
    (an xdist controller and its workers too) imports the option table, the fixtures'
    definitions, and its role plugin, and no more of the package (no session, no plan, no
    engine): the role's hooks return before they need any of it."""
    tmp = pytester.path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-1234567890")
    monkeypatch.setenv("PROBE_OUT", str(pytester.path / "probe"))
    if ini:
        pytester.makeini(ini)
    pytester.makeconftest(MODULES_PROBE)
    pytester.makepyfile(test_probe=PROBE)
    result = pytester.runpytest_subprocess(*NO_EXTRA_PLUGINS, "-p", "no:cacheprovider", *xdist)
    assert result.ret == 0, output(result)
    handler_default, factory_default = (pytester.path / "probe").read_text().split()
    assert handler_default == "True"
    assert factory_default == "True"
    assert not _tmp_runs(str(tmp))
    probes = sorted(pytester.path.glob("probe.*"))
    assert [p.suffix for p in probes] == ([".gw0", ".gw1", ".main"] if xdist else [".main"])
    for probe in probes:
        loaded = [m for m in json.loads(probe.read_text()) if m.startswith("pytest_gsm8k")]
        assert loaded == sorted([*PLUGIN_IMPORTS, "pytest_gsm8k.roles"])


OWN_MODEL = """
import pytest

@pytest.fixture(scope="session")
def gsm8k_model():
    return lambda request: "#### 0"
"""


@XDIST
def test_a_users_own_test_with_no_option_is_still_measured(
    pytester: pytest.Pytester, xdist: list[str]
) -> None:
    """The State made on first use: a test that takes gsm8k_outcome, with the model from a
    conftest and no gsm8k option or ini key, is GSM8K work all the same (the summary and the
    gate, plain and under xdist, where the controller collects nothing)."""
    pytester.makeconftest(OWN_MODEL)
    pytester.makepyfile(test_own="def test_mine(gsm8k_outcome):\n    assert gsm8k_outcome\n")
    result = pytester.runpytest_subprocess(
        *NO_EXTRA_PLUGINS, "-p", "no:cacheprovider", "-k", "test-0001 or test-0002", *xdist
    )
    assert result.ret == 0, output(result)
    result.stdout.fnmatch_lines(["gsm8k acc (test@1, 0-shot CoT) = 0.0000 * n=2", "*2 wrong*"])
    # it needs no option either (test_newcomer_errors.py: a user's test without a model)
    assert "gsm8k: no model given" not in output(result), output(result)


#: what an xdist worker of a GSM8K run has no use for: it collects the plan's problems and
#: follows the controller's answers; the engine and its event loop, the cache, the servers
#: (serve, local; ctypes), the configs (yaml), the verdict, the report and its outputs are
#: the controller's
NOT_IN_A_WORKER = (
    *(
        f"pytest_gsm8k.{m}"
        for m in ("reporting", "core.render", "core.verdict", "core.html_report")
    ),
    *(
        f"pytest_gsm8k.runtime.{m}"
        for m in ("engine", "cache", "matrix", "serve", "local", "finish")
    ),
    "pytest_gsm8k.core.vllm_config",
    "pytest_gsm8k.runtime.configs",
    *("openai", "httpx", "aiohttp", "yaml", "datasets", "asyncio", "ctypes"),
)


def test_an_xdist_worker_of_a_gsm8k_run_imports_only_what_a_worker_does(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, gsm8k_run: GsmRun
) -> None:
    """Issue 33: a suite starts hundreds of workers, each paying for its imports. A worker of
    a GSM8K run imports none of the controller's rooms or libraries; the controller does
    (so the probe can see them)."""
    monkeypatch.setenv("PROBE_OUT", str(pytester.path / "probe"))
    pytester.makeconftest(MODULES_PROBE)
    gsm8k_run("--gsm8k-limit=4", "--gsm8k-no-cache", report=None, xdist=["-n", "2"])
    loaded = {p.suffix: json.loads(p.read_text()) for p in pytester.path.glob("probe.*")}
    assert sorted(loaded) == [".gw0", ".gw1", ".main"]
    assert "pytest_gsm8k.runtime.engine" in loaded.pop(".main")
    for worker, modules in loaded.items():
        tops = {m.split(".")[0] for m in modules}
        assert [m for m in NOT_IN_A_WORKER if m in modules or m in tops] == [], worker


@XDIST
def test_the_vllm_presets_failures_are_said_without_importing_openai(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    """The vllm preset's client never imports openai (its import costs the preset its speed:
    benchmarks/README.md, "One HTTP stack?"), not even to word a failure: a reply without an
    answer, a null content, an HTTP 500 (describe_error imported openai for the first two),
    plain and in the xdist controller that fetches."""
    server.set_script(Script(behaviours={0: "nochoices", 1: "nullcontent", 2: "error500"}))
    monkeypatch.setenv("PROBE_OUT", str(pytester.path / "probe"))
    pytester.makeconftest(MODULES_PROBE)
    args = ["--gsm8k-preset=vllm", "--gsm8k-limit=4", "--gsm8k-no-cache", "--gsm8k-max-retries=0"]
    result = pytester.runpytest_subprocess(*gsm8k_args, *args, *xdist)
    assert result.ret == 1, output(result)
    for said in ("has no choices (an empty list)", "has no answer (", "HTTP 500 after retries"):
        assert said in output(result), said
    assert "openai" not in json.loads((pytester.path / "probe.main").read_text())


def test_a_plain_run_the_endpoint_stopped_imports_no_xdist(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, server: FakeOpenAIServer
) -> None:
    """A run without xdist (here ``-p no:xdist``) never imports xdist's controller, not on
    the path of an endpoint failure that stops the run either: only an xdist controller asks
    whether a worker's stop is xdist's Interrupted (a plain run's 'aborted', kept in the
    role's stops since issue 33's economy pass, imported xdist.dsession there)."""
    server.set_script(Script(v1_only=True))  # every request a 404: the run stops at the first
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-1234567890")
    monkeypatch.setenv("PROBE_OUT", str(pytester.path / "probe"))
    pytester.makeconftest(MODULES_PROBE)
    base = server.base_url.removesuffix("/v1") + "/api"
    result = pytester.runpytest_subprocess(
        *NO_EXTRA_PLUGINS, "-p", "no:xdist", "--gsm8k-model=m", f"--gsm8k-base-url={base}"
    )
    assert result.ret == 1, output(result)
    assert output(result).count("gsm8k: run stopped:") == 1, output(result)
    loaded = json.loads((pytester.path / "probe.main").read_text())
    assert [m for m in loaded if m.startswith("xdist.dsession")] == []
