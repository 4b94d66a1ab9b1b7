"""The run's outputs from the pytest side: checked at session start, written at the end by
runtime/finish.py; and what pytest's reporters see beyond the items that ran (registered
once the aggregating role's session exists)."""

from __future__ import annotations

import functools
import math
import time
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.junitxml import xml_key

from pytest_gsm8k import ROLE_NAME
from pytest_gsm8k.core.dataset import DatasetError
from pytest_gsm8k.core.progress import progress_line
from pytest_gsm8k.core.records import OUTCOMES, ProblemRecord
from pytest_gsm8k.core.render import junit_cases, styled_lines
from pytest_gsm8k.core.scrub import printable
from pytest_gsm8k.runtime.finish import OUTPUTS, output_paths, page_path, settle, write_outputs
from pytest_gsm8k.runtime.outputs import OutputError, check_name, prepare
from pytest_gsm8k.session import Gsm8kSession, get_session

if TYPE_CHECKING:
    from pytest_gsm8k.core.plan import RunPlan


def report_unfinished(state: Gsm8kSession, late: Mapping[str, ProblemRecord]) -> None:
    """After a stopped run's loop, one report per item no report came for, through pytest's
    hooks: the outcome of its answer if it arrived before an endpoint failure (``late``), else
    skipped as not run. Marked ``gsm8k_unfinished``: the plugin's own tally skips them."""
    run, hook = state.run, state.config.hook
    if run.aborted is None and "" not in run.stopped:  # the run's own early stop
        return
    reason = run.aborted or run.stopped.get("", "").removeprefix("gsm8k: ")
    for nodeid, location in run.unreported():
        path, lineno, _ = location
        skip = (path, (lineno or 0) + 1, f"Skipped: gsm8k: not run: {reason}")
        how: tuple[Any, ...] = ("skipped", skip, "setup")
        mine: dict[str, Any] = {}
        if (record := late.get(run.problem_of.get(nodeid, ""))) is not None:
            mine, how = {"gsm8k": record}, ("passed", None, "call")
            if record["outcome"] == "error":
                how = ("failed", f"gsm8k: {record['error']}", "setup")
        report = pytest.TestReport(nodeid, location, {}, *how, gsm8k_unfinished=True, **mine)
        hook.pytest_runtest_logstart(nodeid=nodeid, location=location)
        hook.pytest_runtest_logreport(report=report)
        hook.pytest_runtest_logfinish(nodeid=nodeid, location=location)


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
        letter = {"wrong": "w", "unparsed": "u", "truncated": "t"}.get(outcome, ".")
        return outcome, letter, (outcome.upper(), {"green" if letter == "." else "yellow": True})
    ours = isinstance(record, dict) or getattr(report, "gsm8k_unfinished", False)
    if progress and ours and report.when == "setup" and not report.passed:
        return ("error" if report.failed else "skipped"), "", ""
    return None


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The notes no test issued, the verdict, what stopped the run, where the outputs went."""
    state, write = get_session(config), terminalreporter.write_line
    for message in state.sources.take_notes():  # no test issued them
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
    """The exit code of a failed gate or output; each gate a test case (a failed gate in a file
    of ``failures="0"`` shows green) for ``--junitxml``'s writer only (on the terminal it would
    change the line that counts the problems), skipped when undecided (core/render.junit_cases),
    with ``answers_from_earlier_runs``."""
    state = get_session(session.config)
    verdict = state.run.verdict
    if verdict is not None and (xml := session.config.stash.get(xml_key, None)) is not None:
        for case in junit_cases(verdict):  # JUnit: classname gsm8k.gates, name the gate's
            nodeid, location = f"gsm8k::gates::{case.name}", ("gsm8k", None, f"gates::{case.name}")
            detail: str | tuple[str, int, str] | None = case.message
            if case.outcome == "skipped" and case.message is not None:  # pytest's skip shape
                detail = ("gsm8k", 0, case.message)
            mine = [("answers_from_earlier_runs", case.earlier)] if case.earlier else []
            report = functools.partial(pytest.TestReport, nodeid, location, {})
            xml.pytest_runtest_logreport(report(case.outcome, detail, "call"))
            # a passed test case shows no detail: a property
            xml.pytest_runtest_logreport(report("passed", None, "teardown", user_properties=mine))
    failed = (verdict is not None and verdict.failed) or bool(state.output_errors)
    if failed and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


class ProgressLine:
    """The progress line, rewritten in place at most every half second and at the end; into
    a log (where a rewrite is one endless line) a plain line every 10 s at most."""

    def __init__(self, reporter: Any) -> None:
        self._reporter, self._tty = reporter, bool(reporter.isatty())
        self._started, self._drawn_at, self._drawn_done = time.monotonic(), -math.inf, -1

    @classmethod
    def wanted(cls, config: pytest.Config, asked: bool | None) -> ProgressLine | None:
        """Asked for (``--gsm8k-progress``), or by default on a terminal (a CI log gets the
        dots); never with ``-v``, where each item has its own line, nor with ``ini false``."""
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        if asked is False or config.get_verbosity() > 0 or reporter is None:
            return None
        return cls(reporter) if asked or reporter.isatty() else None

    def draw(self, state: Gsm8kSession, final: bool = False) -> None:
        now, every = time.monotonic(), 0.5 if self._tty else 10.0
        if not final and now - self._drawn_at < every:
            return
        records, total = state.run.records, len(state.run.collected_ids or ())
        if total <= 0:
            return
        self._drawn_at = now
        counter = Counter(r["outcome"] for r in records.values())
        line = progress_line(
            len(records), total, now - self._started, {o: counter[o] for o in OUTCOMES}
        )
        if self._tty:
            self._reporter.rewrite(line, erase=True)
        elif len(records) != self._drawn_done:  # a log: no line twice
            self._reporter.write_line(line)
        self._drawn_done = len(records)


def check_outputs(state: Gsm8kSession, keys: tuple[str, ...], plan: RunPlan | None = None) -> None:
    """Where the run's end writes ``keys`` (with the ``plan``, its baselines too), refused in
    one line before any request is paid for; then the end's imports are loaded and the
    open-file limit checked: a run that holds as many sockets as the limit allows must still
    be able to end."""
    paths, baselines = output_paths(state.settings), []
    if plan is not None:
        what = (
            (plan.settings.baseline and "--gsm8k-baseline")
            or (plan.settings.baseline_name and "--gsm8k-baseline-name")
            or "the baseline name from the protocol (choose one with --gsm8k-baseline-name)"
        )
        named = "config {}'s baseline name"  # a config's is named by its label
        baselines = [(g.baseline, named.format(g.name) if g.config else what) for g in plan.groups]
    try:
        for key in keys:
            if path := paths[key]:
                state.outputs[key] = prepare(path, OUTPUTS[key][0], append=OUTPUTS[key][1])
        for baseline, what in baselines:
            if baseline is not None:  # a name the file system cannot hold: refused now
                check_name(baseline.path, what)
                if plan is not None and plan.update_baseline:
                    prepare(baseline.path, "--snapshot-update: the baseline", streams=False)
    except OutputError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    if plan is None:
        return
    room, wanted = state.descriptor_room, state.settings.concurrency
    if room is not None and room[0] < wanted:  # the run goes on with fewer, and can end
        state.config.issue_config_time_warning(
            pytest.PytestWarning(
                f"gsm8k: --gsm8k-concurrency {wanted} needs more open files than the limit "
                f"allows (ulimit -n {room[1]}): at most {max(1, room[0])} in flight; "
                "raise the limit for more"
            ),
            stacklevel=2,
        )
    from pytest_gsm8k.core import html_report  # noqa: F401


def finish(state: Gsm8kSession) -> None:
    """The end of a run: gather -> decide -> write the baselines -> every output renders
    from the verdict (runtime/finish.py, which a merge of shards calls too)."""
    run, config, settings = state.run, state.config, state.settings
    # an item that reported without a record was skipped: with every item skipped there is
    # no result, and a gate must say so (an interrupted run reports with no item finished)
    skipped = not state.dry and any(nodeid in run.problem_of for nodeid in run.reported)
    ended = run.aborted or run.interrupted or skipped
    if not run.records and not (ended and (settings.asked or run.collected or run.collected_ids)):
        return
    try:
        plan = state.plan
    except DatasetError:
        return
    answers = state.sources.answer_server  # no report came: the plans the workers offered
    if answers is not None and run.collected_ids is None:
        run.learn_collected_ids(answers.planned_ids() or ())
    late = state.sources.late_records(run.wanted(plan)) if run.aborted else {}
    report_unfinished(state, late)
    flags = (("-k", "keyword"), ("-m", "markexpr"), ("--lf", "lf"), ("--deselect", "deselect"))
    named = [flag for flag, dest in flags if getattr(config.option, dest, None)]
    inputs, top = run.gather(
        plan,
        late=late,
        servers=state.sources.servers,
        scrub=state.scrubber(),
        deselected_by=", ".join(named) or "the test ids or paths given",
    )
    # a group with an answer for every problem: its started server's are not reused
    done = [i for i in inputs if i.records and not (run.aborted or i.selection.interrupted)]
    ok = {i.group.name for i in done if all(r["outcome"] != "error" for r in i.records)}
    for name, (cached, generation) in state.sources.started.items():
        if name in ok:
            state.sources.cache(True).finished(cached, generation)
    finished = time.time()
    times = (_iso(run.started), _iso(finished), round(finished - run.started, 3))
    run.finish(verdict := settle(inputs, top, times))
    stream = getattr(state.outputs.get("html"), "fd", None) is not None
    page = page_path(settings.html, config.invocation_params.dir, config.rootpath, stream)
    errors = write_outputs(plan, verdict, page, state.outputs, on_terminal=lambda: _newline(state))
    state.output_errors.update(errors)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def _newline(state: Gsm8kSession) -> None:
    """Before an output to pytest's own stdout or stderr: end the line of progress dots
    (pytest keeps the width of the line so far on its writer; a new line when unknown)."""
    reporter = state.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and getattr(reporter._tw, "width_of_current_line", None) != 0:
        reporter.write("\n", flush=True)
