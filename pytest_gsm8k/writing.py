"""The run's outputs from the pytest side: each checked at session start, before any request
(one line naming the option, not a crash after every request was paid for); at the end the
verdict decided and every output written by runtime/finish.py, failures kept as one line."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest

from pytest_gsm8k.core.plan import RunPlan
from pytest_gsm8k.session import Gsm8kSession


def check_outputs(state: Gsm8kSession, keys: tuple[str, ...], plan: RunPlan | None = None) -> None:
    """Where the run's end writes ``keys`` (with the ``plan``, its baselines too); then the
    end's imports are loaded and the open-file limit checked: a run that holds as many
    sockets as the limit allows must still be able to end."""
    from pytest_gsm8k.runtime.finish import OUTPUTS, output_paths
    from pytest_gsm8k.runtime.outputs import OutputError, check_name, prepare

    paths, baselines = output_paths(state.settings), []
    if plan is not None:
        settings = plan.settings
        what = (
            (settings.baseline and "--gsm8k-baseline")
            or (settings.baseline_name and "--gsm8k-baseline-name")
            or "the baseline name from the protocol (choose one with --gsm8k-baseline-name)"
        )
        baselines = [(plan.baseline, what)]
        baselines += [(g.baseline, f"config {g.name}'s baseline name") for g in plan.groups]
    try:
        for key in keys:
            if (path := paths[key]) and key not in state.outputs:
                what, append = OUTPUTS[key]
                state.outputs[key] = prepare(path, what, append=append)
        for baseline, what in baselines:
            if baseline is not None:  # a name the file system cannot hold: refused now
                check_name(baseline.path, what)
                if plan is not None and plan.update_baseline:
                    prepare(baseline.path, "--snapshot-update: the baseline", streams=False)
    except OutputError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    if plan is not None:
        # one warning when the open-file limit leaves room for fewer requests in flight
        # than --gsm8k-concurrency: the run goes on with fewer, and can still end
        room, wanted = state.descriptor_room, state.settings.concurrency
        if room is not None and room[0] < wanted:
            state.config.issue_config_time_warning(
                pytest.PytestWarning(
                    f"gsm8k: --gsm8k-concurrency {wanted} needs more open files than the limit "
                    f"allows (ulimit -n {room[1]}): at most {max(1, room[0])} in flight; "
                    "raise the limit for more"
                ),
                stacklevel=2,
            )
        from pytest_gsm8k.core import html_report, outcome, render, verdict  # noqa: F401
        from pytest_gsm8k.runtime import files, finish, outputs  # noqa: F401


def finish(state: Gsm8kSession) -> None:
    """The end of a run: gather -> decide -> write the baselines -> every output renders
    from the verdict (runtime/finish.py, which a merge of shards calls too)."""
    from pytest_gsm8k.core.dataset import DatasetError
    from pytest_gsm8k.reporting import report_unfinished
    from pytest_gsm8k.runtime.finish import page_path, settle, write_outputs

    state.notes.extend(state.sources.take_notes())
    run, config, settings = state.run, state.config, state.settings
    # an item that reported without a record was skipped: with every item skipped
    # there is no result, and a gate must say so rather than not be seen at all
    skipped = not state.dry and any(nodeid in run.problem_of for nodeid in run.reported)
    if not run.records and not run.aborted and not run.interrupted and not skipped:
        return  # (an interrupted run reports even when no item had finished)
    if not run.records and not settings.asked and not (run.collected or run.collected_ids):
        return
    try:
        plan = state.plan
    except DatasetError:
        return
    state.learn_plans()
    late = state.sources.late_records(run.wanted(plan)) if run.aborted else {}
    report_unfinished(state, late)
    inputs, top, not_run = run.gather(
        plan,
        late=late,
        servers=state.sources.config_servers,
        server=state.sources.server_info,
        scrub=state.scrubber(),
        deselected_by=deselected_by(config),
    )
    # a group with an answer for every problem: its started server's are not reused
    state.sources.finish_started(
        {
            i.group.name
            for i in inputs
            if not (run.aborted or i.selection.interrupted)
            and i.records
            and not any(r["outcome"] == "error" for r in i.records)
        }
    )
    finished = time.time()
    times = (_iso(run.started), _iso(finished), round(finished - run.started, 3))
    verdict = settle(inputs, top, not_run, times)
    run.finish(verdict)
    html = state.outputs.get("html")
    stream = html is not None and html.fd is not None
    page = page_path(settings.html, config.invocation_params.dir, config.rootpath, stream)
    errors = write_outputs(plan, verdict, page, state.outputs, on_terminal=lambda: _newline(state))
    for key, line in errors.items():
        state.output_errors[key] = line


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def deselected_by(config: pytest.Config) -> str:
    """The options that may have deselected problems, as the command line spells them."""
    option = config.option
    flags = (("-k", "keyword"), ("-m", "markexpr"), ("--lf", "lf"), ("--deselect", "deselect"))
    named = [flag for flag, dest in flags if getattr(option, dest, None)]
    return ", ".join(named) or "the test ids or paths given"


def _newline(state: Gsm8kSession) -> None:
    """Before an output to pytest's own stdout or stderr: end the line of progress dots
    (pytest keeps the width of the line so far on its writer; a new line when unknown)."""
    reporter = state.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and getattr(reporter._tw, "width_of_current_line", None) != 0:
        reporter.write("\n", flush=True)
