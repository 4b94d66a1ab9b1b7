"""The run's outputs, from the pytest side: where the end of the run writes (the JSON
report, the page, the Markdown summary, the GitHub step summary, a baseline being recorded)
is checked when the session starts, before any request; at the end each is written, and
whatever fails is one line instead of a crash. How a path is written (file, device, FIFO) is
:mod:`pytest_gsm8k.runtime.outputs`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pytest_gsm8k.core.plan import RunPlan
from pytest_gsm8k.core.records import Report
from pytest_gsm8k.session import Gsm8kSession

if TYPE_CHECKING:
    from pytest_gsm8k.core.verdict import Group, GroupInput, RunVerdict

#: the run's outputs: key -> (the option or variable that names it, appended to)
OUTPUTS = {
    "report": ("--gsm8k-report", False),
    "html": ("--gsm8k-html", False),
    "markdown": ("--gsm8k-markdown", False),
    "step_summary": ("$GITHUB_STEP_SUMMARY", True),
}


def check_outputs(state: Gsm8kSession, keys: tuple[str, ...], plan: RunPlan | None = None) -> None:
    """Before any request: where the run's end writes ``keys`` (with the ``plan``, its
    baselines too) is checked; one usage-error line naming the option when a path cannot be
    written. Then the end's imports are loaded and the open-file limit is checked: a run
    that holds as many sockets as the limit allows must still be able to end."""
    from pytest_gsm8k.runtime.outputs import OutputError, prepare

    for key in keys:
        path = _output_path(state, key)
        if not path or key in state.outputs:
            continue
        what, append = OUTPUTS[key]
        try:
            state.outputs[key] = prepare(path, what, append=append)
        except OutputError as exc:
            raise pytest.UsageError(f"gsm8k: {exc}") from None
    if plan is not None:
        check_baseline_path(plan)
        limit_descriptors(state)
        from pytest_gsm8k import snapshot  # noqa: F401
        from pytest_gsm8k.core import html_report, outcome, render, verdict  # noqa: F401
        from pytest_gsm8k.runtime import files, outputs  # noqa: F401


def check_baseline_path(plan: RunPlan) -> None:
    """Controller, before any request: a baseline name the file system cannot hold is
    refused now; a baseline to be recorded (``--snapshot-update``) needs a folder it can
    be written in."""
    from pytest_gsm8k.runtime.outputs import OutputError, check_name, prepare

    settings = plan.settings
    checked: list[tuple[Path, str]] = []
    if plan.baseline is not None:
        if settings.baseline:
            what = "--gsm8k-baseline"
        elif settings.baseline_name:
            what = "--gsm8k-baseline-name"
        else:
            what = "the baseline name from the protocol (choose one with --gsm8k-baseline-name)"
        checked.append((plan.baseline.path, what))
    for group in plan.groups:  # --gsm8k-config: each config's own baseline
        if group.baseline is not None:
            checked.append((group.baseline.path, f"config {group.name}'s baseline name"))
    try:
        for path, what in checked:
            check_name(path, what)
            if plan.update_baseline:
                prepare(path, "--snapshot-update: the baseline", streams=False)
    except OutputError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None


def write_baselines(verdict: RunVerdict) -> dict[str, str]:
    """``--snapshot-update``: each group's baseline document the verdict holds, written
    atomically; returns the groups whose write failed (group name -> the one line why),
    which the verdict step turns into the baseline gate's FAIL (the one derived copy)."""
    from pytest_gsm8k.runtime.files import write_atomic
    from pytest_gsm8k.runtime.outputs import reason
    from pytest_gsm8k.snapshot import serialize

    failed: dict[str, str] = {}
    for group in verdict.groups:
        document, baseline = group.baseline_write, group.baseline
        if document is None or baseline is None:
            continue
        try:
            write_atomic(baseline.stored.path, serialize(dict(document)))
        except Exception as exc:
            failed[group.group.name] = reason(exc)
    return failed


def finish(state: Gsm8kSession, config: pytest.Config) -> None:
    """The end of a run: gather -> decide -> write the baseline -> (one derived copy if that
    failed) -> every output renders from the verdict (core/verdict.py)."""
    from pytest_gsm8k.core.dataset import DatasetError
    from pytest_gsm8k.reporting import report_unfinished

    state.notes.extend(state.sources.take_notes())
    run, option, settings = state.run, config.option, state.settings
    dry = option.collectonly or getattr(option, "setupplan", False)
    # an item that reported without a record was skipped: with every item skipped
    # there is no result, and a gate must say so rather than not be seen at all
    skipped = not dry and any(nodeid in run.problem_of for nodeid in run.reported)
    if not run.records and not run.aborted and not run.interrupted and not skipped:
        return  # (an interrupted run reports even when no item had finished)
    asked = settings.model or settings.serve or settings.vllm_config
    if not run.records and not asked and not (run.collected or run.collected_ids):
        return
    try:
        plan = state.plan
    except DatasetError:
        return
    state.learn_plans()
    late = state.sources.late_records(run.wanted(plan)) if run.aborted else {}
    report_unfinished(config, state, late)
    inputs, top, not_run = run.gather(
        plan,
        late=late,
        servers=state.sources.config_servers,
        server=state.sources.server_info,
        scrub=state.scrubber(),
        deselected_by=deselected_by(config),
    )
    complete = {i.group.name: _complete(i, run.aborted) for i in inputs}
    state.sources.finish_started(lambda name: complete.get(name, False))
    finished = time.time()
    times = (_iso(run.started), _iso(finished), round(finished - run.started, 3))
    verdict = settle(inputs, top, not_run, times)
    run.finish(verdict)
    for key, path, render in rendered(plan, verdict, page_path(state)):
        write_output(state, key, path, render)


def _complete(group: GroupInput, aborted: str | None) -> bool:
    """Whether a group has an answer for every problem it set out to ask: then its started
    server's answers are not reused by the next run."""
    if aborted or group.selection.interrupted:
        return False
    return bool(group.records) and not any(r["outcome"] == "error" for r in group.records)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def deselected_by(config: pytest.Config) -> str:
    """The options that may have deselected problems, as the command line spells them."""
    option = config.option
    flags = (("-k", "keyword"), ("-m", "markexpr"), ("--lf", "lf"), ("--deselect", "deselect"))
    named = [flag for flag, dest in flags if getattr(option, dest, None)]
    return ", ".join(named) or "the test ids or paths given"


def settle(
    inputs: Sequence[GroupInput],
    top: Group | None,
    not_run: Sequence[str],
    times: tuple[str, str, float],
) -> RunVerdict:
    """The run's verdict, its baselines written: decide, write each baseline the verdict
    holds (``--snapshot-update``), and when a write failed decide once more with the
    failure (the one derived copy). The end of a run and the merge of its shards."""
    from pytest_gsm8k.core.verdict import decide_run

    verdict = decide_run(inputs, top=top, not_run=not_run, times=times)
    failed = write_baselines(verdict)
    if failed:
        inputs = [
            replace(i, baseline=replace(i.baseline, write_error=failed[i.group.name]))
            if i.baseline is not None and i.group.name in failed
            else i
            for i in inputs
        ]
        verdict = decide_run(inputs, top=top, not_run=not_run, times=times)
    return verdict


def rendered(
    plan: RunPlan, verdict: RunVerdict, page: tuple[str, bool] | None
) -> list[tuple[str, str | None, Callable[[], str]]]:
    """Every output of the run's end, rendered from its verdict: (key, path, render) for
    the Markdown summary (``$GITHUB_STEP_SUMMARY``, ``--gsm8k-markdown``; ``page``: where
    it says the page is), the JSON report and the page."""
    from pytest_gsm8k.core.render import markdown
    from pytest_gsm8k.runtime.files import json_text

    out: list[tuple[str, str | None, Callable[[], str]]] = []
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary or plan.settings.markdown:
        problems = plan.problems if plan.groups else plan.split.problems
        questions = {p.id: p.question for p in problems}
        text = markdown(verdict, questions, html=page)
        out += [("step_summary", step_summary, lambda: text)]
        out += [("markdown", plan.settings.markdown, lambda: text)]
    report = verdict.to_json()
    out += [("report", plan.settings.report, lambda: json_text(report))]
    out += [("html", plan.settings.html, lambda: page_html(plan, verdict, report))]
    return out


def _output_path(state: Gsm8kSession, key: str) -> str | None:
    if key == "step_summary":
        return os.environ.get("GITHUB_STEP_SUMMARY") or None
    value = getattr(state.settings, key)
    return str(value) if value else None


def write_output(
    state: Gsm8kSession, key: str, path: str | None, render: Callable[[], str]
) -> None:
    """Write output ``key`` (rendered by ``render``) to ``path``, through the check made at
    session start (made now when there was none); a failure, rendering included, is kept
    as one line in the run's output errors."""
    from pytest_gsm8k.runtime.outputs import OutputError, prepare, reason

    if not path:
        return
    what, append = OUTPUTS[key]
    try:
        output = state.outputs.get(key) or prepare(path, what, append=append)
        text = render()
        if output.terminal:
            _end_terminal_line(state)
        output.write(text)
    except OutputError as exc:
        state.output_errors[key] = f"gsm8k: {exc}"
    except Exception as exc:
        state.output_errors[key] = f"gsm8k: {what}: cannot write {path}: {reason(exc)}"


def page_path(state: Gsm8kSession) -> tuple[str, bool] | None:
    """Where the step summary says the page is: its path relative to the repository
    (pytest's rootdir) and True, or its file's name (what the job's artifact holds) and
    False; never this machine's absolute path. None without a page, or for a page written
    to a stream (a device, a FIFO: no file a reader could open)."""
    path = state.settings.html
    output = state.outputs.get("html")
    if not path or (output is not None and output.fd is not None):
        return None
    config = state.config
    full = config.invocation_params.dir / Path(path).expanduser()
    root = config.rootpath
    # as written first (a link keeps its name), then with the links resolved
    for here, under in (
        (Path(os.path.abspath(full)), root.absolute()),
        (full.resolve(), root.resolve()),
    ):
        if here.is_relative_to(under):
            return here.relative_to(under).as_posix(), True
    return Path(os.path.abspath(full)).name, False


def _end_terminal_line(state: Gsm8kSession) -> None:
    """Before an output to pytest's own stdout or stderr: end the line of progress dots,
    so the output starts on a line of its own (pytest keeps the width of the line so far
    on its writer; a new line when that is unknown)."""
    reporter = state.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    width: object = getattr(getattr(reporter, "_tw", None), "width_of_current_line", None)
    if width != 0:
        reporter.write("\n", flush=True)


def limit_descriptors(state: Gsm8kSession) -> None:
    """One warning when the open-file limit leaves room for fewer requests in flight
    than ``--gsm8k-concurrency``: the run goes on with fewer, and can still end."""
    room = state.descriptor_room
    wanted = state.settings.concurrency
    if room is None or room[0] >= wanted:
        return
    state.config.issue_config_time_warning(
        pytest.PytestWarning(
            f"gsm8k: --gsm8k-concurrency {wanted} needs more open files than the limit "
            f"allows (ulimit -n {room[1]}): at most {max(1, room[0])} in flight; "
            "raise the limit for more"
        ),
        stacklevel=2,
    )


def page_html(plan: RunPlan, verdict: RunVerdict, report: Report) -> str:
    """The run's page (``--gsm8k-html``): the outcomes of the baseline each group was
    compared with beside its own (a config's problems' ids carry its name, so every
    config's baseline fits in one map)."""
    from pytest_gsm8k.core.html_report import outcomes_from_baseline, problem_texts, render_html

    outcomes: dict[str, str] = {}
    for group in verdict.groups:
        if group.compared is not None:
            outcomes |= outcomes_from_baseline(group.compared)
    # --gsm8k-config: the problems' ids carry their config's name
    problems = (*plan.split.problems, *plan.problems) if plan.groups else plan.split.problems
    return render_html(report, problem_texts(problems), outcomes or None)
