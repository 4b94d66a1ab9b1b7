"""What pytest's own reporters (the terminal, JUnit XML, any other plugin) see of a GSM8K
run beyond the reports of the items that ran.

* The items a stopped run never reached get one report each, so that pytest's final
  line counts what the GSM8K headline counts: after an endpoint failure the answers that
  had arrived are their own outcome and the rest are errors (one short line each; the
  failure itself is said once), after an early stop they are skipped as not run.
* Each gate's verdict is a test case in the JUnit XML (``gsm8k.gates`` / ``min-acc``),
  failing with the gate's detail when the gate fails: CI dashboards read JUnit, and a
  failed gate with ``failures="0"`` would show green.
* The progress line: answered/total, outcomes, rate and ETA, rewritten in place of the
  dots (pytest's own way of rewriting the current line), on a terminal unless asked.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

import pytest

from pytest_gsm8k.core.progress import Progress
from pytest_gsm8k.core.records import OUTCOMES, ProblemRecord
from pytest_gsm8k.core.tally import ItemRef
from pytest_gsm8k.core.types import Problem
from pytest_gsm8k.session import Gsm8kSession

if TYPE_CHECKING:
    from pytest_gsm8k.core.verdict import RunVerdict

#: the node id under which the gates appear (JUnit: classname ``gsm8k.gates``)
GATES_NODEID = "gsm8k::gates"
#: the reports this module makes carry this attribute (true): the plugin's own
#: aggregation skips them (the summary already counts what they say)
UNFINISHED = "gsm8k_unfinished"
LETTERS = {
    "correct": (".", {"green": True}),
    "wrong": ("w", {"yellow": True}),
    "unparsed": ("u", {"yellow": True}),
    "truncated": ("t", {"yellow": True}),
}
#: seconds between two drawings of the progress line on a terminal
PROGRESS_INTERVAL = 0.5
#: seconds between two progress lines in a log (not a terminal): one line each, not a
#: rewrite, and few enough that an hour's run stays readable
LOG_PROGRESS_INTERVAL = 10.0


def is_unfinished(report: pytest.TestReport) -> bool:
    return bool(getattr(report, UNFINISHED, False))


def unfinished_report(
    ref: ItemRef,
    *,
    aborted: str | None,
    stopped: str | None,
    problem: Problem | None,
    late: Mapping[str, ProblemRecord],
) -> pytest.TestReport:
    """The one report of an item the run never reached.

    After an endpoint failure (``aborted``, the shared message) a GSM8K item whose answer
    had arrived (``late``) is that answer's outcome; every other item is skipped as not run
    (quietly: the failure is said once; the summary counts such problems as errors "not
    reached"), and so is every item after an early stop (``stopped``).
    """
    if aborted is not None and problem is not None and problem.id in late:
        record = late[problem.id]
        error = record["outcome"] == "error"
        return pytest.TestReport(
            ref.nodeid,
            ref.location,
            {},
            "failed" if error else "passed",
            f"gsm8k: {record['error']}" if error else None,
            "setup" if error else "call",
            gsm8k=record,
            gsm8k_unfinished=True,
        )
    reason = aborted if aborted is not None else (stopped or "").removeprefix("gsm8k: ")
    path, lineno, _ = ref.location
    skipped = (path, (lineno or 0) + 1, f"Skipped: gsm8k: not run: {reason}")
    return pytest.TestReport(
        ref.nodeid, ref.location, {}, "skipped", skipped, "setup", gsm8k_unfinished=True
    )


def report_unfinished(
    config: pytest.Config, state: Gsm8kSession, late: Mapping[str, ProblemRecord]
) -> None:
    """Controller, after a stopped run's loop: one report per item no report came for,
    through pytest's hooks (the terminal's counts and progress, JUnit, other plugins)."""
    run = state.run
    if run.aborted is None and run.early_stopped is None:
        return
    problems = {p.id: p for p in state.plan.problems}
    hook = config.hook
    for ref in run.unreported():
        report = unfinished_report(
            ref,
            aborted=run.aborted,
            stopped=run.early_stopped,
            problem=problems.get(run.problem_of.get(ref.nodeid, "")),
            late=late,
        )
        hook.pytest_runtest_logstart(nodeid=ref.nodeid, location=ref.location)
        hook.pytest_runtest_logreport(report=report)
        hook.pytest_runtest_logfinish(nodeid=ref.nodeid, location=ref.location)


def gate_reports(verdict: RunVerdict) -> list[pytest.TestReport]:
    """Each gate as a test's call and teardown reports: passed, failed, or skipped when
    undecided (never passed), with the gate's detail as its message. With --gsm8k-resume
    each also has the property ``answers_from_earlier_runs`` (``39 of 40``; a config's
    gate, its config's count), since a passed test case shows no detail."""
    earlier = {
        gate.name: f"{part.from_cache()} of {part.n}"
        for part in verdict.groups
        for gate in part.gates
        if part.selection.resumed
    }
    out: list[pytest.TestReport] = []
    for gate in verdict.gates:
        nodeid = f"{GATES_NODEID}::{gate.name}"
        location = (GATES_NODEID.partition("::")[0], None, f"gates::{gate.name}")
        word: Literal["passed", "failed", "skipped"] = "failed" if gate.word == "FAIL" else "passed"
        detail: str | tuple[str, int, str] | None = gate.detail if word == "failed" else None
        if gate.word == "UNDECIDED":  # never a pass: a skip, its reason in pytest's shape
            word, detail = "skipped", (location[0], 0, gate.detail)
        properties = [("answers_from_earlier_runs", n) for n in [earlier.get(gate.name)] if n]
        out += [
            pytest.TestReport(nodeid, location, {}, word, detail, "call"),
            pytest.TestReport(
                nodeid, location, {}, "passed", None, "teardown", user_properties=properties
            ),
        ]
    return out


def add_gates_to_junit(config: pytest.Config, verdict: RunVerdict) -> None:
    """Give ``--junitxml``'s writer a test case per gate before it writes the file (only
    it: the terminal says the gates in the gsm8k section, and counting them there would
    change the line that counts the problems)."""
    from _pytest.junitxml import xml_key

    xml = config.stash.get(xml_key, None)
    if xml is None:
        return
    for report in gate_reports(verdict):
        xml.pytest_runtest_logreport(report)


def teststatus(
    report: pytest.TestReport, progress: bool
) -> tuple[str, str, str | tuple[str, dict[str, bool]]] | None:
    """A GSM8K outcome's own letter and word; with the progress line, no letter for a GSM8K
    item at all (the line counts them)."""
    record = getattr(report, "gsm8k", None)
    if report.when == "call" and report.passed and isinstance(record, dict):
        outcome = str(record["outcome"])
        if progress:
            return outcome, "", ""
        letter, markup = LETTERS.get(outcome, (".", {"green": True}))
        return outcome, letter, (outcome.upper(), markup)
    ours = isinstance(record, dict) or is_unfinished(report)
    if progress and ours and report.when == "setup" and not report.passed:
        return ("error" if report.failed else "skipped"), "", ""
    return None


def summarize(terminalreporter: Any, state: Gsm8kSession) -> None:
    """The gsm8k block of the terminal summary: the notes no test issued, the verdict, what
    stopped the run, where the outputs went (or why not)."""
    from pytest_gsm8k.core.render import styled_lines
    from pytest_gsm8k.core.scrub import printable

    write = terminalreporter.write_line
    for message in state.notes:
        write(printable(message), yellow=True)
    run = state.run
    if run.verdict is None:
        return
    terminalreporter.write_sep("=", "gsm8k")
    for line, kind in styled_lines(run.verdict):
        write(line, bold=kind == "headline", red=kind == "fail", green=kind == "pass")
    if run.aborted:
        write(f"gsm8k: run stopped: {printable(run.aborted)}", red=True)
    for message in state.output_errors.values():
        write(printable(message), red=True)
    for key, name in (("report", "report"), ("html", "page"), ("markdown", "markdown")):
        path = getattr(state.settings, key)
        if path and key not in state.output_errors:
            write(f"  {name}: {path}")


def gate_exit(session: pytest.Session, state: Gsm8kSession) -> None:
    """The exit code of a failed gate or output; the gates in the JUnit XML (before its
    writer, which runs later, writes the file)."""
    verdict = state.run.verdict
    if verdict is not None:
        add_gates_to_junit(session.config, verdict)
    failed = (verdict is not None and verdict.failed) or bool(state.output_errors)
    if failed and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def progress_wanted(config: pytest.Config, asked: bool | None) -> bool:
    """Whether this process shows the progress line: asked for (``--gsm8k-progress``), or
    by default when the output is a terminal (a CI log gets the dots); never with ``-v``,
    where each item has its own line, nor with ``ini false``."""
    if asked is False or config.get_verbosity() > 0:
        return False
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return False
    return bool(asked) or bool(reporter.isatty())


class ProgressLine:
    """The progress line on pytest's terminal: redrawn at most every
    :data:`PROGRESS_INTERVAL` seconds (and always at the end), with the terminal
    reporter's rewrite of the current line. Into a log that is not a terminal (asked for
    with ``--gsm8k-progress``) a rewrite is carriage returns on one endless line: there it
    is a plain line every :data:`LOG_PROGRESS_INTERVAL` seconds."""

    def __init__(self, config: pytest.Config, clock: Callable[[], float] = time.monotonic) -> None:
        self._reporter = config.pluginmanager.get_plugin("terminalreporter")
        self._tty = self._reporter is not None and bool(self._reporter.isatty())
        self._clock = clock
        self._started = clock()
        self._drawn_at: float | None = None
        self._drawn_done = -1

    def due(self) -> bool:
        every = PROGRESS_INTERVAL if self._tty else LOG_PROGRESS_INTERVAL
        return self._drawn_at is None or self._clock() - self._drawn_at >= every

    def draw(self, records: Mapping[str, ProblemRecord], total: int) -> None:
        if self._reporter is None or total <= 0:
            return
        now = self._clock()
        self._drawn_at = now
        counter = Counter(r["outcome"] for r in records.values())
        counts: dict[str, int] = {o: counter[o] for o in OUTCOMES}
        line = Progress(len(records), total, now - self._started, counts).line()
        if self._tty:
            self._reporter.rewrite(line, erase=True)
        elif len(records) != self._drawn_done:  # a log: no line twice
            self._reporter.write_line(line)
        self._drawn_done = len(records)
