"""What pytest's own reporters (the terminal, JUnit XML, any other plugin) see of a GSM8K
run beyond the reports of the items that ran; a plugin the aggregating role registers once
its session exists: one report per item a stopped run never
reached (so that pytest's final line counts what the headline counts), each gate as a JUnit
test case (CI dashboards read JUnit: a failed gate with ``failures="0"`` would show green),
the gsm8k block of the terminal summary, and the progress line in place of the dots.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import pytest

from pytest_gsm8k import ROLE_NAME
from pytest_gsm8k.core.progress import Progress
from pytest_gsm8k.core.records import OUTCOMES, ProblemRecord
from pytest_gsm8k.session import Gsm8kSession, get_session

if TYPE_CHECKING:
    from pytest_gsm8k.core.verdict import RunVerdict

#: the node id under which the gates appear (JUnit: classname ``gsm8k.gates``)
GATES_NODEID = "gsm8k::gates"
LETTERS = {"correct": ".", "wrong": "w", "unparsed": "u", "truncated": "t"}
#: seconds between two drawings of the progress line: on a terminal, and into a log (one
#: line each, not a rewrite, and few enough that an hour's run stays readable)
PROGRESS_INTERVAL = 0.5
LOG_PROGRESS_INTERVAL = 10.0


def report_unfinished(state: Gsm8kSession, late: Mapping[str, ProblemRecord]) -> None:
    """After a stopped run's loop, one report per item no report came for, through pytest's
    hooks (the terminal's counts and progress, JUnit, other plugins). After an endpoint
    failure (the shared message, said once) an item whose answer had arrived (``late``) is
    that answer's outcome; every other item, and every item after an early stop, is skipped
    as not run (the summary counts such problems as errors "not reached"). Marked
    ``gsm8k_unfinished``: the plugin's own tally skips them."""
    run, hook = state.run, state.config.hook
    if run.aborted is None and run.early_stopped is None:
        return
    problems = {p.id: p for p in state.plan.problems}
    reason = run.aborted or (run.early_stopped or "").removeprefix("gsm8k: ")
    for ref in run.unreported():
        problem = problems.get(run.problem_of.get(ref.nodeid, ""))
        record = late.get(problem.id) if problem is not None and run.aborted is not None else None
        outcome: Literal["passed", "failed", "skipped"]
        when: Literal["setup", "call"]
        if record is not None:
            error = record["outcome"] == "error"
            outcome, when = ("failed", "setup") if error else ("passed", "call")
            how: dict[str, Any] = {"gsm8k": record}
            longrepr: Any = f"gsm8k: {record['error']}" if error else None
        else:
            path, lineno, _ = ref.location
            outcome, when, how = "skipped", "setup", {}
            longrepr = (path, (lineno or 0) + 1, f"Skipped: gsm8k: not run: {reason}")
        report = pytest.TestReport(
            ref.nodeid, ref.location, {}, outcome, longrepr, when, gsm8k_unfinished=True, **how
        )
        hook.pytest_runtest_logstart(nodeid=ref.nodeid, location=ref.location)
        hook.pytest_runtest_logreport(report=report)
        hook.pytest_runtest_logfinish(nodeid=ref.nodeid, location=ref.location)


def gate_reports(verdict: RunVerdict) -> list[pytest.TestReport]:
    """Each gate as a test's call and teardown reports (core/render.junit_cases: skipped when
    undecided, never passed); with --gsm8k-resume the teardown carries the property
    ``answers_from_earlier_runs``, since a passed test case shows no detail."""
    from pytest_gsm8k.core.render import junit_cases

    out: list[pytest.TestReport] = []
    for case in junit_cases(verdict):
        nodeid = f"{GATES_NODEID}::{case.name}"
        location = (GATES_NODEID.partition("::")[0], None, f"gates::{case.name}")
        detail: str | tuple[str, int, str] | None = case.message
        if case.outcome == "skipped" and case.message is not None:  # pytest's skip shape
            detail = (location[0], 0, case.message)
        properties = [("answers_from_earlier_runs", case.earlier)] if case.earlier else []
        out += [
            pytest.TestReport(nodeid, location, {}, case.outcome, detail, "call"),
            pytest.TestReport(
                nodeid, location, {}, "passed", None, "teardown", user_properties=properties
            ),
        ]
    return out


def pytest_report_teststatus(
    report: pytest.TestReport, config: pytest.Config
) -> tuple[str, str, str | tuple[str, dict[str, bool]]] | None:
    """A GSM8K outcome's own letter and word; with the progress line, no letter for a GSM8K
    item at all (the line counts them)."""
    progress = getattr(config.pluginmanager.get_plugin(ROLE_NAME), "progress", None)
    record = getattr(report, "gsm8k", None)
    if report.when == "call" and report.passed and isinstance(record, dict):
        outcome = str(record["outcome"])
        if progress:
            return outcome, "", ""
        letter = LETTERS.get(outcome, ".")
        return outcome, letter, (outcome.upper(), {"green" if letter == "." else "yellow": True})
    ours = isinstance(record, dict) or getattr(report, "gsm8k_unfinished", False)
    if progress and ours and report.when == "setup" and not report.passed:
        return ("error" if report.failed else "skipped"), "", ""
    return None


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The gsm8k block of the terminal summary: the notes no test issued, the verdict, what
    stopped the run, where the outputs went (or why not)."""
    from pytest_gsm8k.core.render import styled_lines
    from pytest_gsm8k.core.scrub import printable

    state, write = get_session(config), terminalreporter.write_line
    for message in state.notes:
        write(printable(message), yellow=True)
    if state.run.verdict is None:
        return
    terminalreporter.write_sep("=", "gsm8k")
    for line, kind in styled_lines(state.run.verdict):
        write(line, bold=kind == "headline", red=kind == "fail", green=kind == "pass")
    if state.run.aborted:
        write(f"gsm8k: run stopped: {printable(state.run.aborted)}", red=True)
    for message in state.output_errors.values():
        write(printable(message), red=True)
    for key, name in (("report", "report"), ("html", "page"), ("markdown", "markdown")):
        if (path := getattr(state.settings, key)) and key not in state.output_errors:
            write(f"  {name}: {path}")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """The exit code of a failed gate or output; the gates in the JUnit XML, given to
    ``--junitxml``'s writer before it writes the file (only to it: counting them on the
    terminal would change the line that counts the problems)."""
    from _pytest.junitxml import xml_key

    state = get_session(session.config)
    verdict = state.run.verdict
    if verdict is not None and (xml := session.config.stash.get(xml_key, None)) is not None:
        for report in gate_reports(verdict):
            xml.pytest_runtest_logreport(report)
    failed = (verdict is not None and verdict.failed) or bool(state.output_errors)
    if failed and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


class ProgressLine:
    """The progress line on pytest's terminal, rewritten in place (pytest's own way of
    rewriting the current line) at most every PROGRESS_INTERVAL seconds and at the end. Into
    a log a rewrite is carriage returns on one endless line: there it is a plain line."""

    def __init__(self, reporter: Any) -> None:
        self._reporter = reporter
        self._tty = bool(reporter.isatty())
        self._started = time.monotonic()
        self._drawn_at: float | None = None
        self._drawn_done = -1

    @classmethod
    def wanted(cls, config: pytest.Config, asked: bool | None) -> ProgressLine | None:
        """Asked for (``--gsm8k-progress``), or by default on a terminal (a CI log gets the
        dots); never with ``-v``, where each item has its own line, nor with ``ini false``."""
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if asked is False or config.get_verbosity() > 0 or reporter is None:
            return None
        return cls(reporter) if asked or reporter.isatty() else None

    def draw(self, state: Gsm8kSession, final: bool = False) -> None:
        now, every = time.monotonic(), PROGRESS_INTERVAL if self._tty else LOG_PROGRESS_INTERVAL
        if not final and self._drawn_at is not None and now - self._drawn_at < every:
            return
        state.learn_plans()
        records, total = state.run.records, len(state.run.collected_ids or ())
        if total <= 0:
            return
        self._drawn_at = now
        counter = Counter(r["outcome"] for r in records.values())
        line = Progress(len(records), total, now - self._started, {o: counter[o] for o in OUTCOMES})
        if self._tty:
            self._reporter.rewrite(line.line(), erase=True)
        elif len(records) != self._drawn_done:  # a log: no line twice
            self._reporter.write_line(line.line())
        self._drawn_done = len(records)
