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
from typing import TYPE_CHECKING

import pytest

from pytest_gsm8k.core.progress import Progress
from pytest_gsm8k.core.records import OUTCOMES, ProblemRecord
from pytest_gsm8k.core.types import Problem
from pytest_gsm8k.state import ItemRef, State

if TYPE_CHECKING:
    from pytest_gsm8k.core.verdict import RunVerdict

#: the node id under which the gates appear (JUnit: classname ``gsm8k.gates``)
GATES_NODEID = "gsm8k::gates"
#: the reports this module makes carry this attribute (true): the plugin's own
#: aggregation skips them (the summary already counts what they say)
UNFINISHED = "gsm8k_unfinished"
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
        if record["outcome"] != "error":
            return pytest.TestReport(
                ref.nodeid,
                ref.location,
                {},
                "passed",
                None,
                "call",
                gsm8k=record,
                gsm8k_unfinished=True,
            )
        text = f"gsm8k: {record['error']}"
        return pytest.TestReport(
            ref.nodeid,
            ref.location,
            {},
            "failed",
            text,
            "setup",
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
    config: pytest.Config, state: State, late: Mapping[str, ProblemRecord]
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
            problem=problems.get(ref.problem_id) if ref.problem_id else None,
            late=late,
        )
        hook.pytest_runtest_logstart(nodeid=ref.nodeid, location=ref.location)
        hook.pytest_runtest_logreport(report=report)
        hook.pytest_runtest_logfinish(nodeid=ref.nodeid, location=ref.location)


def gate_reports(verdict: RunVerdict) -> list[pytest.TestReport]:
    """Each gate as a test's call and teardown reports: passed, or failed with the
    gate's detail as its message. With --gsm8k-resume each also has the property
    ``answers_from_earlier_runs`` (``39 of 40``; a config's gate, its config's count),
    since a passed test case shows no detail."""
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
        if gate.passed:
            out.append(pytest.TestReport(nodeid, location, {}, "passed", None, "call"))
        else:
            out.append(pytest.TestReport(nodeid, location, {}, "failed", gate.detail, "call"))
        properties = (
            [("answers_from_earlier_runs", earlier[gate.name])] if gate.name in earlier else []
        )
        out.append(
            pytest.TestReport(
                nodeid, location, {}, "passed", None, "teardown", user_properties=properties
            )
        )
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
