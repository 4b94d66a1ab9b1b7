"""Installed but unused, the plugin changes nothing in a pytest session: no SIGTERM handler,
no log-record factory, no temp folder; with GSM8K work it installs the first two."""

from __future__ import annotations

import pytest
from fakeserver import FakeOpenAIServer
from helpers import NO_EXTRA_PLUGINS, XDIST, output

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


@XDIST
def test_a_session_without_gsm8k_work_is_left_alone(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, xdist: list[str]
) -> None:
    tmp = pytester.path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-SECRET-1234567890")
    monkeypatch.setenv("PROBE_OUT", str(pytester.path / "probe.txt"))
    pytester.makepyfile(test_probe=PROBE)
    result = pytester.runpytest_subprocess(*NO_EXTRA_PLUGINS, *xdist)
    assert result.ret == 0, output(result)
    handler_default, factory_default = (pytester.path / "probe.txt").read_text().split()
    assert handler_default == "True"
    assert factory_default == "True"
    assert not _tmp_runs(str(tmp))


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
