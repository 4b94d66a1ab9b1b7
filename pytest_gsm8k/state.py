"""Per-process state of a GSM8K run: settings, data, protocol, answer sources, summary.

One :class:`State` per pytest process (controller, single process, or xdist
worker), created in ``pytest_configure``. Data and protocol load lazily, so a
suite that never asks for a GSM8K item pays nothing.

Where a test's answer comes from (:meth:`State.source_for`):

* the plugin's own client, one process: this process's :class:`Engine`;
* the plugin's own client under xdist: the controller's engine, through
  :class:`RemoteAnswers` (the controller fetches for every worker);
* a user's session-scoped callable: this process's engine for it (under
  xdist, with claims on the run's shared cache, since each worker has its own
  copy of the callable);
* a narrower-scoped model: a one-shot engine for the item's own request
  (nothing can be prefetched for a model that exists for one item only).
"""

from __future__ import annotations

import contextlib
import math
import re
import shutil
import tempfile
import time
import uuid
import warnings
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any
from typing import Protocol as TypingProtocol
from urllib.parse import urlsplit, urlunsplit

import pytest

from pytest_gsm8k.core.dataset import DatasetError, Split, select
from pytest_gsm8k.core.gates import GateVerdict
from pytest_gsm8k.core.prompts import Exemplar, Protocol, draw_exemplars
from pytest_gsm8k.core.scrub import Scrubber
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.core.types import ModelResponse, Problem, Request, stable_hash
from pytest_gsm8k.runtime.client import DEFAULT_BASE_URL
from pytest_gsm8k.runtime.data import load_split, train_source

#: in the run's folder: the controller's early-stop message for the xdist workers
STOP_FILE = "early-stop"

if TYPE_CHECKING:
    from pytest_gsm8k.core.early_stop import EarlyStop
    from pytest_gsm8k.core.summary import Summary
    from pytest_gsm8k.runtime.answers import AnswerServer, RemoteAnswers
    from pytest_gsm8k.runtime.cache import ResponseCache
    from pytest_gsm8k.runtime.client import OpenAIClient
    from pytest_gsm8k.runtime.engine import Engine
    from pytest_gsm8k.runtime.outputs import Output
    from pytest_gsm8k.runtime.serve import ServedProcess

RECORD_KEY = pytest.StashKey[dict[str, Any]]()
STATE_NAME = "gsm8k-state"

#: descriptors kept free of the concurrency's sockets: pytest's own files, the cache's
#: writes, the imports, the report and the page at the end (plus a few per xdist worker)
DESCRIPTOR_RESERVE = 64
DESCRIPTOR_PER_WORKER = 4


class AnswerSource(TypingProtocol):
    """Where a test's answer comes from: an engine here, or the xdist controller's."""

    @property
    def endpoint(self) -> str: ...

    @property
    def model(self) -> str: ...

    def result(self, request: Request) -> ModelResponse: ...

    def take_warnings(self) -> list[str]: ...

    def close(self) -> None: ...


def safe_url(url: str) -> str:
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
        self._by_id: dict[str, Problem] | None = None
        self._protocol: Protocol | None = None
        self.pattern = re.compile(settings.answer_regex) if settings.answer_regex else None
        #: engines by id() of the model object they call (session-scoped models only)
        self.engines: dict[int, Engine] = {}
        #: the scope of each gsm8k_model value set up so far, by id() (pytest_fixture_setup)
        self.model_scopes: dict[int, str] = {}
        self.planned: list[Problem] = []
        #: problem ids the run collected (None until known; xdist: from the workers' ids)
        self.planned_ids: set[str] | None = None
        self.records: dict[str, dict[str, Any]] = {}
        self.summary: Summary | None = None
        self.interrupted = False
        self.aborted: str | None = None
        self.data_error: str | None = None
        #: the server this run started (--gsm8k-serve or --gsm8k-model=local)
        self.local_server: ServedProcess | None = None
        self.local_info: dict[str, Any] | None = None
        self.server_death: str | None = None
        self.base_url = settings.resolved_base_url()
        self.model_name = settings.model
        #: what the endpoint's GET /v1/models says about the model (None: it said nothing);
        #: stored with each cached answer, which is reused only while it still says that
        self.server_identity: dict[str, Any] | None = None
        #: xdist controller: serves its engine's answers to the workers
        self.answer_server: AnswerServer | None = None
        #: xdist worker: the controller's answers (plugin's own client and protocol only)
        self.remote: RemoteAnswers | None = None
        self._warned_scope = False
        self._stop_heard = False
        #: engines made with plan=False: the first engine_for(plan=True) plans them
        self._unplanned: set[int] = set()
        self.baseline_file: Path | None = None  # where release_gates looked for the baseline
        #: --gsm8k-early-stop: the run's EarlyStop (controller), and its message once it stopped
        self.early: EarlyStop | None = None
        self.early_stopped: str | None = None
        self.started = time.time()
        self._run_dir: Path | None = None
        if self.workerinput is not None:
            self.run_id = str(self.workerinput["gsm8k_run_id"])
            self.base_url = self.workerinput.get("gsm8k_base_url") or self.base_url
            self.model_name = self.workerinput.get("gsm8k_model") or self.model_name
            self.server_identity = self.workerinput.get("gsm8k_server_identity")
            self.workers = int(self.workerinput.get("workercount", 1))
        else:
            self.run_id = uuid.uuid4().hex
            self.workers = 1
        self._caches: dict[bool, ResponseCache] = {}
        self._default_client: OpenAIClient | None = None
        #: the run's outputs checked at session start, by key (report, html, step_summary)
        self.outputs: dict[str, Output] = {}
        #: outputs that could not be written at the end: key -> the one line saying why
        self.output_errors: dict[str, str] = {}
        self._room: tuple[int, int] | None = None
        self._room_measured = False

    @property
    def run_dir(self) -> Path:
        """The run's private folder (the per-run cache, the stop file), shared by the xdist
        workers through the run id; made on first use only, so a session without GSM8K
        items leaves no trace."""
        if self._run_dir is None:
            path = run_dir_for(self.run_id)
            path.mkdir(mode=0o700, exist_ok=True)
            self._run_dir = path
        return self._run_dir

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
                from pytest_gsm8k.core.presets import get_preset

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
                pool = [
                    Exemplar(p.question, p.answer)
                    for p in pool_split.problems
                    if p.question not in evaluated
                ]  # never show a test problem as a shot
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
                params=s.params,
            )
        return self._protocol

    def request_for(self, problem_id: str) -> Request | None:
        """The plugin protocol's request for a selected problem (None if not selected)."""
        if self._by_id is None:
            self._by_id = {p.id: p for p in self.selected()}
        problem = self._by_id.get(problem_id)
        return None if problem is None else self.protocol().request(problem)

    # caches, clients, engines

    def cache(self, persistent: bool) -> ResponseCache:
        from pytest_gsm8k.runtime.cache import ResponseCache

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

    def default_client(self) -> OpenAIClient:
        """The process's one OpenAI-compatible client (the same object every time)."""
        from pytest_gsm8k.runtime.client import Breaker, OpenAIClient

        if self._default_client is not None:
            return self._default_client
        if not self.model_name:
            raise pytest.UsageError(
                "gsm8k_model: no --gsm8k-model given and no gsm8k_model fixture override"
            )
        self._default_client = OpenAIClient(
            model=self.model_name,
            base_url=self.base_url,
            api_key=self.settings.api_key(),
            timeout=self.settings.timeout,
            max_retries=self.settings.max_retries,
            concurrency=self.concurrency(),
            breaker=Breaker(),
            # the served port is new every run: the command line (with {port} as written)
            # names the server in cache keys, so a rerun finds its answers
            cache_endpoint=f"serve:{self.settings.serve}" if self.settings.serve else None,
        )
        return self._default_client

    def concurrency(self) -> int:
        """The run's limit; split over the xdist workers only where each fetches itself,
        and never more sockets than the open-file limit leaves room for."""
        wanted = max(1, math.ceil(self.settings.concurrency / max(1, self.workers)))
        room = self.descriptor_room()
        return wanted if room is None else max(1, min(wanted, room[0]))

    def descriptor_room(self) -> tuple[int, int] | None:
        """(sockets this process may open for requests, the open-file limit), measured
        once; None when the limit is unlimited or unknown."""
        if not self._room_measured:
            from pytest_gsm8k.runtime.files import descriptor_room

            self._room_measured = True
            workers = getattr(self.config.option, "numprocesses", None)
            spawned = workers if isinstance(workers, int) and not self.is_worker else 0
            self._room = descriptor_room(DESCRIPTOR_RESERVE + DESCRIPTOR_PER_WORKER * spawned)
        return self._room

    def engine_for(self, model: Any, *, plan: bool = True) -> Engine:
        """The engine that calls ``model`` (created once per model object).

        A session-scoped model's engine prefetches this process's planned items.
        """
        from pytest_gsm8k.runtime.client import CallableClient
        from pytest_gsm8k.runtime.engine import Engine

        engine = self.engines.get(id(model))
        if engine is not None:
            if plan and id(model) in self._unplanned:  # started early, unplanned until now
                self._unplanned.discard(id(model))
                engine.start([self.protocol().request(p) for p in self.planned])
            return engine
        client = model
        if not hasattr(model, "complete"):
            if not callable(model):
                raise pytest.UsageError(
                    f"gsm8k_model: expected a callable or a client, got {type(model).__name__}"
                )
            client = CallableClient(
                model, concurrency=self.concurrency(), model=self.settings.model
            )
        claims = self.is_worker  # a user's model exists in every worker: share by claims
        engine = Engine(
            client,
            self.cache(bool(getattr(client, "persistent_cache", False))),
            concurrency=self.concurrency(),
            claims=claims,
            breaker=getattr(client, "breaker", None),
            share=_worker_share(self.workerinput),
            # early stopping: fetch no further ahead of the tests than the concurrency
            lookahead=self.concurrency() if self.settings.early_stop else None,
            scrub=self.scrubber(),
            stall_timeout=self.settings.stall_timeout,
            # what the server says about itself describes the plugin's own client only
            identity=self.server_identity if client is self._default_client else None,
        )
        self.engines[id(model)] = engine
        if plan:
            engine.start([self.protocol().request(p) for p in self.planned])
        else:
            self._unplanned.add(id(model))
        return engine

    def source_for(self, model: Any, protocol: Protocol) -> tuple[AnswerSource, bool]:
        """Where this item's answer comes from, and whether that source is single-use."""
        default = model is self._default_client and protocol is self._protocol
        if default and self.remote is not None:
            return self.remote, False
        if self.model_scopes.get(id(model), "session") != "session":
            if not self._warned_scope:
                self._warned_scope = True
                warnings.warn(
                    pytest.PytestWarning(
                        "gsm8k: gsm8k_model is not session-scoped: each item calls it for its own "
                        "problem only, nothing is prefetched (make it session-scoped for speed)"
                    ),
                    stacklevel=3,
                )
            return self._one_shot(model), True
        return self.engine_for(model), False

    def _one_shot(self, model: Any) -> Engine:
        from pytest_gsm8k.runtime.client import CallableClient
        from pytest_gsm8k.runtime.engine import Engine

        client = (
            model
            if hasattr(model, "complete")
            else CallableClient(model, concurrency=1, model=self.settings.model)
        )
        return Engine(
            client,
            self.cache(False),
            concurrency=1,
            claims=False,
            scrub=self.scrubber(),
            stall_timeout=self.settings.stall_timeout,
        )

    def scrubber(self) -> Scrubber:
        """What removes this run's secrets (the key, URL credentials) from outside text."""
        return Scrubber(self.settings.api_key(), self.base_url)

    def announce_stop(self, message: str) -> None:
        """Controller: tell the xdist workers the run stopped early.

        Workers that call a user's model fetch for themselves and would go on
        through the items xdist already handed them; a file in the run's folder
        (which every worker knows) is the whole protocol. Best effort: a worker
        that cannot read it still stops when xdist runs out of items for it.
        """
        from pytest_gsm8k.runtime.files import write_atomic

        with contextlib.suppress(OSError):
            write_atomic(self.run_dir / STOP_FILE, message)

    def heed_stop(self) -> None:
        """Worker, before each item: stop every engine once the controller announced a stop."""
        if self._stop_heard or not self.is_worker:
            return
        try:
            message = (self.run_dir / STOP_FILE).read_text(encoding="utf-8")
        except OSError:
            return
        self._stop_heard = True
        for engine in list(self.engines.values()):
            engine.stop(message.removeprefix("gsm8k: "))

    def server_died(self, message: str) -> None:
        """The model server this run started is gone: stop every engine with its message."""
        self.server_death = message
        for engine in list(self.engines.values()):
            engine.abort(message)

    def close(self) -> None:
        for output in self.outputs.values():
            output.close()
        self.outputs.clear()
        if self.remote is not None:
            self.remote.close()
            self.remote = None
        if self.answer_server is not None:
            self.answer_server.close()
            self.answer_server = None
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()
        if not self.is_worker:
            for cache in self._caches.values():
                cache.close()
            shutil.rmtree(run_dir_for(self.run_id), ignore_errors=True)
            if self.local_server is not None:
                self.local_server.stop()
                self.local_server = None

    # the summary

    def _late_record(self, problem: Problem) -> dict[str, Any] | None:
        """The scored record of an answer the plugin's engine holds but no test read."""
        from pytest_gsm8k.core.outcome import score_response

        engine = self.engines.get(id(self._default_client))
        if engine is None:
            return None
        protocol = self.protocol()
        response = engine.ready(protocol.request(problem))
        if response is None:
            return None
        record = score_response(problem, response, protocol, self.pattern)
        record["endpoint"] = safe_url(engine.endpoint)
        record["model"] = record["model"] or engine.model
        return record

    def wanted(self) -> list[Problem]:
        """What this run set out to do: the selected problems it collected, after -k/-m/--lf
        deselection (all of the selection until collection says otherwise)."""
        selected = self.selected()
        wanted = self.planned_ids if self.planned_ids is not None else {p.id for p in selected}
        return [p for p in selected if p.id in wanted]

    def build_summary(self) -> Summary:
        from pytest_gsm8k.core.outcome import error_record
        from pytest_gsm8k.core.summary import Summary

        selected = self.selected()
        records = dict(self.records)
        ran = self.wanted()
        if self.aborted:
            # The run stopped at the first item the failure reached; answers that had come
            # in for later items (out of order) are scored, not thrown away.
            for problem in ran:
                if problem.id not in records:
                    records[problem.id] = self._late_record(problem) or error_record(
                        problem, self.aborted
                    )
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
            or safe_url(self.base_url or DEFAULT_BASE_URL),
            records=list(records.values()),
            expected=len(ran),
            interrupted=self.interrupted,
        )
        if self.local_info is not None:
            key = "served" if self.settings.serve else "local_server"
            summary.extra[key] = self.local_info
        early = self.early
        decided = None
        if early is not None:
            summary.extra["early_stop"] = early.to_json()
            summary.notes.append(f"  early stop ({early.mode}): {early.headline()}")
            if early.decision is not None and self.early_stopped is not None:
                decided = early.decision.verdicts.get("min-acc")
        if early is not None and decided is not None:
            summary.set_gate(
                GateVerdict(
                    "min-acc",
                    "early-stop",
                    decided == "PASS",
                    early.headline(),
                    threshold=self.settings.min_acc,
                )
            )
        elif self.settings.min_acc is not None:
            summary.gate_min_acc(self.settings.min_acc)
        return summary


def run_dir_for(run_id: str) -> Path:
    """Where the run with this id keeps its private files (not created here)."""
    return Path(tempfile.gettempdir()) / f"gsm8k-run-{run_id}"


def _most_common(records: dict[str, dict[str, Any]], key: str) -> str | None:
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
    return stable_hash([p.id for p in problems])[:16]


def get_state(config: pytest.Config) -> State:
    """This process's State (registered by the plugin in pytest_configure)."""
    plugin = config.pluginmanager.get_plugin(STATE_NAME)
    state = getattr(plugin, "state", None)
    if not isinstance(state, State):
        raise pytest.UsageError("gsm8k: pytest-gsm8k is not configured (-p no:gsm8k?)")
    return state
