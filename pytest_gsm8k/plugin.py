"""pytest glue: options, parametrization, fixtures, report stream, gate.

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

import contextlib
import gc
import math
import os
import re
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from pytest_gsm8k.dataset import DatasetError, Split, load_split, select, train_source
from pytest_gsm8k.prompts import Exemplar, Protocol, draw_exemplars
from pytest_gsm8k.settings import OPTIONS, Option, Settings, SettingsError, build_settings
from pytest_gsm8k.types import Problem

RECORD_KEY = pytest.StashKey[dict[str, Any]]()
STATE_NAME = "gsm8k-state"
BUILTIN_NODEID = "gsm8k"

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
            group.addoption(option.flag, action="store_true", default=None, dest=option.dest,
                            help=option.help)
            parser.addini(option.dest, option.help, type="bool", default=None)
        elif option.kind == "list":
            group.addoption(option.flag, action="append", default=None, dest=option.dest,
                            metavar=option.metavar, help=option.help)
            parser.addini(option.dest, option.help, type="linelist", default=None)
        else:
            shown = f" (default {option.default})" if option.default not in (None, "") else ""
            group.addoption(option.flag, default=None, dest=option.dest,
                            metavar=option.metavar or option.name.upper(),
                            help=option.help + shown)
            parser.addini(option.dest, option.help, default=None)


def _read_option(config: pytest.Config, option: Option) -> Any:
    """Command line first, then the ini twin; None when neither is set."""
    value = config.getoption(option.dest)
    if value is not None:
        return value
    try:
        ini = config.getini(option.dest)
    except ValueError as exc:  # pytest's own conversion (type="bool"): a traceback otherwise
        raise SettingsError(f"ini {option.dest}: {exc}") from None
    if ini in (None, "", []):
        return None
    return ini


# -- per-process state -----------------------------------------------------------


def _safe_url(url: str) -> str:
    """A URL fit to print: credentials in it are removed."""
    parts = urlsplit(url)
    if parts.username or parts.password:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    return url


class State:
    """What one pytest process knows about the GSM8K run."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        self.is_worker = self.workerinput is not None
        self._split: Split | None = None
        self._selected: tuple[Problem, ...] | None = None
        self._protocol: Protocol | None = None
        self.pattern = re.compile(settings.answer_regex) if settings.answer_regex else None
        self.engines: dict[int, Any] = {}
        self.planned: list[Problem] = []
        #: problem ids the run collected (None until known; xdist: from the workers' ids)
        self.planned_ids: set[str] | None = None
        self.records: dict[str, dict[str, Any]] = {}
        self.summary: Any = None
        self.interrupted = False
        self.aborted: str | None = None
        self.data_error: str | None = None
        self.local_server: Any = None
        self.local_info: dict[str, Any] | None = None
        self.base_url = settings.resolved_base_url()
        self.model_name = settings.model
        if self.workerinput is not None:
            self.run_id = str(self.workerinput["gsm8k_run_id"])
            self.run_dir = Path(self.workerinput["gsm8k_run_dir"])
            self.base_url = self.workerinput.get("gsm8k_base_url") or self.base_url
            self.model_name = self.workerinput.get("gsm8k_model") or self.model_name
            self.workers = int(self.workerinput.get("workercount", 1))
        else:
            self.run_id = uuid.uuid4().hex[:12]
            self.run_dir = Path(tempfile.mkdtemp(prefix="gsm8k-run-"))
            self.workers = 1
        self._caches: dict[bool, Any] = {}
        self._default_client: Any = None
        self.follow: Any = None  # xdist worker: the controller fetches for it (engine.Follow)
        self.lead: Any = None  # xdist controller: the one fetcher (engine.Lead)

    # data and protocol, loaded lazily: a suite that never asks costs nothing

    def split(self) -> Split:
        if self._split is None:
            s = self.settings
            self._split = load_split(s.data, s.split, s.config, s.dataset)
        return self._split

    def selected(self) -> tuple[Problem, ...]:
        if self._selected is None:
            self._selected = select(self.split().problems, self.settings.limit, self.settings.seed)
        return self._selected

    def protocol(self) -> Protocol:
        if self._protocol is None:
            s = self.settings
            exemplars: tuple[Exemplar, ...] = ()
            train: tuple[tuple[str, str], ...] = ()
            source = "none"
            if s.preset:
                from pytest_gsm8k.presets import get_preset

                spec = get_preset(s.preset)
                pool_split = load_split(train_source(s.data), "train", s.config, s.dataset)
                train = tuple((p.question, p.answer) for p in pool_split.problems)
                source = spec.fewshot_source
            elif s.shots or s.fewshot_file:
                if s.fewshot_file:
                    pool_split = load_split(s.fewshot_file, "fewshot", s.config)
                    source = f"file {Path(s.fewshot_file).name}"
                else:
                    pool_split = load_split(train_source(s.data), "train", s.config, s.dataset)
                    source = f"train (seed {s.seed})"
                evaluated = {p.question for p in self.split().problems}
                pool = [Exemplar(p.question, p.answer) for p in pool_split.problems
                        if p.question not in evaluated]  # never show a test problem as a shot
                shots = s.shots if s.shots else len(pool)
                try:
                    exemplars = draw_exemplars(pool, shots, s.seed)
                except ValueError as exc:
                    raise DatasetError(str(exc)) from None
            self._protocol = Protocol(
                name=s.protocol,
                samples=s.samples,
                temperature=s.temperature,
                api=s.api,
                shots=len(exemplars) if not s.preset else s.shots,
                fewshot_source=source,
                exemplars=exemplars,
                train=train,
                preset=s.preset,
                system=s.system,
                max_tokens=s.max_tokens,
                stop=s.stop,
                extractor=s.extract,
                answer_regex=s.answer_regex,
            )
        return self._protocol

    # caches and engines

    def cache(self, persistent: bool) -> Any:
        from pytest_gsm8k.cache import ResponseCache

        persistent = persistent and not self.settings.no_cache
        root: Path | None = None
        if persistent:
            if self.settings.cache_dir:
                root = Path(self.settings.cache_dir).expanduser()
            elif getattr(self.config, "cache", None) is not None:
                root = self.config.cache.mkdir("gsm8k")
        if root is None:
            persistent = False
            root = self.run_dir / "cache"
        if persistent not in self._caches:
            self._caches[persistent] = ResponseCache(root, self.run_id, persistent=persistent)
        return self._caches[persistent]

    def default_client(self) -> Any:
        """The process's one OpenAI-compatible client (the same object every time)."""
        from pytest_gsm8k.client import Breaker, OpenAIClient

        if self._default_client is not None:
            return self._default_client
        if not self.model_name:
            raise pytest.UsageError(
                "gsm8k_model: no --gsm8k-model given and no gsm8k_model fixture override"
            )
        breaker = Breaker()
        client = OpenAIClient(
            model=self.model_name,
            base_url=self.base_url,
            api_key=self.settings.api_key(),
            timeout=self.settings.timeout,
            max_retries=self.settings.max_retries,
            concurrency=self.concurrency(),
            breaker=breaker,
        )
        self._default_client = client
        return client

    def concurrency(self) -> int:
        """The run's limit split over the xdist workers, so -n never multiplies the load."""
        return max(1, math.ceil(self.settings.concurrency / max(1, self.workers)))

    def engine_for(self, model: Any, protocol: Protocol) -> Any:
        from pytest_gsm8k.client import CallableClient
        from pytest_gsm8k.engine import Engine

        key = id(model)
        engine = self.engines.get(key)
        if engine is None:
            client = model
            if not hasattr(model, "complete"):
                if not callable(model):
                    raise pytest.UsageError(
                        f"gsm8k_model: expected a callable or a client, got {type(model).__name__}"
                    )
                client = CallableClient(model, concurrency=self.concurrency(),
                                        model=self.settings.model)
            engine = Engine(
                client,
                self.cache(bool(getattr(client, "persistent_cache", False))),
                concurrency=self.concurrency(),
                use_claims=self.is_worker,
                breaker=getattr(client, "breaker", None),
                share=_worker_share(self.workerinput),
                follow=self.follow if client is self._default_client else None,
            )
            self.engines[key] = engine
            engine.start([protocol.request(p) for p in self.planned])
        return engine

    def close(self) -> None:
        if self.lead is not None:
            self.lead.close()
            self.lead = None
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()
        if not self.is_worker:
            for cache in self._caches.values():
                cache.close()
            shutil.rmtree(self.run_dir, ignore_errors=True)
            if self.local_server is not None:
                self.local_server.stop()
                self.local_server = None

    # the summary

    def build_summary(self) -> Any:
        from pytest_gsm8k.outcome import error_record
        from pytest_gsm8k.summary import Summary

        selected = self.selected()
        records = dict(self.records)
        # What this run set out to do: the collected problems after -k/-m/--lf deselection.
        wanted = self.planned_ids if self.planned_ids is not None else {p.id for p in selected}
        ran = [p for p in selected if p.id in wanted]
        if self.aborted:
            for problem in ran:
                records.setdefault(problem.id, error_record(problem, self.aborted))
        split = self.split()
        protocol = self.protocol()
        summary = Summary(
            protocol=protocol.identity(),
            label=protocol.label,
            dataset=split.identity(),
            subset={
                "limit": self.settings.limit if len(selected) < len(split.problems) else None,
                "seed": self.settings.seed,
                "of": len(split.problems),
                "ids_hash": _ids_hash(selected),
                "deselected": len(selected) - len(ran),
            },
            model=self.model_name or _most_common(records, "model") or "(gsm8k_model fixture)",
            endpoint=_most_common(records, "endpoint")
            or _safe_url(self.base_url or "https://api.openai.com/v1"),
            records=list(records.values()),
            expected=len(ran),
            interrupted=self.interrupted,
        )
        if self.local_info is not None:
            summary.extra["local_server"] = self.local_info
        if self.settings.min_acc is not None:
            summary.gate_min_acc(self.settings.min_acc)
        return summary


def _most_common(records: dict[str, dict[str, Any]], key: str) -> str | None:
    from collections import Counter

    counts = Counter(str(r[key]) for r in records.values() if r.get(key))
    return counts.most_common(1)[0][0] if counts else None


def _worker_share(workerinput: dict[str, Any] | None) -> tuple[int, int] | None:
    """(index, count) of this xdist worker, for the engine's prefetch order; None otherwise."""
    if workerinput is None:
        return None
    digits = str(workerinput.get("workerid", "")).lstrip("gw")
    count = int(workerinput.get("workercount", 1) or 1)
    return (int(digits) % count, count) if digits.isdigit() and count > 1 else None


def _ids_hash(problems: tuple[Problem, ...]) -> str:
    from pytest_gsm8k.types import stable_hash

    return stable_hash([p.id for p in problems])[:16]


def _state(config: pytest.Config) -> State:
    state = config.pluginmanager.get_plugin(STATE_NAME)
    assert isinstance(state, StatePlugin)
    return state.state


class StatePlugin:
    """Holds the State; hooks that need it live on it."""

    def __init__(self, state: State) -> None:
        self.state = state

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Controller: validate data and reach the endpoint before anything is sent."""
        state = self.state
        if state.is_worker or not state.settings.model:
            return
        try:
            state.selected()
            state.protocol()
        except DatasetError as exc:
            raise pytest.UsageError(f"gsm8k: {exc}") from None
        if state.settings.model.startswith("local"):
            _start_local(state)
        if not _model_overridden(session.config):
            _preflight(state)
            if session.config.pluginmanager.has_plugin("dsession"):
                _lead(state)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        """xdist controller: hand the run's identity and the endpoint to each worker."""
        state = self.state
        node.workerinput["gsm8k_run_id"] = state.run_id
        node.workerinput["gsm8k_run_dir"] = str(state.run_dir)
        node.workerinput["gsm8k_base_url"] = state.base_url
        node.workerinput["gsm8k_model"] = state.model_name

    @pytest.hookimpl(tryfirst=True)
    def pytest_collection_modifyitems(
        self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        """Add the built-in test when --gsm8k-model is given (before -k/-m/--lf filter)."""
        if not self.state.settings.model:
            return
        from pytest_gsm8k import builtin

        module = BuiltinModule.from_parent(session, path=Path(builtin.__file__),
                                           nodeid=BUILTIN_NODEID)
        items.extend(session.genitems(module))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """Remember which problems this process will run, in run order, for the prefetcher."""
        if self.state.data_error:
            raise pytest.UsageError(self.state.data_error)
        seen: set[str] = set()
        planned: list[Problem] = []
        for item in session.items:
            callspec = getattr(item, "callspec", None)
            problem = callspec.params.get("gsm8k_problem") if callspec is not None else None
            if isinstance(problem, Problem) and problem.id not in seen:
                seen.add(problem.id)
                planned.append(problem)
        self.state.planned = planned
        self.state.planned_ids = {p.id for p in planned}
        if planned:
            _start_early(self.state, session)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        """xdist controller: which problems the workers collected (it collects nothing)."""
        if self.state.planned_ids is not None:
            return
        pattern = re.compile(rf"\b{re.escape(self.state.settings.split)}-\d{{4,}}\b")
        found: set[str] = set()
        for nodeid in ids:
            params = nodeid.rpartition("[")[2]
            found.update(pattern.findall(params))
        self.state.planned_ids = found or None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        record = item.stash.get(RECORD_KEY, None)
        if record is not None and (
            report.when == "call" or (report.when == "setup" and record["outcome"] == "error")
        ):
            report.gsm8k = record  # type: ignore[attr-defined]
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.state.is_worker:
            return
        record = getattr(report, "gsm8k", None)
        if isinstance(record, dict):
            self.state.records.setdefault(str(record["id"]), record)
            if record["outcome"] == "error" and record.get("aborted"):
                self.state.aborted = str(record["error"])

    def pytest_report_teststatus(
        self, report: pytest.TestReport, config: pytest.Config
    ) -> tuple[str, str, tuple[str, dict[str, bool]]] | None:
        record = getattr(report, "gsm8k", None)
        if report.when == "call" and report.passed and isinstance(record, dict):
            outcome = str(record["outcome"])
            letter, markup = LETTERS.get(outcome, (".", {"green": True}))
            return outcome, letter, (outcome.upper(), markup)
        return None

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        """After all items, on the controller: summary, gates, report (also when interrupted)."""
        if self.state.settings.model or self.state.planned:
            # What is alive now (modules, the collected items) lives to the end: take it out
            # of the collector's way, so the run's collections and pytest's five full ones at
            # the end walk only what the run made (about 0.5 s per process on 1,319 items).
            # The cleanup registered in pytest_configure unfreezes it after those.
            gc.freeze()
        try:
            return (yield)
        except BaseException:
            self.state.interrupted = True
            raise
        finally:
            self._finish(session)

    def _finish(self, session: pytest.Session) -> None:
        state = self.state
        if state.is_worker or (not state.records and not state.aborted):
            return
        try:
            state.summary = state.build_summary()
        except DatasetError:
            return
        _release_gates(state, session)
        if state.settings.report:
            from pytest_gsm8k.summary import write_json

            write_json(state.settings.report, state.summary.to_json())

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        summary = self.state.summary
        if summary is None:
            return
        terminalreporter.write_sep("=", "gsm8k")
        for index, line in enumerate(summary.lines()):
            failed_gate = line.startswith("  gate ") and ": FAIL:" in line
            terminalreporter.write_line(line, bold=index == 0, red=failed_gate)
        if self.state.aborted:
            terminalreporter.write_line(f"gsm8k: run stopped: {self.state.aborted}", red=True)
        if self.state.settings.report:
            terminalreporter.write_line(f"  report: {self.state.settings.report}")

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        summary = self.state.summary
        if summary is not None and summary.failed and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _release_gates(state: State, session: pytest.Session) -> None:
    """Baseline write/compare and the GitHub step summary, once, on the controller."""
    from pytest_gsm8k import gates

    config = session.config
    summary = state.summary
    dirname = str(getattr(config.option, "snapshot_dirname", None) or "__snapshots__")
    path = gates.baseline_path(state.settings, config.rootpath, summary.label, dirname)
    try:
        shown = str(path.resolve().relative_to(config.rootpath.resolve()))
    except ValueError:
        shown = str(path)
    update = bool(getattr(config.option, "update_snapshots", False))
    gates.apply_baseline(summary, state.settings, path, update, shown)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        questions = {p.id: p.question for p in state.split().problems}
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(gates.markdown(summary, questions))


def _start_early(state: State, session: pytest.Session) -> None:
    """Start fetching now, not at the first test.

    When every planned item uses the plugin's own ``gsm8k_model`` and
    ``gsm8k_protocol`` (nothing overrides them), the engine can start as
    soon as the items are known. An xdist worker first offers its plan to
    the controller's fetcher (see ``_lead``) and, when it takes it, only
    follows (it never imports openai); otherwise it fetches for itself.
    """
    config = session.config
    idle = config.option.collectonly or getattr(config.option, "setupplan", False)
    broken = session.testsfailed and not getattr(
        config.option, "continue_on_collection_errors", False)
    if idle or broken:
        return
    if state.model_name and all(_uses_default_fixtures(item) for item in session.items
                                if "gsm8k_problem" in getattr(item, "fixturenames", ())):
        with contextlib.suppress(Exception):  # the fixtures report it at the first test
            if state.is_worker:
                from pytest_gsm8k.engine import offer_plan

                client, protocol = state.default_client(), state.protocol()
                requests = [protocol.request(p) for p in state.planned]
                state.follow = offer_plan(state.run_dir, client, requests)
            if state.follow is None:
                # Import the HTTP client now, before the test loop (nothing can be answered
                # earlier anyway), so its modules are old when the loop starts (gc.freeze).
                state.default_client().warm()
            state.engine_for(state.default_client(), state.protocol())


def _lead(state: State) -> None:
    """xdist controller: start the run's one fetcher, for the plan the first worker offers.

    It runs in a process of its own (see engine.Lead) with the whole
    ``--gsm8k-concurrency``, importing the HTTP client while the workers
    start; workers that get no answer (or another plan) fetch for
    themselves, sharing the work by claims.
    """
    from pytest_gsm8k.engine import Lead

    client = state.default_client()
    cache = state.cache(True)
    state.lead = Lead(state.run_dir, {
        "run_dir": str(state.run_dir),
        "endpoint": client.endpoint,
        "model": client.model,
        "api_key_env": state.settings.api_key_env,  # the key itself stays in the environment
        "timeout": state.settings.timeout,
        "max_retries": state.settings.max_retries,
        "concurrency": state.settings.concurrency,
        "cache_root": str(cache.root),
        "persistent": cache.persistent,
        "run_id": state.run_id,
    })
    state.lead.start()


def _uses_default_fixtures(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", None) or {}
    for name in ("gsm8k_model", "gsm8k_protocol"):
        chain = defs.get(name)
        if not chain or getattr(chain[-1].func, "__module__", None) != __name__:
            return False
    return True


class BuiltinModule(pytest.Module):
    """The built-in test module, collected under the short node id ``gsm8k``."""


def _start_local(state: State) -> None:
    from pytest_gsm8k import local

    try:
        path = local.resolve_model(state.settings.model or "local")
        log = state.run_dir / "llama-server.log"
        # room for a 5-shot prompt (~1,000 tokens) plus the answer
        n_ctx = state.settings.local_ctx or max(local.DEFAULT_N_CTX,
                                                1536 + state.settings.max_tokens)
        server = local.start_local_server(path, alias=local.DEFAULT_ALIAS, log_path=log,
                                          n_ctx=n_ctx, threads=state.settings.local_threads)
    except local.LocalServerError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    state.local_server = server
    state.local_info = {"pid": server.pid, "gguf": str(path), "base_url": server.base_url,
                        "model": server.model, "startup_seconds": round(server.startup_seconds, 2)}
    reporter = state.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"gsm8k: serving {path.name} with llama.cpp at {server.base_url} "
                            f"(pid {server.pid}, ready in {server.startup_seconds:.1f} s)")
    state.base_url = server.base_url
    state.model_name = server.model


def _model_overridden(config: pytest.Config) -> bool:
    """Whether a conftest loaded so far defines its own ``gsm8k_model`` fixture.

    Then the endpoint of the options may not be what is asked at all, and the
    session-start check would refuse a run that needs no endpoint.
    """
    for plugin in config.pluginmanager.get_plugins():
        path = str(getattr(plugin, "__file__", "") or "")
        if path.endswith("conftest.py") and getattr(plugin, "gsm8k_model", None) is not None:
            return True
    return False


def _preflight(state: State) -> None:
    """One cheap call at session start: unreachable, bad key or unknown model is one line."""
    from pytest_gsm8k.client import PreflightError, list_models

    url = state.base_url
    shown = _safe_url(url or "https://api.openai.com/v1")
    try:
        models = list_models(url, state.settings.api_key(), timeout=10.0)
    except PreflightError as exc:
        if exc.kind == "auth":
            raise pytest.UsageError(
                f"gsm8k: {shown} rejected the API key (HTTP 401); set it in "
                f"${state.settings.api_key_env}"
            ) from None
        if exc.kind == "forbidden":
            raise pytest.UsageError(f"gsm8k: {shown} refused access (HTTP 403)") from None
        if exc.kind == "unreachable":
            raise pytest.UsageError(
                f"gsm8k: cannot reach {shown}: {exc.detail} (check --gsm8k-base-url)"
            ) from None
        return  # some servers have no /models; the first request will tell
    if models and state.model_name not in models:
        listed = ", ".join(models[:10]) + (", ..." if len(models) > 10 else "")
        raise pytest.UsageError(
            f"gsm8k: model {state.model_name!r} is not served by {shown} (it serves: {listed})"
        )


# -- pytest hooks -----------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gsm8k: a GSM8K problem item")
    notes: list[str] = []
    try:
        settings = build_settings(lambda o: _read_option(config, o), notes.append)
    except SettingsError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    if not hasattr(config, "workerinput"):  # once, not once per xdist worker
        for note in notes:
            config.issue_config_time_warning(pytest.PytestWarning(f"gsm8k: {note}"), stacklevel=2)
    config.pluginmanager.register(StatePlugin(State(config, settings)), STATE_NAME)
    # Registered before the builtin unraisableexception plugin's cleanup, so it runs after
    # that one's gc passes (see pytest_runtestloop); harmless if nothing was frozen. An
    # xdist worker's process ends right after: leaving its objects frozen spares the
    # interpreter's final collection too, which the controller waits for.
    if not hasattr(config, "workerinput"):
        config.add_cleanup(gc.unfreeze)
    if hasattr(config.option, "ignore_file_extensions"):
        # syrupy would call the baseline an unused snapshot (see snapshot.py)
        from pytest_gsm8k.snapshot import FILE_EXTENSION

        ignored = list(config.option.ignore_file_extensions or [])
        if FILE_EXTENSION not in ignored:
            config.option.ignore_file_extensions = [*ignored, FILE_EXTENSION]


def pytest_unconfigure(config: pytest.Config) -> None:
    plugin = config.pluginmanager.get_plugin(STATE_NAME)
    if isinstance(plugin, StatePlugin):
        plugin.state.close()
        config.pluginmanager.unregister(plugin, STATE_NAME)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gsm8k_problem" not in metafunc.fixturenames:
        return
    state = _state(metafunc.config)
    try:
        problems = state.selected()
    except DatasetError as exc:
        if state.is_worker:
            # An xdist worker cannot end the session with a usage error (the controller,
            # which never collects, would crash); a CollectError is one line per module.
            raise pytest.Collector.CollectError(f"gsm8k: {exc}") from None
        # Raised here (inside a collector) it would become a collection error with a
        # traceback; pytest_collection_finish raises it as one usage-error line instead.
        state.data_error = f"gsm8k: {exc}"
        return
    metafunc.parametrize("gsm8k_problem", problems, ids=[p.id for p in problems])


# -- fixtures -------------------------------------------------------------------


class GSM8KOutcome:
    """What a test gets from ``gsm8k_outcome``: the scored answer to its problem."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record

    outcome = property(lambda self: str(self.record["outcome"]))
    correct = property(lambda self: bool(self.record["correct"]))
    extracted = property(lambda self: self.record["extracted"])
    gold = property(lambda self: self.record["gold"])
    response = property(lambda self: str(self.record["response"]))

    def __repr__(self) -> str:
        return (f"GSM8KOutcome({self.record['id']}: {self.outcome}, extracted={self.extracted!r}, "
                f"gold={self.gold!r})")


@pytest.fixture
def gsm8k_problem() -> Problem:
    """The GSM8K problem of this item (parametrized by the plugin over the selected split)."""
    raise pytest.UsageError("gsm8k_problem is parametrized by pytest-gsm8k; it was not here")


@pytest.fixture(scope="session")
def gsm8k_protocol(pytestconfig: pytest.Config) -> Protocol:
    """The evaluation protocol (test@1/pass@N/maj@N, shots, api, extractor ...)."""
    try:
        return _state(pytestconfig).protocol()
    except DatasetError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None


@pytest.fixture(scope="session")
def gsm8k_model(pytestconfig: pytest.Config) -> Iterator[Any]:
    """The model: an OpenAI-compatible endpoint from the options.

    Override it in your conftest.py with any callable that takes a
    :class:`~pytest_gsm8k.Request` and returns a text or a list of texts
    (sync or async) to gate a model that has no HTTP endpoint.
    """
    yield _state(pytestconfig).default_client()


@pytest.fixture
def gsm8k_outcome(
    request: pytest.FixtureRequest,
    gsm8k_problem: Problem,
    gsm8k_model: Any,
    gsm8k_protocol: Protocol,
) -> GSM8KOutcome:
    """The scored answer for this item's problem (fetched ahead by the engine)."""
    from pytest_gsm8k.engine import EndpointAborted, EndpointError
    from pytest_gsm8k.outcome import error_record, score_response

    state = _state(request.config)
    engine = state.engine_for(gsm8k_model, gsm8k_protocol)
    item = request.node
    failure: str | None = None
    try:
        response = engine.result(gsm8k_protocol.request(gsm8k_problem))
    except EndpointError as exc:
        record = error_record(gsm8k_problem, str(exc))
        if isinstance(exc, EndpointAborted):
            record["aborted"] = True
            request.session.shouldfail = f"gsm8k: {exc}"
        item.stash[RECORD_KEY] = record
        item.user_properties.append(("gsm8k_outcome", "error"))
        failure = f"gsm8k: {exc}"
    finally:
        for message in engine.cache.take_warnings():
            warnings.warn(pytest.PytestWarning(message), stacklevel=1)
    if failure is not None:
        # Outside the except block: inside it, pytest would print the EndpointError too
        # ("During handling of the above exception, another exception occurred").
        pytest.fail(failure, pytrace=False)
    record = score_response(gsm8k_problem, response, gsm8k_protocol, state.pattern)
    record["endpoint"] = _safe_url(engine.client.endpoint)
    record["model"] = record["model"] or engine.client.model
    item.stash[RECORD_KEY] = record
    item.user_properties.extend([
        ("gsm8k_outcome", record["outcome"]),
        ("gsm8k_extracted", record["extracted"]),
        ("gsm8k_gold", record["gold"]),
    ])
    return GSM8KOutcome(record)

