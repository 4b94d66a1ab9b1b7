"""The role plugins, one per process as pytest-xdist registers ``DSession`` and
``WorkerInteractor``: RunRole, ControllerRole, WorkerRole; Collector and Aggregator hold what
the collecting and the aggregating processes share. A role makes its Gsm8kSession on first
use; until then every hook returns at once, importing nothing of the run (issue 34).
"""

from __future__ import annotations

import gc
import json
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.fixtures import RECORD_KEY, unmeasured

if TYPE_CHECKING:
    from pytest_gsm8k.reporting import ProgressLine
    from pytest_gsm8k.session import Gsm8kSession

BUILTIN_NODEID = "gsm8k"
#: what the KeyboardInterrupt that SIGTERM raises says
SIGTERM_MESSAGE = "SIGTERM"


class BuiltinModule(pytest.Module):
    """The built-in test module, collected under the short node id ``gsm8k``."""


class Role:
    """What every role holds: the settings, the run's id and start, the session."""

    def __init__(
        self,
        config: pytest.Config,
        settings: Settings,
        run_id: str,
        started: float,
        on_activate: Callable[[], None] = lambda: None,
    ) -> None:
        self.config = config
        self.settings = settings
        self.run_id = run_id
        self.started = started
        self.on_activate = on_activate  # the main process: SIGTERM ends the run like Ctrl-C
        self._session: Gsm8kSession | None = None
        self.active = False

    @property
    def asked(self) -> bool:
        """A model, a server or configs to ask: GSM8K work from the start."""
        return bool(self.settings.model or self.settings.serve or self.settings.vllm_config)

    @property
    def session(self) -> Gsm8kSession:
        if self._session is None:
            from pytest_gsm8k.session import Gsm8kSession

            workerinput = getattr(self.config, "workerinput", None)
            self._session = Gsm8kSession(
                self.config, self.settings, self.run_id, self.started, workerinput
            )
            self._made()
        return self._session

    def idle(self) -> bool:
        return self._session is None

    def _made(self) -> None:  # what a role adds to its session once it exists
        pass

    def activate(self) -> None:
        """What a GSM8K run changes in the process, once and only in a run with GSM8K work:
        the HTTP libraries' log records scrubbed of the key, and ``on_activate``."""
        if self.active:
            return
        self.active = True
        from pytest_gsm8k.runtime.logs import scrub_library_logs

        self.config.add_cleanup(scrub_library_logs(self.session.scrubber()))
        self.on_activate()

    # A hook method's name must start with "pytest_" even with a specname: pytest ignores
    # any other name (a `freeze` here was silently never called).
    @pytest.hookimpl(specname="pytest_runtestloop", tryfirst=True)
    def pytest_runtestloop_freeze(self, session: pytest.Session) -> None:
        """What is alive now lives to the end: out of the collector's way, so the run's
        collections walk only what the run made (benchmarks/README.md)."""
        if self.active:
            gc.freeze()


class Collector(Role):
    """A process that collects and runs the items: a run without xdist, an xdist worker."""

    aborted = False  # an item's record said the endpoint failure stopped the run

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> Generator[None, None, None]:
        """The built-in test joins when a model is asked for (before -k/-m/--lf filter);
        once every plugin has filtered, a run that needs a model and has none ends here
        with one line (:func:`~pytest_gsm8k.fixtures.unmeasured`)."""
        if self.asked:
            from pytest_gsm8k import builtin

            path = Path(builtin.__file__)
            module = BuiltinModule.from_parent(session, path=path, nodeid=BUILTIN_NODEID)
            items.extend(session.genitems(module))
        yield
        message = unmeasured(session, items, self.idle())
        if message is not None:
            items[:] = []
            self.refuse(session, message)

    def refuse(self, session: pytest.Session, message: str) -> None:
        raise pytest.UsageError(message)

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Which problems this process runs, in run order, for the prefetcher, which
        starts now (not at the first test)."""
        if self.idle():
            return
        from pytest_gsm8k.channel import fetches_now
        from pytest_gsm8k.core.tally import ItemRef
        from pytest_gsm8k.core.types import Problem

        run = self.session.run
        if run.data_error:
            raise pytest.UsageError(run.data_error)
        planned: dict[str, Problem] = {}
        problems: dict[str, str] = {}
        for item in session.items:
            problem = _problem(item)
            if isinstance(problem, Problem):
                planned.setdefault(problem.id, problem)
                problems[item.nodeid] = problem.id
        run.collect(list(planned.values()))
        run.collect_items([ItemRef(i.nodeid, i.location) for i in session.items], problems)
        if planned:
            self.activate()
        if fetches_now(self.session, session):
            self.start_fetching(session)

    def start_fetching(self, session: pytest.Session) -> None:
        raise NotImplementedError

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Generator[None, object, object]:
        """Remember the scope of every ``gsm8k_model`` value: only a session-scoped model
        may be prefetched (a narrower one exists for its own items only)."""
        value = yield
        if fixturedef.argname == "gsm8k_model":
            self.session.sources.note_scope(value, fixturedef.scope)
        return value

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """A GSM8K item's reports carry its problem's id, and its record (the call's, or
        the setup's error), to whichever process aggregates."""
        report = yield
        if self.idle():
            return report
        problem = _problem(item)
        if problem is not None:
            report.gsm8k_problem = problem.id  # type: ignore[attr-defined]
        record = item.stash.get(RECORD_KEY, None)
        if record is not None and (
            report.when == "call" or (report.when == "setup" and record["outcome"] == "error")
        ):
            report.gsm8k = record  # type: ignore[attr-defined]
            self.aborted = self.aborted or bool(record.get("aborted"))
        return report


class Aggregator(Role):
    """A process that gathers the reports and decides: a run without xdist, the controller."""

    #: the progress line, while the test loop runs (None: the dots)
    progress: ProgressLine | None = None
    pytest_session: pytest.Session | None = None

    def stop(self, message: str) -> None:  # the early stop decided
        raise NotImplementedError

    def start_answers(self, overridden: bool) -> None:
        raise NotImplementedError

    def refused(self) -> str | None:  # a worker's no-model line
        return None

    def stopped_by_worker(self, exc: BaseException) -> bool:  # see ControllerRole
        return False

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Before any request (on the controller: before xdist starts the workers, whose
        ``workerinput`` carries what is settled here): outputs, data, servers, preflight."""
        self.pytest_session = session
        if self.idle():
            return
        if self.asked:
            self.activate()
        from pytest_gsm8k.channel import start

        overridden = start(self.session, session.config)
        if overridden is not None:
            self.start_answers(overridden)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Each report: noted, and a record tallied and fed to the early stop (an xdist
        controller learns of GSM8K work from the first GSM8K item's report)."""
        problem_id = getattr(report, "gsm8k_problem", None)
        if self.idle() and problem_id is None:
            return
        from pytest_gsm8k.reporting import is_unfinished

        state = self.session
        state.run.note_report(report.nodeid, problem_id)
        record = getattr(report, "gsm8k", None)
        if is_unfinished(report) or not isinstance(record, dict):
            return  # an item never reached (the summary counts it), or no record
        self.activate()
        message = state.observe(record)  # type: ignore[arg-type]
        if message is not None:
            self.stop(message)
        if self.progress is not None and self.progress.due():
            self._draw_progress()

    def _draw_progress(self) -> None:
        assert self.progress is not None
        state = self.session
        state.learn_plans()
        self.progress.draw(state.run.records, len(state.run.collected_ids or ()))

    def pytest_report_teststatus(
        self, report: pytest.TestReport, config: pytest.Config
    ) -> tuple[str, str, str | tuple[str, dict[str, bool]]] | None:
        if self.idle():
            return None
        from pytest_gsm8k.reporting import teststatus

        return teststatus(report, self.progress is not None)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """After all items: the verdict and every output (also when interrupted). Innermost
        of the loop's wrappers, so that the reports of the items a stopped run never reached
        are in before the terminal writes its final progress."""
        if self.asked or self.active:
            from pytest_gsm8k.reporting import ProgressLine, progress_wanted

            if progress_wanted(self.config, self.settings.progress):
                self.progress = ProgressLine(self.config)
        try:
            return (yield)
        except BaseException as exc:
            refused = self.refused()
            if refused is not None:
                raise pytest.UsageError(refused) from None  # the workers' one line, once
            if self.idle():
                raise
            run = self.session.run
            if run.early_stopped is not None and str(exc) == run.early_stopped:
                return True  # the gates' verdicts are settled: a finished run, not interrupted
            run.interrupt()  # stopped before the end (complete: false)
            if self.stopped_by_worker(exc):
                return True
            if isinstance(exc, KeyboardInterrupt) and exc.args == (SIGTERM_MESSAGE,):
                # SIGTERM lands in whatever frame runs, some of which pytest cannot show
                # (a line number of -1 makes its report of the interrupt crash): the run
                # ends from here, with a traceback pytest can print
                raise KeyboardInterrupt(SIGTERM_MESSAGE) from None
            raise
        finally:
            if not self.idle():
                if self.progress is not None and self.session.run.records:
                    self._draw_progress()  # where the loop ended
                from pytest_gsm8k.writing import finish

                finish(self.session, session.config)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.idle():
            from pytest_gsm8k.reporting import summarize

            summarize(terminalreporter, self.session)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.idle():
            from pytest_gsm8k.reporting import gate_exit

            gate_exit(session, self.session)


class RunRole(Collector, Aggregator):
    """A run without xdist: one process collects, fetches, runs and decides."""

    def start_answers(self, overridden: bool) -> None:
        """Start the engine for the plugin's own client now, importing the HTTP client on
        its thread while pytest collects (the plan follows at the end of collection)."""
        from pytest_gsm8k.channel import warm_engine

        option = self.config.option
        dry = option.collectonly or getattr(option, "setupplan", False)
        if not overridden and not self.settings.vllm_config and not dry:
            warm_engine(self.session)

    def start_fetching(self, session: pytest.Session) -> None:
        from pytest_gsm8k.channel import fetch

        fetch(self.session, session)

    def stop(self, message: str) -> None:
        if self.pytest_session is not None:
            self.pytest_session.shouldstop = message


class ControllerRole(Aggregator):
    """The xdist controller: it collects nothing, serves its one engine's answers to the
    workers over the answers channel (channel.py) and aggregates their reports."""

    _node_ids: list[str] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: why workers stopped, from their ``workeroutput``: "refused" (its line), "aborted"
        self.worker_stops: dict[str, str] = {}

    def start_answers(self, overridden: bool) -> None:
        from pytest_gsm8k.channel import head_start_allowed, start_controller

        ahead = not overridden and not self.settings.vllm_config
        ahead = ahead and head_start_allowed(self.config)
        self.session.sources.use_answer_server(start_controller(self.session, ahead))

    def stop(self, message: str) -> None:
        dsession = self.config.pluginmanager.get_plugin("dsession")
        assert dsession is not None
        dsession.shouldstop = message  # xdist stops handing out items

    def refused(self) -> str | None:
        return self.worker_stops.get("refused")

    def stopped_by_worker(self, exc: BaseException) -> bool:
        """xdist's Interrupted for a worker that stopped on an endpoint failure: a failed
        run (exit 1, its errored items), as without xdist, not an interrupted one (2)."""
        from xdist.dsession import Interrupted  # type: ignore[import-untyped]

        return isinstance(exc, Interrupted) and "aborted" in self.worker_stops

    def pytest_configure_node(self, node: Any) -> None:
        """Each worker gets the run's identity; with GSM8K work, the endpoint (a server this
        run started, what it serves) and the answers channel's address."""
        given = node.workerinput
        given["gsm8k_run_id"] = self.run_id
        given["gsm8k_run_started"] = self.started  # what --gsm8k-resume reads
        if self.idle():
            return
        endpoint = self.session.endpoint()
        given["gsm8k_base_url"] = endpoint.base_url
        given["gsm8k_model"] = endpoint.model
        given["gsm8k_server_identity"] = endpoint.identity
        answers = self.session.sources.answer_server
        if answers is not None:
            given["gsm8k_answers"] = list(answers.address)
            given["gsm8k_answers_token"] = answers.token

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """The items the workers collected (node ids and locations): a stopped run reports
        those no worker reached. Their problems come with the reports and workeroutput."""
        if self._node_ids is None:
            self._node_ids = list(ids)
            if not self.idle():
                self._made()

    def _made(self) -> None:
        from pytest_gsm8k.core.tally import ItemRef

        self.session.run.collect_items([ItemRef.of(n) for n in self._node_ids or ()])

    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """A worker's end (xdist calls this before it raises its Interrupted): why it
        stopped, from its ``workeroutput``."""
        mine = (getattr(node, "workeroutput", None) or {}).get("gsm8k") or {}
        self.worker_stops.update({k: str(v) for k, v in mine.items()})

    @pytest.hookimpl(wrapper=True)
    def pytest_report_from_serializable(
        self, data: dict[str, Any]
    ) -> Generator[None, object, object]:
        """A record sent as JSON text, read back (on execnet's threads: no session here)."""
        report = yield
        text = getattr(report, "gsm8k", None)
        if isinstance(text, str):
            report.gsm8k = json.loads(text)  # type: ignore[attr-defined]
        return report

    @pytest.hookimpl(specname="pytest_runtest_logreport", tryfirst=True)
    def pytest_runtest_logreport_items(self, report: pytest.TestReport) -> None:
        """A worker's first report carries the problem of each item it collected (without
        it, an item a stopped run never reached is reported as skipped even when its
        answer had arrived and is scored)."""
        items = getattr(report, "gsm8k_items", None)
        if isinstance(items, dict):
            self.session.run.collect_items((), items)
            self.session.run.learn_collected_ids(items.values())


class WorkerRole(Collector):
    """An xdist worker: it collects and runs what the controller hands it, asks the
    controller's engine (channel.py), and sends back what it alone knows at its end."""

    refused_line: str | None = None
    items_sent = False

    def refuse(self, session: pytest.Session, message: str) -> None:
        """A worker cannot end the session with a usage error (the controller would crash):
        it runs nothing and stops, and its workeroutput carries the line to the controller."""
        session.shouldstop = message
        self.refused_line = message

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if not self.idle() and self.asked:
            self.activate()

    def start_fetching(self, session: pytest.Session) -> None:
        """The controller's answers, this worker's plan offered on the channel (with an
        override, only the plan: each model's engine starts at its first fixture setup)."""
        from pytest_gsm8k.channel import connect
        from pytest_gsm8k.fixtures import overrides_present

        channel = connect(self.session, remote=not overrides_present(session))
        if channel is not None:
            self.session.sources.use_channel(channel)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Why this worker stopped, for the controller's pytest_testnodedown."""
        out = {"refused": self.refused_line, "aborted": "yes" if self.aborted else None}
        stops = {key: value for key, value in out.items() if value is not None}
        if stops:
            getattr(self.config, "workeroutput")["gsm8k"] = stops  # noqa: B009 - xdist's

    @pytest.hookimpl(wrapper=True)
    def pytest_report_to_serializable(
        self, report: pytest.CollectReport | pytest.TestReport
    ) -> Generator[None, dict[str, Any] | None, dict[str, Any] | None]:
        """A record whose text UTF-8 cannot encode (a lone surrogate from a reply; execnet
        refuses such strings) travels as JSON text, which keeps it exactly. The first test
        report carries the problem of each item this worker collected (xdist's collection
        event has the node ids only): the controller knows the items before their reports,
        and those a stopped run never reaches."""
        data = yield
        if isinstance(data, dict) and not self.items_sent and isinstance(report, pytest.TestReport):
            self.items_sent = True
            if not self.idle() and self.session.run.problem_of:
                data["gsm8k_items"] = dict(self.session.run.problem_of)
        record = data.get("gsm8k") if isinstance(data, dict) else None
        if isinstance(data, dict) and isinstance(record, dict):
            from pytest_gsm8k.core.jsontext import escape_surrogates

            text = json.dumps(record, ensure_ascii=False)
            escaped = escape_surrogates(text)
            if escaped != text:
                data["gsm8k"] = escaped
        return data


def role_for(
    config: pytest.Config,
    settings: Settings,
    run_id: str,
    started: float,
    on_activate: Callable[[], None],
) -> Role:
    """The role this process plays: an xdist worker, the controller of a run xdist
    distributes (as xdist itself decides it: ``--dist`` and ``--tx``, not with ``--co``), or
    a run of its own."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        run_id = str(workerinput.get("gsm8k_run_id", run_id))
        started = float(workerinput.get("gsm8k_run_started", started))
        return WorkerRole(config, settings, run_id, started)
    option = config.option
    distributes = getattr(option, "dist", "no") != "no" and getattr(option, "tx", None)
    kind = ControllerRole if distributes and not option.collectonly else RunRole
    return kind(config, settings, run_id, started, on_activate)


def _problem(item: pytest.Item) -> Any:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("gsm8k_problem") if callspec is not None else None
