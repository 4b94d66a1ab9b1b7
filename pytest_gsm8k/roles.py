"""The role plugins, one per process as pytest-xdist registers ``DSession`` and
``WorkerInteractor``: RunRole, ControllerRole, WorkerRole. A role makes its Gsm8kSession on
first use; until then every hook returns at once, importing nothing of the run (issue 34)."""

from __future__ import annotations

import gc
import json
import os
import signal
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.fixtures import RECORD_KEY, problem_of, unmeasured

if TYPE_CHECKING:
    from pytest_gsm8k.reporting import ProgressLine
    from pytest_gsm8k.session import Gsm8kSession

SIGTERM_MESSAGE = "SIGTERM"  # what the KeyboardInterrupt that SIGTERM raises says


class Role:
    """What every role holds: the settings, the run's id and start, the session once made."""

    aggregates = False  # SIGTERM ends its run like Ctrl-C; its session registers reporting.py

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        given = getattr(config, "workerinput", {})
        self.config, self.settings = config, settings
        self.run_id = str(given.get("gsm8k_run_id") or os.urandom(16).hex())
        self.started = float(given.get("gsm8k_run_started") or time.time())
        self.active = False
        self.stops: dict[str, str] = {}  # why a worker stopped ("refused": its line, "aborted")
        self._session: Gsm8kSession | None = None

    @property
    def session(self) -> Gsm8kSession:
        if self._session is None:
            from pytest_gsm8k.session import Gsm8kSession

            self._session = Gsm8kSession(self.config, self.settings, self.run_id, self.started)
            if self.aggregates:
                from pytest_gsm8k import reporting

                self.config.pluginmanager.register(reporting, "gsm8k-reporting")
        return self._session

    def idle(self) -> bool:
        return self._session is None

    def pytest_unconfigure(self) -> None:
        if self._session is not None:
            self._session.close()

    def activate(self) -> None:
        """Once, only in a run with GSM8K work: the HTTP libraries' log records scrubbed; where
        the run is decided, SIGTERM (a CI job cancelled, ``timeout``) ends it like Ctrl-C:
        summary, report, workers stopped. Only over the default handler, in the main thread,
        until unconfigure."""
        if self.active:
            return
        self.active = True
        from pytest_gsm8k.runtime.logs import scrub_library_logs

        self.config.add_cleanup(scrub_library_logs(self.session.scrubber()))
        main = threading.current_thread() is threading.main_thread()
        if not (self.aggregates and main and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):
            return  # not the main thread, or somebody else's handler: leave it alone

        def on_sigterm(signum: int, frame: Any) -> None:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
            raise KeyboardInterrupt(SIGTERM_MESSAGE)

        def restore() -> None:
            if signal.getsignal(signal.SIGTERM) is on_sigterm:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)

        signal.signal(signal.SIGTERM, on_sigterm)
        self.config.add_cleanup(restore)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if self.settings.asked and not self.idle():
            self.activate()

    # named pytest_* even with a specname: pytest ignores any other (a `freeze` never ran)
    @pytest.hookimpl(specname="pytest_runtestloop", tryfirst=True)
    def pytest_runtestloop_freeze(self, session: pytest.Session) -> None:
        """What is alive now lives to the end: out of the collector's way (benchmarks/README.md)."""
        if self.active:
            gc.freeze()


class Collector(Role):
    """A process that collects and runs the items: a run without xdist, an xdist worker."""

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, items: list[pytest.Item]
    ) -> Generator[None, None, None]:
        """The built-in test joins when a model is asked for (before -k/-m/--lf filter);
        after every filter, a run that needs a model and has none ends with one line."""
        if self.settings.asked:
            from pytest_gsm8k import builtin

            module = pytest.Module.from_parent(session, path=Path(builtin.__file__), nodeid="gsm8k")
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
        """Which problems this process runs, in run order: the prefetcher starts now."""
        if self.idle():
            return
        from pytest_gsm8k.core.types import Problem
        from pytest_gsm8k.serving import fetch

        if (run := self.session.run).data_error:
            raise pytest.UsageError(run.data_error)
        problems = {i.nodeid: p for i in session.items if isinstance(p := problem_of(i), Problem)}
        run.collect(list({p.id: p for p in problems.values()}.values()))
        places = {i.nodeid: i.location for i in session.items}
        run.collect_items(places, {nodeid: p.id for nodeid, p in problems.items()})
        if problems:
            self.activate()
        fetch(self.session, session)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any]
    ) -> Generator[None, object, object]:
        """Only a session-scoped ``gsm8k_model`` may be prefetched."""
        value = yield
        if fixturedef.argname == "gsm8k_model":
            self.session.sources.note_scope(value, fixturedef.scope)
        return value

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        """A GSM8K item's reports carry its problem's id and its record to the aggregator."""
        report = yield
        if not self.idle() and (problem := problem_of(item)) is not None:
            report.gsm8k_problem = problem.id  # type: ignore[attr-defined]
        record = item.stash.get(RECORD_KEY, None)
        if record is not None and (
            report.when == "call" or (report.when == "setup" and record["outcome"] == "error")
        ):
            report.gsm8k = record  # type: ignore[attr-defined]
            if record.get("aborted"):  # the endpoint failure stopped the run
                self.stops["aborted"] = "yes"
        return report


class Aggregator(Role):
    """A process that gathers the reports and decides: a run without xdist, the controller."""

    progress: ProgressLine | None = None  # while the test loop runs (None: the dots)
    controller = False  # an xdist controller: its DSession hands out the items
    aggregates = True

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Before any request (on the controller: before xdist starts the workers, whose
        ``workerinput`` carries what is settled here): outputs, data, servers, preflight."""
        if not self.idle():
            super().pytest_sessionstart(session)
            from pytest_gsm8k.serving import start

            start(self.session, controller=self.controller)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Each report noted, a record tallied and fed to the early stop (an xdist controller
        learns of GSM8K work from the first GSM8K item's report)."""
        problem_id = getattr(report, "gsm8k_problem", None)
        if self.idle() and problem_id is None:
            return
        self.session.run.note_report(report.nodeid, problem_id)
        record = getattr(report, "gsm8k", None)
        if getattr(report, "gsm8k_unfinished", False) or not isinstance(record, dict):
            return  # an item never reached (the summary counts it), or no record
        self.activate()
        if (message := self.session.observe(record, report.nodeid)) is not None:  # type: ignore[arg-type]
            loop = self.config.pluginmanager.getplugin("dsession" if self.controller else "session")
            loop.shouldstop = message  # no more items handed out
        if self.progress is not None:
            self.progress.draw(self.session)

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """After all items: the verdict and every output (also when interrupted). Innermost
        of the loop's wrappers: the reports of the items a stopped run never reached are in
        before the terminal writes its final progress."""
        if self.settings.asked or self.active:
            from pytest_gsm8k.reporting import ProgressLine

            self.progress = ProgressLine.wanted(self.config, self.settings.progress)
        try:
            return (yield)
        except BaseException as exc:
            if "refused" in self.stops:  # the workers' one line, once
                raise pytest.UsageError(self.stops["refused"]) from None
            if self.idle():
                raise
            run = self.session.run
            if str(exc) == run.stopped.get(""):  # the run's own early stop
                return True  # the gates' verdicts are settled: a finished run, not interrupted
            run.interrupt()  # stopped before the end (complete: false)
            if self.controller and "aborted" in self.stops:  # a worker's (a plain run's too)
                from xdist.dsession import Interrupted  # type: ignore[import-untyped]

                if isinstance(exc, Interrupted):
                    return True  # an endpoint failure: a failed run (exit 1), as without xdist
            if isinstance(exc, KeyboardInterrupt) and exc.args == (SIGTERM_MESSAGE,):
                # SIGTERM lands in any frame, some of which pytest cannot show (a line number
                # of -1 crashed its report): the run ends from here, a traceback it can print
                raise KeyboardInterrupt(SIGTERM_MESSAGE) from None
            raise
        finally:
            if not self.idle():
                if self.progress is not None and self.session.run.records:
                    self.progress.draw(self.session, final=True)  # where the loop ended
                from pytest_gsm8k.reporting import finish

                finish(self.session)
                if (answers := self.session.sources.answer_server) is not None:
                    # now, not at unconfigure: execnet gives a worker still in an item 5 s when
                    # xdist stops it, and after an interrupt one may wait here for an answer
                    answers.close()


class RunRole(Collector, Aggregator):
    """A run without xdist: one process collects, fetches, runs and decides."""


class ControllerRole(Aggregator):
    """The xdist controller: it collects nothing, serves its engine's answers to the workers
    (session.py, Sources) and aggregates their reports."""

    controller = True

    def pytest_configure_node(self, node: Any) -> None:
        """Each worker gets the run's identity; with GSM8K work, the endpoint and the answers
        channel's address."""
        given = node.workerinput
        given.update(gsm8k_run_id=self.run_id, gsm8k_run_started=self.started)
        if self.idle():
            return
        at = self.session.endpoint()
        given["gsm8k_endpoint"] = [at.base_url, at.model, at.identity]
        if (answers := self.session.sources.answer_server) is not None:
            given.update(gsm8k_answers=list(answers.address), gsm8k_answers_token=answers.token)

    def pytest_testnodedown(self, node: Any) -> None:
        """A worker's end (before xdist raises its Interrupted): why it stopped."""
        mine = (getattr(node, "workeroutput", None) or {}).get("gsm8k") or {}
        self.stops.update({k: str(v) for k, v in mine.items()})

    @pytest.hookimpl(wrapper=True)
    def pytest_report_from_serializable(self) -> Generator[None, object, object]:
        """A record sent as JSON text, read back (on execnet's threads: no session here)."""
        report = yield
        if isinstance(text := getattr(report, "gsm8k", None), str):
            report.gsm8k = json.loads(text)  # type: ignore[attr-defined]
        return report

    @pytest.hookimpl(specname="pytest_runtest_logreport", tryfirst=True)
    def pytest_runtest_logreport_items(self, report: pytest.TestReport) -> None:
        """A worker's first report: the items it collected, where they are and their problems
        (xdist's collection event has the node ids only), for those a stopped run never
        reached (reported with the answer that arrived)."""
        if isinstance(items := getattr(report, "gsm8k_items", None), dict):
            run = self.session.run
            run.collect_items({n: tuple(at) for n, at in items["refs"]}, items["problems"])
            run.learn_collected_ids(items["problems"].values())


class WorkerRole(Collector):
    """An xdist worker: it runs what the controller hands it and asks the controller's engine."""

    items_sent = False

    def refuse(self, session: pytest.Session, message: str) -> None:
        """A usage error here would crash the controller: the line goes in workeroutput."""
        session.shouldstop = self.stops["refused"] = message

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Why this worker stopped, for the controller's pytest_testnodedown."""
        if self.stops:
            getattr(self.config, "workeroutput")["gsm8k"] = self.stops  # noqa: B009 - xdist's

    @pytest.hookimpl(wrapper=True)
    def pytest_report_to_serializable(
        self, report: pytest.CollectReport | pytest.TestReport
    ) -> Generator[None, dict[str, Any] | None, dict[str, Any] | None]:
        """A record travels as JSON text (execnet refuses a lone surrogate); the first test
        report carries the items collected here (see pytest_runtest_logreport_items)."""
        data = yield
        if not isinstance(data, dict):
            return data
        if not self.items_sent and isinstance(report, pytest.TestReport):
            self.items_sent = True
            if not self.idle() and (run := self.session.run).problem_of:
                refs = list(run.items.items())
                data["gsm8k_items"] = {"refs": refs, "problems": dict(run.problem_of)}
        if isinstance(record := data.get("gsm8k"), dict):
            data["gsm8k"] = json.dumps(record)  # ASCII: \uXXXX keeps a lone surrogate exactly
        return data


def role_for(config: pytest.Config, settings: Settings) -> Role:
    """An xdist worker, the controller of a run xdist distributes (as xdist decides it:
    ``--dist`` and ``--tx``, not with ``--co``), or a run of its own."""
    if hasattr(config, "workerinput"):
        return WorkerRole(config, settings)
    option = config.option
    distributes = getattr(option, "dist", "no") != "no" and getattr(option, "tx", None)
    return (ControllerRole if distributes and not option.collectonly else RunRole)(config, settings)
