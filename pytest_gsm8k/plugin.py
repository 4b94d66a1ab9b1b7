"""pytest glue: options, parametrization, report stream, gate (fixtures in fixtures.py).

Everything pytest-specific lives here and stays thin; the work is done by
the pure modules (dataset, prompts, scoring, summary) and the engine.

Flow: options -> :class:`Settings` once per process; ``gsm8k_problem`` is
parametrized from the selected split; ``gsm8k_outcome`` asks the process's
engine for the answer (prefetched) and scores it; the record rides the test
report to the controller (``pytest_runtest_logreport``, the same with and
without xdist); after the test loop the controller builds the summary, runs
the gates and writes the report.
"""

from __future__ import annotations

import atexit
import dataclasses
import gc
import itertools
import json
import os
import re
import signal
import threading
import time
from collections.abc import Generator, Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gsm8k import STATE_NAME
from pytest_gsm8k.core.settings import (
    OPTIONS,
    Option,
    Settings,
    SettingsError,
    build_settings,
    convert_bool,
)
from pytest_gsm8k.fixtures import (  # noqa: F401 - registered with pytest from here
    GSM8KOutcome,
    gsm8k_model,
    gsm8k_outcome,
    gsm8k_problem,
    gsm8k_protocol,
)

# pytest imports this module in every session of every repository the plugin is installed
# in: at module level only pytest, the option table and the fixtures' definitions. The rest
# is imported where it is used, once a session has GSM8K work (issue 34: a suite that does
# not use the plugin should not pay for it; tests/plugin/test_inert.py pins the modules).
if TYPE_CHECKING:
    from pytest_gsm8k.core.plan import RunPlan
    from pytest_gsm8k.core.verdict import GroupInput
    from pytest_gsm8k.reporting import ProgressLine
    from pytest_gsm8k.state import State

BUILTIN_NODEID = "gsm8k"
#: the marker every GSM8K item carries: ``-m gsm8k`` selects the gate, ``-m "not gsm8k"`` the rest
GSM8K_MARK = pytest.mark.gsm8k

#: how the run that needs a model and was given none ends (under xdist a worker's stop
#: carries it to the controller, which ends the run with it as a usage error)
NO_MODEL = "gsm8k: no model given"

LETTERS = {
    "correct": (".", {"green": True}),
    "wrong": ("w", {"yellow": True}),
    "unparsed": ("u", {"yellow": True}),
    "truncated": ("t", {"yellow": True}),
}


# -- options -------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gsm8k", "GSM8K evaluation (pytest-gsm8k)")
    for option in OPTIONS:
        if option.kind == "bool":
            group.addoption(
                option.flag, action="store_true", default=None, dest=option.dest, help=option.help
            )
            # A string, converted by settings: pytest's own "bool" conversion fails with a
            # message that does not name the option (pytest 9.2: a bare UsageError).
            parser.addini(option.dest, option.help, default=None)
        elif option.kind == "list":
            group.addoption(
                option.flag,
                action="append",
                default=None,
                dest=option.dest,
                metavar=option.metavar,
                help=option.help,
            )
            parser.addini(option.dest, option.help, type="linelist", default=None)
        else:
            shown = f" (default {option.default})" if option.default not in (None, "") else ""
            group.addoption(
                option.flag,
                default=None,
                dest=option.dest,
                metavar=option.metavar or option.name.upper(),
                help=option.help + shown,
            )
            parser.addini(option.dest, option.help, default=None)


def _spaced_paths(config: pytest.Config) -> Iterator[str]:
    """Before it knows our options pytest picks its rootdir from them (pytest-dev/pytest#8846)."""
    at, valued = config.invocation_params, {o.flag for o in OPTIONS if o.kind != "bool"}
    pairs = itertools.pairwise(str(a) for a in at.args)
    if flags := [f for f, v in pairs if f in valued and os.path.exists(at.dir / v)]:
        why = f"pytest took the value for a test path to the rootdir ({config.rootpath}) and ini"
        yield f"{', '.join(flags)} written with a space: {why}; write {flags[0]}=PATH"


def _read_option(config: pytest.Config, option: Option) -> Any:
    """Command line first, then the ini twin; None when neither is set."""
    value = config.getoption(option.dest)
    if value is not None:
        return value
    ini = config.getini(option.dest)
    if ini in (None, "", []):
        return None
    if option.kind == "bool" and isinstance(ini, str):
        try:
            return convert_bool(ini)
        except ValueError:
            raise SettingsError(f"ini {option.dest}: expected true or false, got {ini!r}") from None
    return ini


# -- per-process state -----------------------------------------------------------


class StatePlugin:
    """Holds the State; hooks that need it live on it.

    The State is made on first use: at once when the session start has work for it or a gsm8k
    option is on the command line (pytest_configure), else when something asks for it (a
    gsm8k fixture, a GSM8K item's parametrization, an xdist controller starting its workers).
    Until then the session has no GSM8K work and each hook returns at once (:meth:`_idle`),
    importing nothing of the run's machinery."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self._state: State | None = None
        self.session: pytest.Session | None = None
        self._active = False
        self.warnings: list[str] = []  # cache warnings no test issued (xdist controller)
        #: the progress line, while the test loop runs (None: the dots)
        self.progress: ProgressLine | None = None

    @property
    def state(self) -> State:
        if self._state is None:
            from pytest_gsm8k.state import State

            self._state = State(self.config, self.settings)
        return self._state

    def _idle(self) -> bool:
        """Whether this session has no GSM8K work so far: no State was asked for."""
        return self._state is None

    def activate(self) -> None:
        """What a GSM8K run changes in the process, done once and only for a run that has
        GSM8K work (an option asks for a model, or a gsm8k item was collected): like
        xdist without ``-n``, the installed plugin leaves every other session alone.
        Scrubbing the HTTP libraries' log records of the key; SIGTERM ending the run like
        Ctrl-C (main process only)."""
        if self._active:
            return
        self._active = True
        from pytest_gsm8k.runtime.logs import scrub_library_logs

        config = self.config
        config.add_cleanup(scrub_library_logs(self.state.scrubber()))
        if not self.state.is_worker:
            _end_on_sigterm(config)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Controller: validate data and outputs and reach the endpoint before anything
        is sent.

        Under xdist it also starts the run's one engine for the plugin's own
        client and the server the workers ask it through (before xdist starts
        the workers: their ``workerinput`` carries its address).
        """
        self.session = session
        if self._idle():
            return
        from pytest_gsm8k.channel import head_start_allowed, start_controller, warm_engine
        from pytest_gsm8k.core.dataset import DatasetError
        from pytest_gsm8k.core.settings import is_local_spec
        from pytest_gsm8k.fixtures import model_overridden
        from pytest_gsm8k.serving import preflight, start_local, start_serve
        from pytest_gsm8k.state import limit_note
        from pytest_gsm8k.writing import (
            check_baseline_path,
            limit_descriptors,
            preload_end,
            prepare_outputs,
        )

        state = self.state
        settings = state.settings
        if settings.model or settings.serve or settings.vllm_config:
            self.activate()
        if state.is_worker:
            return
        prepare_outputs(state, ("report", "html", "markdown"))  # asked for by name: any run
        if not (settings.model or settings.serve or settings.vllm_config):
            return
        # The data, protocol and baseline first: a bad file is one line before any server
        # starts. The plan is published once, with the endpoint the server and the
        # preflight settle.
        try:
            draft = state.build_plan(state.default_endpoint())
        except DatasetError as exc:
            raise pytest.UsageError(f"gsm8k: {exc}") from None
        limit_note(state, draft)
        prepare_outputs(state, ("step_summary",))
        check_baseline_path(draft)
        limit_descriptors(state)
        preload_end()
        if draft.groups:
            self._start_configs(session, draft)
            return
        endpoint = draft.endpoint
        started = None
        if settings.serve:
            started = start_serve(state)
        elif is_local_spec(settings.model):
            started = start_local(state)
        if started is not None:
            state.sources.use_server(started.server, started.info)
            endpoint = started.endpoint
        overridden = model_overridden(session.config)
        if not overridden:
            endpoint = preflight(state, endpoint)
        state.set_plan(dataclasses.replace(draft, endpoint=endpoint))
        if session.config.pluginmanager.has_plugin("dsession"):
            ahead = not overridden and head_start_allowed(session.config)
            state.sources.use_answer_server(start_controller(state, ahead))
        elif not overridden and not (
            session.config.option.collectonly or getattr(session.config.option, "setupplan", False)
        ):
            warm_engine(state)

    def _start_configs(self, session: pytest.Session, draft: RunPlan) -> None:
        """--gsm8k-config: the plan is published as it is (each config's server is started
        in turn once the items are known); what a matrix cannot honour is one line."""
        from pytest_gsm8k.channel import start_controller
        from pytest_gsm8k.fixtures import model_overridden
        from pytest_gsm8k.serving import start_matrix

        state = self.state
        if model_overridden(session.config):
            raise pytest.UsageError(
                "gsm8k: --gsm8k-config runs each config's own server: a gsm8k_model override "
                "cannot take part (remove it, or run without --gsm8k-config)"
            )
        state.set_plan(draft)
        state.sources.use_matrix(start_matrix(state))
        if session.config.pluginmanager.has_plugin("dsession"):
            state.sources.use_answer_server(start_controller(state))

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist controller: hand the run's identity and the answer server to each worker."""
        state = self.state
        endpoint = state.endpoint()
        node.workerinput["gsm8k_run_id"] = state.run_id
        node.workerinput["gsm8k_run_started"] = state.run.started  # what --gsm8k-resume reads
        node.workerinput["gsm8k_base_url"] = endpoint.base_url
        node.workerinput["gsm8k_model"] = endpoint.model
        node.workerinput["gsm8k_server_identity"] = endpoint.identity
        answers = state.sources.answer_server
        if answers is not None:
            node.workerinput["gsm8k_answers"] = list(answers.address)
            node.workerinput["gsm8k_answers_token"] = answers.token

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        """Remember the scope of every ``gsm8k_model`` value: only a session-scoped model
        may be prefetched (a narrower one exists for its own items only)."""
        value = yield
        if fixturedef.argname == "gsm8k_model":
            self.state.sources.note_scope(value, fixturedef.scope)
        return value

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Add the built-in test when --gsm8k-model or --gsm8k-serve is given (before
        -k/-m/--lf filter)."""
        settings = self.settings
        if not (settings.model or settings.serve or settings.vllm_config):
            return
        from pytest_gsm8k import builtin

        module = BuiltinModule.from_parent(
            session, path=Path(builtin.__file__), nodeid=BUILTIN_NODEID
        )
        items.extend(session.genitems(module))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Remember which problems this process will run, in run order, for the prefetcher."""
        if self._idle():
            return
        from pytest_gsm8k.channel import start_early
        from pytest_gsm8k.core.types import Problem
        from pytest_gsm8k.state import ItemRef

        if self.state.run.data_error:
            raise pytest.UsageError(self.state.run.data_error)
        seen: set[str] = set()
        planned: list[Problem] = []
        refs: list[ItemRef] = []
        for item in session.items:
            callspec = getattr(item, "callspec", None)
            problem = callspec.params.get("gsm8k_problem") if callspec is not None else None
            problem_id = problem.id if isinstance(problem, Problem) else None
            if isinstance(problem, Problem) and problem.id not in seen:
                seen.add(problem.id)
                planned.append(problem)
            refs.append(ItemRef(item.nodeid, problem_id, item.location))
        self.state.run.collect(planned)
        self.state.run.collect_items(refs)
        if planned:
            self.activate()
        start_early(self.state, session)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """xdist controller: which problems the workers collected (it collects nothing).

        With an answers channel the workers send their plans on it (read when needed);
        without one (no ``--gsm8k-model``: tests that bring their own model) the problem
        ids are read from xdist's node ids.

        The items themselves (node ids, and the problem in each id's parameters) are kept
        in any case: a stopped run reports those no worker reached."""
        from pytest_gsm8k.state import ItemRef

        split = re.escape(self.state.settings.split)
        # --gsm8k-config: a problem's id carries its config's name (``Qwen3:test-0001``)
        group = r"(?:[^\s\[\]:]+:)?" if self.state.settings.vllm_config else r"\b"
        pattern = re.compile(rf"{group}{split}-\d{{4,}}\b")
        refs: list[ItemRef] = []
        found: set[str] = set()
        for nodeid in ids:
            params = nodeid.rpartition("[")[2] if "[" in nodeid else ""
            problems = pattern.findall(params)
            found.update(problems)
            path, _, domain = nodeid.partition("::")
            refs.append(ItemRef(nodeid, problems[0] if problems else None, (path, None, domain)))
        self.state.run.collect_items(refs)
        if self.state.run.collected_ids is not None or self.state.sources.answer_server:
            return
        self.state.run.learn_collected_ids(found)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if self._idle():
            return report
        from pytest_gsm8k.state import RECORD_KEY

        record = item.stash.get(RECORD_KEY, None)
        if record is not None and (
            report.when == "call" or (report.when == "setup" and record["outcome"] == "error")
        ):
            report.gsm8k = record  # type: ignore[attr-defined]
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_report_to_serializable(
        self, report: pytest.CollectReport | pytest.TestReport
    ) -> Generator[None, dict[str, Any] | None, dict[str, Any] | None]:
        """An xdist worker's report on its way: a record whose text UTF-8 cannot encode (a
        lone surrogate from a reply; execnet refuses such strings) travels as JSON text,
        which keeps it exactly (:mod:`pytest_gsm8k.core.jsontext`)."""
        data = yield
        record = data.get("gsm8k") if isinstance(data, dict) else None
        if isinstance(data, dict) and isinstance(record, dict):
            from pytest_gsm8k.core.jsontext import escape_surrogates

            text = json.dumps(record, ensure_ascii=False)
            escaped = escape_surrogates(text)
            if escaped != text:
                data["gsm8k"] = escaped
        return data

    @pytest.hookimpl(wrapper=True)
    def pytest_report_from_serializable(
        self, data: dict[str, Any]
    ) -> Generator[None, object, object]:
        """The controller's side of :meth:`pytest_report_to_serializable`."""
        report = yield
        text = getattr(report, "gsm8k", None)
        if isinstance(text, str):
            report.gsm8k = json.loads(text)  # type: ignore[attr-defined]
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self._idle():
            return
        from pytest_gsm8k.reporting import is_unfinished

        if self.state.is_worker:
            return
        self.state.run.note_report(report.nodeid)
        if is_unfinished(report):
            return  # made by the plugin for an item never reached: the summary counts it
        record = getattr(report, "gsm8k", None)
        if isinstance(record, dict):
            self.activate()  # an xdist controller learns of GSM8K work from the first record
            state = self.state
            fresh = state.run.add_record(record)  # type: ignore[arg-type]
            answers = state.sources.answer_server
            if answers is not None:
                answers.settled(str(record["id"]))
            aborted = record["outcome"] == "error" and record.get("aborted")
            if fresh and not aborted and state.settings.early_stop:
                self._observe_early(
                    str(record["id"]),
                    bool(record["correct"]),
                    str(record["outcome"]),
                    [str(x) for x in record.get("repeats") or ()],
                )
            if fresh and self.progress is not None and self.progress.due():
                self._draw_progress()

    def _draw_progress(self) -> None:
        """The progress line: answered problems (records) of the run's problems."""
        assert self.progress is not None
        total = len({ref.problem_id for ref in self.state.run.items if ref.problem_id})
        self.progress.draw(self.state.run.records, total)

    def _observe_early(
        self, problem_id: str, correct: bool, outcome: str, answers: list[str]
    ) -> None:
        """Controller: one more outcome for --gsm8k-early-stop (with --gsm8k-repeats, its
        answers' outcomes too), fed to its group's early stop: the run's, or with
        --gsm8k-config its config's. Once that is decided before the group's last problem,
        the group stops: a run at once; a config's items not fetched are skipped, its server
        stops and the next config's starts."""
        from pytest_gsm8k.runtime.matrix import group_of
        from pytest_gsm8k.state import early_stop_for

        run = self.state.run
        name = group_of(problem_id) if self.state.settings.vllm_config else ""
        if name not in run.early:
            self._learn_plans()
            run.start_early_stop(name, early_stop_for(self.state, name))
        early = run.early[name]
        if early is None or name in run.stopped:
            return
        try:
            decision = early.observe(problem_id, correct, outcome, answers)
        except (KeyError, ValueError):
            return  # a problem outside the group's plan (a user's own test): not counted
        if decision is None or early.observed >= early.n_total:
            return
        if name:
            message = (
                f"config {name} stopped early (--gsm8k-early-stop {early.mode}): "
                f"{early.headline()}; its problems not asked yet are skipped"
            )
            run.stop_early(name, message)
            if self.state.sources.matrix is not None:
                self.state.sources.matrix.stop_config(name, message)
            return
        message = f"gsm8k: {early.headline()}"
        run.stop_early(name, message)
        self.state.sources.stop(message.removeprefix("gsm8k: "))
        dsession = self.config.pluginmanager.get_plugin("dsession")
        if dsession is not None:
            dsession.shouldstop = message  # xdist stops handing out items
        elif self.session is not None:
            self.session.shouldstop = message

    def _learn_plans(self) -> None:
        """xdist controller: the problems the workers collected, from the plans they sent
        on the answers channel (every worker offers its plan before it runs an item)."""
        answers = self.state.sources.answer_server
        planned = answers.planned_ids() if answers is not None else None
        if planned is not None:
            self.state.run.learn_collected_ids(planned)

    def pytest_report_teststatus(
        self, report: pytest.TestReport, config: pytest.Config
    ) -> tuple[str, str, str | tuple[str, dict[str, bool]]] | None:
        """A GSM8K outcome's own letter and word; with the progress line, no letter for a
        GSM8K item at all (the line counts them)."""
        if self._idle():
            return None
        from pytest_gsm8k.reporting import is_unfinished

        record = getattr(report, "gsm8k", None)
        ours = isinstance(record, dict) or is_unfinished(report)
        if report.when == "call" and report.passed and isinstance(record, dict):
            outcome = str(record["outcome"])
            if self.progress is not None:
                return outcome, "", ""
            letter, markup = LETTERS.get(outcome, (".", {"green": True}))
            return outcome, letter, (outcome.upper(), markup)
        if self.progress is not None and ours and report.when == "setup" and not report.passed:
            return ("error" if report.failed else "skipped"), "", ""
        return None

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """After all items, on the controller: summary, gates, report (also when interrupted).

        Innermost of the loop's wrappers (trylast), so that the reports of the items a
        stopped run never reached are in before the terminal writes its final progress."""
        if self._active:
            # What is alive now (modules, the collected items) lives to the end: take it out
            # of the collector's way, so the run's collections and pytest's five full ones at
            # the end walk only what the run made (benchmarks/README.md measures the gain).
            # The cleanup registered in pytest_configure unfreezes it after those.
            gc.freeze()
        settings = self.settings
        gsm8k_run = settings.model or settings.serve or settings.vllm_config or self._active
        if gsm8k_run and not self.state.is_worker:
            from pytest_gsm8k.reporting import ProgressLine, progress_wanted

            if progress_wanted(self.config, settings.progress):
                self.progress = ProgressLine(self.config)
        try:
            return (yield)
        except BaseException as exc:
            if self._idle():
                raise
            if _no_model_under_xdist(exc):
                raise pytest.UsageError(str(exc)) from None  # the workers' one line, once
            if (
                self.state.run.early_stopped is not None
                and str(exc) == self.state.run.early_stopped
            ):
                return True  # the gates' verdicts are settled: a finished run, not interrupted
            self.state.run.interrupt()  # stopped before the end (complete: false)
            if _our_stop_under_xdist(exc, self.state):
                # xdist turns a worker's session.shouldfail into Interrupted (exit code 2);
                # the run stopped on an endpoint failure, which is a failed run (1), as
                # without xdist. The errored items make pytest exit with 1.
                return True
            if isinstance(exc, KeyboardInterrupt) and exc.args == (SIGTERM_MESSAGE,):
                # SIGTERM lands in whatever frame runs, some of which pytest cannot show
                # (a line number of -1 makes its report of the interrupt crash): the run
                # ends from here, with a traceback pytest can print
                raise KeyboardInterrupt(SIGTERM_MESSAGE) from None
            raise
        finally:
            if self.progress is not None and self.state.run.records:
                self._draw_progress()  # where the loop ended
            self._finish(session)

    def _finish(self, session: pytest.Session) -> None:
        if self._idle():
            return
        from pytest_gsm8k.core.dataset import DatasetError
        from pytest_gsm8k.reporting import report_unfinished
        from pytest_gsm8k.state import deselected_by
        from pytest_gsm8k.writing import settle, write_outputs

        state = self.state
        if state.is_worker:
            return
        self.warnings.extend(state.sources.take_notes())  # the controller's cache warnings
        run = state.run
        option = self.config.option
        dry = option.collectonly or getattr(option, "setupplan", False)
        # an item that reported without a record was skipped: with every item skipped
        # there is no result, and a gate must say so rather than not be seen at all
        skipped = not dry and any(r.problem_id and r.nodeid in run.reported for r in run.items)
        if not run.records and not run.aborted and not run.interrupted and not skipped:
            return  # (an interrupted run reports even when no item had finished)
        settings = state.settings
        asked = settings.model or settings.serve or settings.vllm_config
        if not run.records and not asked and not (run.collected or run.collected_ids):
            return
        try:
            plan = state.plan
        except DatasetError:
            return
        self._learn_plans()
        late = state.sources.late_records(run.wanted(plan)) if run.aborted else {}
        report_unfinished(self.config, state, late)
        # gather -> decide -> write the baseline -> (one derived copy if that failed) ->
        # every output renders from the verdict (core/verdict.py)
        inputs, top, not_run = run.gather(
            plan,
            late=late,
            servers=state.sources.config_servers,
            server=state.sources.server_info,
            scrub=state.scrubber(),
            deselected_by=deselected_by(session.config),
        )
        complete = {i.group.name: _complete(i, run.aborted) for i in inputs}
        state.sources.finish_started(lambda name: complete.get(name, False))
        finished = time.time()
        times = (_iso(run.started), _iso(finished), round(finished - run.started, 3))
        verdict = settle(inputs, top, not_run, times)
        run.finish(verdict)
        write_outputs(state, verdict)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self._idle():
            return
        from pytest_gsm8k.core.scrub import printable

        for message in self.warnings:
            terminalreporter.write_line(printable(message), yellow=True)
        run = self.state.run
        verdict = run.verdict
        if verdict is None:
            return
        from pytest_gsm8k.core.render import styled_lines

        terminalreporter.write_sep("=", "gsm8k")
        for line, kind in styled_lines(verdict):
            terminalreporter.write_line(
                line, bold=kind == "headline", red=kind == "fail", green=kind == "pass"
            )
        if run.aborted:
            terminalreporter.write_line(f"gsm8k: run stopped: {printable(run.aborted)}", red=True)
        errors = run.output_errors
        for message in errors.values():
            terminalreporter.write_line(printable(message), red=True)
        if self.state.settings.report and "report" not in errors:
            terminalreporter.write_line(f"  report: {self.state.settings.report}")
        if self.state.settings.html and "html" not in errors:
            terminalreporter.write_line(f"  page: {self.state.settings.html}")
        if self.state.settings.markdown and "markdown" not in errors:
            terminalreporter.write_line(f"  markdown: {self.state.settings.markdown}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        """The exit code of a failed gate; the gates in the JUnit XML (before its writer,
        which runs later, writes the file)."""
        if self._idle():
            return
        from pytest_gsm8k.reporting import add_gates_to_junit

        run = self.state.run
        if run.verdict is not None:
            add_gates_to_junit(self.config, run.verdict)
        failed = (run.verdict is not None and run.verdict.failed) or bool(run.output_errors)
        if failed and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _complete(group: GroupInput, aborted: str | None) -> bool:
    """Whether the run (or a config) has an answer for every problem it set out to ask:
    then its started server's answers are not reused by the next run."""
    if aborted or group.selection.interrupted:
        return False
    return bool(group.records) and not any(r["outcome"] == "error" for r in group.records)


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


def _our_stop_under_xdist(exc: BaseException, state: State) -> bool:
    """Whether ``exc`` is xdist's Interrupted for the stop an aborted engine asked for."""
    return (
        type(exc).__name__ == "Interrupted"
        and type(exc).__module__.startswith("xdist")
        and state.run.aborted is not None
        and str(exc).startswith("gsm8k:")
    )


def _no_model_under_xdist(exc: BaseException) -> bool:
    """Whether ``exc`` is xdist's Interrupted for a worker's :data:`NO_MODEL` stop."""
    return (
        type(exc).__name__ == "Interrupted"
        and type(exc).__module__.startswith("xdist")
        and str(exc).startswith(NO_MODEL)
    )


def _uses_default_model(item: pytest.Item) -> bool:
    """Whether ``item`` gets ``gsm8k_model`` from the plugin's own fixture (which needs
    --gsm8k-model or --gsm8k-serve): not parametrized, not overridden by its module or class
    (a conftest's or plugin's override is checked once, by the caller)."""
    if "gsm8k_model" not in getattr(item, "fixturenames", ()):
        return False
    from pytest_gsm8k.fixtures import defines_fixture

    callspec = getattr(item, "callspec", None)
    if callspec is not None and "gsm8k_model" in callspec.params:
        return False
    holders = (getattr(item, "module", None), getattr(item, "cls", None))
    return not any(h is not None and defines_fixture(h, ("gsm8k_model",)) for h in holders)


def _has_problem(item: pytest.Item) -> bool:
    from pytest_gsm8k.core.types import Problem

    callspec = getattr(item, "callspec", None)
    return callspec is not None and isinstance(callspec.params.get("gsm8k_problem"), Problem)


def unmeasured(session: pytest.Session, items: list[pytest.Item]) -> str | None:
    """Why a run given no model (no --gsm8k-model, no --gsm8k-serve) cannot do what it
    was asked, as one line; None when it can.

    Tests that take the plugin's ``gsm8k_model`` would each fail the same way (1,319
    tracebacks); gsm8k options on the command line with no GSM8K item to measure would
    gate nothing and still exit green. ``--co`` lists, and asks for no model; a collection
    error (bad data included) has its own line.
    """
    from pytest_gsm8k.fixtures import plugins_define
    from pytest_gsm8k.state import get_state

    config = session.config
    state = get_state(config)
    settings = state.settings
    option = config.option
    if settings.model or settings.serve or settings.vllm_config or option.collectonly:
        return None
    if session.testsfailed or state.run.data_error:
        return None
    if getattr(option, "setupplan", False):
        return None
    usage = "pass --gsm8k-model=ID (with --gsm8k-base-url=URL, ending in /v1) or --gsm8k-serve CMD"
    needing = [item for item in items if _uses_default_model(item)]
    if needing and not plugins_define(config, ("gsm8k_model",)):
        more = f" and {len(needing) - 1} more" if len(needing) > 1 else ""
        return (
            f"{NO_MODEL}: {needing[0].nodeid}{more} use the gsm8k_model fixture; {usage}, "
            "or override gsm8k_model in a conftest.py"
        )
    if any(_has_problem(item) for item in items):
        return None
    if _selects_gsm8k(getattr(option, "markexpr", "")):
        return (
            f"{NO_MODEL}: -m {option.markexpr!r} selects the GSM8K items, which exist only "
            f"with a model: {usage} (or gsm8k_model in the ini)"
        )
    asked = [o.flag for o in OPTIONS if config.getoption(o.dest) is not None]
    if not asked:
        return None
    return (
        f"{NO_MODEL} and no test uses the gsm8k fixtures, so nothing was measured or gated "
        f"({', '.join(asked)} given): {usage}, or run a test that uses gsm8k_outcome"
    )


def _selects_gsm8k(markexpr: str) -> bool:
    """Whether ``-m markexpr`` asks for the GSM8K items: true for an item with only the
    ``gsm8k`` marker and false for one without it (``-m gsm8k``, ``-m "gsm8k and not slow"``;
    not ``-m "not gsm8k"``). Read as Python's ``and``/``or``/``not`` over marker names, which
    is pytest's grammar; an expression with anything else (keyword arguments) is left alone."""
    tokens = re.findall(r"\(|\)|[^\s()]+", markexpr)
    if not tokens or any(not re.fullmatch(r"[()]|[A-Za-z_][\w.-]*", t) for t in tokens):
        return False
    words = {"and", "or", "not", "(", ")"}

    def value(gsm8k: bool) -> bool:
        text = " ".join(t if t in words else str(gsm8k if t == "gsm8k" else False) for t in tokens)
        try:
            return bool(eval(text, {"__builtins__": {}}, {}))  # only True/False/and/or/not
        except SyntaxError:
            return False

    return value(True) and not value(False)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> Generator[None, None, None]:
    """After every plugin has filtered the items (-k, -m, --lf): a run that needs a model and
    has none ends here, with one line (:func:`unmeasured`), before any test runs.

    An xdist worker cannot end the session with a usage error (the controller would crash):
    it runs nothing and stops with the line, which the controller raises."""
    yield
    plugin = config.pluginmanager.get_plugin(STATE_NAME)
    if (
        isinstance(plugin, StatePlugin)
        and plugin._idle()
        and not any("gsm8k_model" in getattr(item, "fixturenames", ()) for item in items)
        and not _selects_gsm8k(getattr(config.option, "markexpr", ""))
    ):
        return  # no GSM8K work: nothing asked for, nothing to refuse
    message = unmeasured(session, items)
    if message is None:
        return
    items[:] = []
    if hasattr(config, "workerinput"):
        session.shouldstop = message
        return
    raise pytest.UsageError(message)


class BuiltinModule(pytest.Module):
    """The built-in test module, collected under the short node id ``gsm8k``."""


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gsm8k: a GSM8K problem item (-m gsm8k: only the gate)")
    notes: list[str] = []
    try:
        settings = build_settings(
            lambda o: _read_option(config, o),
            notes.append,
            lambda path: (config.invocation_params.dir / Path(path).expanduser()).exists(),
            lambda o: config.getoption(o.dest) is None,  # not on the command line: the ini's
        )
    except SettingsError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    if not hasattr(config, "workerinput"):  # once, not once per xdist worker
        for note in [*notes, *_spaced_paths(config)]:
            config.issue_config_time_warning(pytest.PytestWarning(f"gsm8k: {note}"), stacklevel=2)
    plugin = StatePlugin(config, settings)
    # Made now when the session start has work for it (a model to reach or a server to
    # start, an output to check) or a gsm8k option is on the command line (with no model it
    # is refused after collection); ini values alone, as README's "In your repository" sets
    # them, wait for a GSM8K item: the repository's other runs do not pay for the State.
    given = any(config.getoption(option.dest) is not None for option in OPTIONS)
    work = settings.model or settings.serve or settings.vllm_config
    if given or work or settings.report or settings.html or settings.markdown:
        plugin.state  # noqa: B018 - made here, on purpose
    config.pluginmanager.register(plugin, STATE_NAME)
    # Registered before the builtin unraisableexception plugin's cleanup, so it runs after
    # that one's gc passes (see pytest_runtestloop); it does nothing if nothing was frozen.
    # An xdist worker's process ends right after: leaving its objects frozen spares the
    # interpreter's final collection too, which the controller waits for.
    if not hasattr(config, "workerinput"):
        config.add_cleanup(_unfreeze_until_exit)


_freeze_at_exit = False


def _unfreeze_until_exit() -> None:
    """Give the objects frozen for the run back to the collector (pytest may run again in
    this process: pytester, an IDE), and freeze whatever is left once the interpreter exits.

    At exit CPython walks every object it tracks in two full collections, a visible part
    of a full run's wall time spent on memory the operating system takes back anyway.
    Frozen objects are still freed by reference counting when modules are cleared, and
    atexit hooks (logging's flush, weakref finalizers) still run: only cyclic garbage left
    at exit is not collected.
    """
    global _freeze_at_exit
    if gc.get_freeze_count() and not _freeze_at_exit:
        _freeze_at_exit = True
        atexit.register(gc.freeze)
    gc.unfreeze()


#: what the KeyboardInterrupt that SIGTERM raises says
SIGTERM_MESSAGE = "SIGTERM"


def _end_on_sigterm(config: pytest.Config) -> None:
    """SIGTERM (a CI job cancelled, ``timeout``, ``kill``) ends the run like Ctrl-C: the
    summary is printed, the report written, xdist's workers stopped. Only in the main
    process, only over the default handler, restored when pytest unconfigures."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # somebody else's handler: leave it alone

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
        raise KeyboardInterrupt(SIGTERM_MESSAGE)

    signal.signal(signal.SIGTERM, on_sigterm)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    config.add_cleanup(restore)


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.pluginmanager.get_plugin(STATE_NAME)
    if isinstance(plugin, StatePlugin):
        if not plugin._idle():
            plugin.state.close()
        config.pluginmanager.unregister(plugin, STATE_NAME)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gsm8k_problem" not in metafunc.fixturenames:
        return
    from pytest_gsm8k.core.dataset import DatasetError
    from pytest_gsm8k.state import get_state

    state = get_state(metafunc.config)
    try:
        problems = state.plan.run_order
    except DatasetError as exc:
        if state.is_worker:
            # An xdist worker cannot end the session with a usage error (the controller,
            # which never collects, would crash); a CollectError is one line per module.
            raise pytest.Collector.CollectError(f"gsm8k: {exc}") from None
        # Raised here (inside a collector) it would become a collection error with a
        # traceback; pytest_collection_finish raises it as one usage-error line instead.
        state.run.fail_data(f"gsm8k: {exc}")
        return
    # Every item of a problem carries the ``gsm8k`` marker (the built-in test's and a
    # user's own), so ``pytest -m gsm8k`` runs only the gate in a repository with other tests.
    metafunc.parametrize(
        "gsm8k_problem", [pytest.param(p, id=p.id, marks=GSM8K_MARK) for p in problems]
    )
