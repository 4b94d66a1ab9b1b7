"""What CI tools and people watching a terminal see of a run beyond the gsm8k section.

* The gates are JUnit XML test cases (``gsm8k.gates`` / ``min-acc``) that fail when the gate
  fails, and the testsuite's counts include them: a dashboard that reads JUnit must not show
  a failed gate as green.
* pytest's final line counts what the headline counts: a run stopped by a dead endpoint or
  by the early stop reports every item it never reached, once.
* The progress line (answered/total, outcomes, rate, ETA) rewrites pytest's current line, on
  a terminal or when asked, and never in a CI log otherwise.

Real runs (pytester, and a subprocess where the raw bytes matter) against the fake server.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_CACHEPROVIDER, XDIST, GsmRun, output, report

#: the words of pytest's final line for the outcomes of the headline
PYTEST_WORDS = {"error": "errors"}


def junit(path: Path) -> tuple[ET.Element, dict[str, ET.Element]]:
    """The testsuite of a JUnit XML file and its gate test cases, by name."""
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    gates = {
        str(case.get("name")): case
        for case in suite.iter("testcase")
        if case.get("classname") == "gsm8k.gates"
    }
    return suite, gates


def pytest_counts(result: pytest.RunResult) -> dict[str, int]:
    """pytest's final line, as the headline's outcome words."""
    parsed = result.parseoutcomes()
    out: dict[str, int] = {}
    for word in ("correct", "wrong", "unparsed", "truncated", "error", "skipped"):
        count = parsed.get(PYTEST_WORDS.get(word, word), 0)
        if count:
            out[word] = count
    return out


def headline_counts(data: dict[str, Any]) -> dict[str, int]:
    return {word: count for word, count in data["counts"].items() if count}


# -- the gates in JUnit XML -------------------------------------------------------------------


def test_a_failed_gate_is_a_failed_junit_test_case(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    server.set_script(Script(default="wrong"))
    result, _ = gsm8k_run(
        "--gsm8k-limit=6",
        "--gsm8k-min-acc=0.5",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "--junitxml=junit.xml",
        ret=1,
        report=None,
    )
    suite, gates = junit(pytester.path / "junit.xml")
    assert set(gates) == {"min-acc"}
    [failure] = gates["min-acc"].findall("failure")
    detail = next(g["detail"] for g in report(pytester)["gates"] if g["name"] == "min-acc")
    assert failure.get("message") == detail
    assert "is below --gsm8k-min-acc 0.5" in detail
    assert int(suite.get("failures", "0")) >= 1
    assert int(suite.get("tests", "0")) == 6 + 1  # the six problems and the gate
    # the terminal's final line is unchanged: it counts the problems (the gate has its line)
    assert pytest_counts(result) == {"wrong": 6}


def test_a_passing_gate_is_a_passing_junit_test_case(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    gsm8k_run(
        "--gsm8k-limit=4",
        "--gsm8k-min-acc=0.5",
        "--gsm8k-no-cache",
        "--junitxml=junit.xml",
        report=None,
    )
    suite, gates = junit(pytester.path / "junit.xml")
    assert set(gates) == {"min-acc"}
    assert list(gates["min-acc"]) == []  # no failure, error or skipped element
    assert suite.get("failures") == "0"
    assert suite.get("errors") == "0"
    assert int(suite.get("tests", "0")) == 4 + 1


def test_a_run_without_gates_adds_no_junit_test_case(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    gsm8k_run("--gsm8k-limit=3", "--gsm8k-no-cache", "--junitxml=junit.xml", report=None)
    suite, gates = junit(pytester.path / "junit.xml")
    assert gates == {}
    assert suite.get("tests") == "3"


# -- pytest's final line agrees with the headline ---------------------------------------------


@XDIST
def test_a_dead_endpoint_leaves_no_item_unaccounted_for(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    server.set_script(Script(latency=0.02))
    server.die_after = 20
    result, _ = gsm8k_run(
        "--gsm8k-limit=80",
        "--gsm8k-concurrency=8",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "--junitxml=junit.xml",
        ret=1,
        report=None,
    )
    data = report(pytester)
    counts = headline_counts(data)
    assert counts["error"] >= 80 - 20 - 8, counts  # the run did stop on the dead endpoint
    assert sum(counts.values()) == 80
    # every problem is accounted for in pytest's line: the errors that were met, and those
    # the run never reached as skipped (quietly), which the headline names as such
    said = pytest_counts(result)
    assert sum(said.values()) == 80, output(result)
    unreached = said.get("skipped", 0)
    assert unreached >= 1
    assert said.get("error", 0) + unreached == counts["error"], output(result)
    assert {k: v for k, v in said.items() if k not in ("error", "skipped")} == {
        k: v for k, v in counts.items() if k != "error"
    }
    text = output(result)
    assert f"{unreached} of the errors were not reached" in text
    suite, _ = junit(pytester.path / "junit.xml")
    assert suite.get("tests") == "80"
    assert int(suite.get("errors", "0")) + int(suite.get("skipped", "0")) == counts["error"]
    assert "Traceback" not in text
    # the failure is said once (the item that met it, the gsm8k section), not once per item
    message = str(next(p["error"] for p in data["problems"] if p["outcome"] == "error"))
    assert sum(message[:40] in line for line in text.splitlines()) <= 8, text


@XDIST
def test_an_early_stop_skips_the_items_it_did_not_run(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    server.set_script(Script(default="wrong"))
    result, _ = gsm8k_run(
        "--gsm8k-limit=300",
        "--gsm8k-min-acc=0.85",
        "--gsm8k-early-stop=certain",
        "--gsm8k-concurrency=4",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "--junitxml=junit.xml",
        ret=1,
        report=None,
    )
    data = report(pytester)
    assert data["early_stop"]["decided_after"] == 46  # more than 0.15 * 300 wrong: FAIL
    counts = pytest_counts(result)
    assert counts.pop("skipped") == 300 - data["n"]
    assert counts == headline_counts(data)
    # every item is in the progress, which ends at 100%
    assert "[100%]" in result.stdout.str()
    suite, gates = junit(pytester.path / "junit.xml")
    assert suite.get("skipped") == str(300 - data["n"])
    assert gates["min-acc"].find("failure") is not None


# -- the progress line ---------------------------------------------------------------------------


def _raw_run(pytester: pytest.Pytester, *args: str) -> str:
    """A run in its own process, its standard output as written (pytester's results split
    lines at carriage returns)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args],
        cwd=pytester.path,
        capture_output=True,
        timeout=300,
        check=False,
    )
    return done.stdout.decode("utf-8", "replace")


def _tty_run(pytester: pytest.Pytester, *args: str) -> str:
    """A run in its own process writing to a terminal (a pseudo-terminal), its output as
    written."""
    main, secondary = pty.openpty()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pytest", *args],
            cwd=pytester.path,
            stdin=subprocess.DEVNULL,
            stdout=secondary,
            stderr=secondary,
        )
    finally:
        os.close(secondary)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(main)
    proc.wait(timeout=300)
    return b"".join(chunks).decode("utf-8", "replace")


@XDIST
def test_the_progress_line_rewrites_the_current_line_on_a_terminal(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    server.set_script(Script(default="wrong"))
    out = _tty_run(
        pytester, *gsm8k_args, *NO_CACHEPROVIDER, *xdist, "--gsm8k-limit=5", "--gsm8k-no-cache"
    )
    plain = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", out)
    assert "\rgsm8k: 5/5 answered (5 wrong)  " in plain, out
    final = plain.rpartition("\rgsm8k: 5/5 answered")[2].splitlines()[0]
    assert "/s  done in " in final
    # the line replaces the dots: no outcome letters, and the final count is pytest's as ever
    assert "wwwww" not in plain
    assert "5 wrong" in plain.splitlines()[-1]


def test_the_progress_asked_for_in_a_log_is_plain_lines(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    """``--gsm8k-progress`` into a file (a CI log): a rewrite there was one line holding
    17 carriage returns. Plain lines, each once, the last one the finished run's."""
    server.set_script(Script(default="wrong"))
    out = _raw_run(
        pytester,
        *gsm8k_args,
        *NO_CACHEPROVIDER,
        "--gsm8k-limit=5",
        "--gsm8k-no-cache",
        "--gsm8k-progress",
    )
    assert "\r" not in out, out
    lines = [line for line in out.splitlines() if line.startswith("gsm8k: ") and "answered" in line]
    assert lines, out
    assert len(lines) == len(set(lines)), out
    assert lines[-1].startswith("gsm8k: 5/5 answered (5 wrong)  "), out
    assert "/s  done in " in lines[-1]
    assert "wwwww" not in out
    assert "5 wrong" in out.splitlines()[-1]


def test_without_a_terminal_the_progress_line_is_off_unless_asked(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    result, _ = gsm8k_run("--gsm8k-limit=5", "--gsm8k-no-cache", report=None)
    assert "answered" not in output(result)
    result.stdout.fnmatch_lines(["gsm8k ..... *[[]100%[]]"])


def test_the_progress_line_leaves_verbose_output_alone(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    """With ``-v`` every item has its own line already: no progress line, even when asked."""
    result, _ = gsm8k_run(
        "-v", "--gsm8k-limit=3", "--gsm8k-no-cache", "--gsm8k-progress", report=None
    )
    assert "answered" not in output(result)
    result.stdout.fnmatch_lines(["*test_gsm8k[[]test-*[]] CORRECT*"])
