"""One pytest process's part of a GSM8K run, as syrupy's ``SnapshotSession`` is for syrupy:
the settings, the plan (built once, then only read), the tally, the early stop, and
:class:`Sources`, where a test's answer comes from: one object stops all the run opened."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

from pytest_gsm8k import ROLE_NAME
from pytest_gsm8k.core.outcome import combine_repeats, score_response
from pytest_gsm8k.core.plan import Endpoint, RunPlan
from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.records import ProblemRecord
from pytest_gsm8k.core.scrub import Scrubber, command_secrets, shown_url
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.core.tally import Tally
from pytest_gsm8k.core.types import ModelResponse, Problem
from pytest_gsm8k.runtime import outputs, planning
from pytest_gsm8k.runtime.answers import AnswerServer, Channel
from pytest_gsm8k.runtime.client import CallableClient, OpenAIClient
from pytest_gsm8k.runtime.outputs import Output

if TYPE_CHECKING:  # the fetching process's (an xdist worker only follows the channel)
    from pytest_gsm8k.core.vllm_config import VllmConfig
    from pytest_gsm8k.runtime.cache import ResponseCache
    from pytest_gsm8k.runtime.engine import Engine
    from pytest_gsm8k.runtime.matrix import Matrix
    from pytest_gsm8k.runtime.serve import ServedProcess, Started

CONFIG_OVERRIDE = (
    "gsm8k: --gsm8k-config runs each config's own server: a gsm8k_model "
    "override cannot take part (remove it, or run without --gsm8k-config)"
)
#: the controller's head start: this many rounds of the engine's concurrency (about the
#: workers' start-up at a fast endpoint's latency), at most HEAD_START_MAX requests
HEAD_START_ROUNDS, HEAD_START_MAX = 4, 256


class Gsm8kSession:
    """This process's settings and xdist input, the plan (once), the sources and the tally."""

    def __init__(self, config: pytest.Config, settings: Settings, run_id: str, started: float):
        self.config, self.settings, self.run_id = config, settings, run_id
        self.is_worker = hasattr(config, "workerinput")
        self.workerinput: dict[str, Any] = getattr(config, "workerinput", {})  # {}: no worker
        self.dry = bool(config.option.collectonly or getattr(config.option, "setupplan", False))
        self._plan: RunPlan | None = None
        self.run = Tally(started)
        #: the outputs checked at session start, by key; those that failed at the end
        self.outputs: dict[str, Output] = {}
        self.output_errors: dict[str, str] = {}
        self.sources = Sources(self)

    @property
    def plan(self) -> RunPlan:
        """Built on first use where the session start did not build it (an xdist worker, a
        run of a user's own tests). Raises DatasetError for unusable data."""
        if self._plan is None:
            self._plan = self.build_plan()
        return self._plan

    def set_plan(self, plan: RunPlan) -> None:
        self._plan = plan

    def build_plan(self) -> RunPlan:
        option = self.config.option
        return planning.build_plan(
            self.settings,
            run_id=self.run_id,
            endpoint=self.endpoint(),
            rootpath=self.config.rootpath,
            snapshot_dirname=str(getattr(option, "snapshot_dirname", None) or "__snapshots__"),
            update_baseline=bool(getattr(option, "update_snapshots", False)),
        )

    def endpoint(self) -> Endpoint:
        """The plan's; before there is one, the options' (a worker's is the controller's,
        which may have started the server and asked it what it serves)."""
        if self._plan is not None:
            return self._plan.endpoint
        if (given := self.workerinput.get("gsm8k_endpoint")) is not None:
            return Endpoint(*given)
        return Endpoint(self.settings.resolved_base_url(), self.settings.model)

    def scrubber(self) -> Scrubber:
        """Every secret this run knows (the key, URL credentials, a server's) out of text."""
        others = [os.environ.get("VLLM_API_KEY", ""), *command_secrets(self.settings.serve or "")]
        for config in self._plan.configs.values() if self._plan is not None else ():
            others += config.secrets()
        return Scrubber(self.settings.api_key(), self.endpoint().base_url, others)

    def concurrency(self) -> int:
        """The run's limit; split over the xdist workers only where each fetches itself,
        and never more sockets than the open-file limit leaves room for."""
        workers = max(1, int(self.workerinput.get("workercount", 1)))
        wanted = max(1, math.ceil(self.settings.concurrency / workers))
        room = self.descriptor_room
        return wanted if room is None else max(1, min(wanted, room[0]))

    @functools.cached_property
    def descriptor_room(self) -> tuple[int, int] | None:
        """(sockets this process may open for requests, the open-file limit), or None."""
        workers = getattr(self.config.option, "numprocesses", None)  # None on a worker
        spawned = workers if isinstance(workers, int) else 0
        # kept free of the sockets: pytest's own files, the cache's writes, the imports, the
        # report and the page at the end (plus a few per xdist worker)
        return outputs.descriptor_room(64 + 4 * spawned)

    def close(self) -> None:
        for output in self.outputs.values():
            output.close()
        self.sources.close()

    def observe(self, record: ProblemRecord, nodeid: str) -> str | None:
        """One item's (``nodeid``) record, fed to its group's early stop (--gsm8k-early-stop).
        Returns the message the whole run stops with once that decides before its last
        problem; a config's early stop skips the rest of that config only."""
        run, problem_id, sources = self.run, str(record["id"]), self.sources
        fresh = run.add_record(record, nodeid)
        if sources.answer_server is not None:
            sources.answer_server.settled(problem_id)
        if not fresh or record.get("aborted") or not self.settings.early_stop:
            return None
        from pytest_gsm8k.runtime.matrix import group_of

        name = group_of(problem_id) if self.settings.vllm_config else ""
        if (early := run.early_stop(self.plan, name)) is None or name in run.stopped:
            return None
        answers = [str(x) for x in record.get("repeats") or ()]
        try:
            decided = early.observe(problem_id, record["outcome"], answers)
        except (KeyError, ValueError):
            return None  # a problem outside the group's plan (a user's own test): not counted
        if decided is None or early.arrived >= early.n_total or run.doubled:
            return None  # (nothing left to skip; doubled: the verdict needs every test's answers)
        if not name:
            run.stop_early(name, message := f"gsm8k: {early.headline()}")
            sources.stop(early.headline())
            return message
        how = f"stopped early (--gsm8k-early-stop {early.mode}): {early.headline()}"
        run.stop_early(name, f"config {name} {how}; its problems not asked yet are skipped")
        if sources.matrix is not None:
            sources.matrix.stop_config(name, run.stopped[name])
        return None


class Sources:
    """This process's answer sources, made on demand, closed together."""

    def __init__(self, session: Gsm8kSession) -> None:
        self._session = session
        #: the run's private folder (the cache when none is kept), shared by the xdist workers
        #: through the run id; made on first use only: a run without GSM8K items leaves no trace
        self._run_dir = Path(tempfile.gettempdir()) / f"gsm8k-run-{session.run_id}"
        self.engines: dict[int, Engine] = {}  # by id() of the model they call
        self._unplanned: set[int] = set()  # engines not yet given a protocol's plan
        self._scopes: dict[int, str] = {}  # each gsm8k_model value's fixture scope, by id()
        self._warned_scope = self._stop_heard = False
        self._caches: dict[bool, ResponseCache] = {}
        self._client: OpenAIClient | None = None
        self.channel: Channel | None = None  # xdist worker: to the controller
        self.answer_server: AnswerServer | None = None  # xdist controller
        self.server: ServedProcess | None = None  # --gsm8k-serve, --gsm8k-model=local
        self.matrix: Matrix | None = None  # --gsm8k-config, on the process that fetches
        self.servers: dict[str, dict[str, Any]] = {}  # what each group's reported ("" the run's)
        #: started servers by config name ("" for the run's): (cache name, generation read)
        self.started: dict[str, tuple[str, int]] = {}

    def use_server(self, started: Started) -> None:
        self.server, self.servers[""] = started.server, started.info

    def use_matrix(self, matrix: Matrix) -> None:
        self.matrix = matrix

    def note_scope(self, model: object, scope: str) -> None:
        self._scopes[id(model)] = scope

    def cache(self, persistent: bool) -> ResponseCache:
        from pytest_gsm8k.runtime.cache import ResponseCache

        session = self._session
        root: Path | None = None
        if persistent and not session.settings.no_cache:
            if session.settings.cache_dir:
                root = Path(session.settings.cache_dir).expanduser()
            elif getattr(session.config, "cache", None) is not None:
                root = session.config.cache.mkdir("gsm8k")
        persistent = root is not None
        if persistent not in self._caches:
            if root is None:
                self._run_dir.mkdir(mode=0o700, exist_ok=True)
            self._caches[persistent] = ResponseCache(
                root or self._run_dir / "cache",
                session.run_id,
                persistent=persistent,
                resume=session.settings.resume,
                started=session.run.started,
            )
        return self._caches[persistent]

    def _new_client(
        self, key: str, endpoint: Endpoint, timeout: float, concurrency: int, started: str | None
    ) -> OpenAIClient:
        """A server this run started (``key``: its config, "" the run's) has a new port every run:
        ``started`` names it in cache keys, with its environment's digest and its generation (resume
        an unfinished run only). The vllm preset's bytes go over aiohttp (runtime/wire.py)."""
        from pytest_gsm8k.runtime.wire import WireClient

        settings = self._session.settings
        if started is not None:
            from pytest_gsm8k.runtime.serve import server_env_digest

            env = self._session.plan.configs[key].env if key else ()
            started = f"{started} env:{server_env_digest(env)}"
            generation = self.cache(True).generation(started)
            self.started[key] = (started, generation)
            started = f"{started} gen:{generation}"
        kind = WireClient if settings.preset == "vllm" or settings.vllm_config else OpenAIClient
        return kind(
            model=endpoint.model or "",
            base_url=endpoint.base_url,
            api_key=settings.api_key(),
            timeout=timeout,
            max_retries=settings.max_retries,
            concurrency=concurrency,
            cache_endpoint=started,
        )

    def default_client(self) -> OpenAIClient:
        """The process's one OpenAI-compatible client (the same object every time)."""
        settings, endpoint = self._session.settings, self._session.endpoint()
        if self._client is None and settings.vllm_config:
            self._client = SimpleNamespace(  # type: ignore[assignment]
                endpoint="(the configs' servers)", model="(the configs' models)"
            )  # each config's own server answers
        elif self._client is None:
            if not endpoint.model:
                raise pytest.UsageError(
                    "gsm8k_model: no --gsm8k-model given and no gsm8k_model fixture override"
                )
            # a server this run started is named by its command line ({port} as written) or
            # its GGUF (path and size: another build is another file)
            started, gguf = None, self.servers.get("", {}).get("gguf")  # (only a local one's)
            if settings.serve:
                started = f"serve:{settings.serve}"
            elif isinstance(gguf, str):
                with contextlib.suppress(OSError):
                    started = f"local:{gguf}:{Path(gguf).stat().st_size}"
            try:
                self._client = self._new_client(
                    "", endpoint, settings.timeout, self._session.concurrency(), started
                )
            except ValueError as exc:  # a proxy the client cannot use
                raise pytest.UsageError(f"gsm8k: {exc}") from None
        return self._client  # type: ignore[return-value]

    def config_engine(self, name: str, config: VllmConfig, started: Started, shown: str) -> Engine:
        """A config's engine (not started); ValueError for a proxy the client cannot use."""
        args, timeout = " ".join(config.serve_args()), config.request_timeout_seconds
        concurrency = config.max_concurrency or self._session.concurrency()
        cached = f"serve:{shown} config:{name} args:{args}"
        client = self._new_client(name, started.endpoint, timeout, concurrency, cached)
        self.servers[name] = started.info
        # vLLM's test waits request_timeout_seconds for an answer: less is not a stall
        return self._engine(client, concurrency, started.endpoint, stall_floor=timeout)

    def _engine(
        self,
        model: Any,
        concurrency: int,
        endpoint: Endpoint | None = None,
        stall_floor: float = 0.0,
        one_shot: bool = False,
    ) -> Engine:
        """``endpoint``: the server the plugin's own client asks; its answers are cached
        under its description of the model, and must name the model when no listing did."""
        from pytest_gsm8k.runtime.engine import Engine

        client, settings = model, self._session.settings
        if not hasattr(model, "complete"):  # a callable, wrapped
            if not callable(model):
                raise pytest.UsageError(
                    f"gsm8k_model: expected a callable or a client, got {type(model).__name__}"
                )
            client = CallableClient(model, concurrency=concurrency, model=settings.model)
        return Engine(
            client,
            self.cache(not one_shot and bool(getattr(client, "persistent_cache", False))),
            concurrency=concurrency,
            # early stopping: what is fetched past the decision is paid for and unused
            lookahead=concurrency if settings.early_stop and not one_shot else None,
            scrub=self._session.scrubber(),
            stall_timeout=settings.stall_timeout and max(settings.stall_timeout, stall_floor),
            identity=endpoint.identity if endpoint else None,
            named=endpoint.model if endpoint and endpoint.identity is None else None,
        )

    def engine_for(self, model: Any, protocol: Protocol | None = None) -> Engine:
        """The engine that calls ``model`` (one per model object), started by the first call
        given a ``protocol`` on the collected items, but on an xdist worker: its items ask one
        at a time (xdist is the parallelism there; each worker would fetch all)."""
        session = self._session
        if (engine := self.engines.get(id(model))) is None:
            endpoint = session.endpoint() if model is self._client else None
            engine = self.engines[id(model)] = self._engine(model, session.concurrency(), endpoint)
            self._unplanned.add(id(model))
        if protocol is not None and id(model) in self._unplanned and not session.is_worker:
            self._unplanned.discard(id(model))
            repeats = session.settings.repeats
            engine.start(
                [r for p in session.run.collected or () for r in protocol.request(p).asks(repeats)]
            )
        return engine

    def warm(self) -> Engine:
        """The plugin's own engine, its HTTP client imported and built on the engine's thread
        (openai's imports would otherwise sit between collection's end and the first request)."""
        client = self.default_client()
        engine = self.engine_for(client)
        engine.loop.call_soon_threadsafe(client.warm)
        return engine

    def serve_workers(self, head_start: bool) -> None:
        """xdist controller: one engine for the plugin's own client (or the configs' servers)
        served to the workers; ``head_start``: the plan's first requests sent while they start."""
        plan, repeats = self._session.plan, self._session.settings.repeats
        engine = self.matrix or self.engine_for(self.default_client())
        self.answer_server = AnswerServer(engine, plan.request_for, repeats=repeats)
        # listening before the client's import on the same loop, which once held it too long
        self.answer_server.start()
        if self.matrix is None:
            engine = self.warm()
            if head_start:
                limit = min(HEAD_START_ROUNDS * engine.concurrency, HEAD_START_MAX)
                self.answer_server.head_start([p.id for p in plan.run_order], limit)

    def connect(self, overridden: bool) -> None:
        """xdist worker: its plan offered to the controller, whose answers the plugin's own
        client's items read; ``overridden``: fetched only once such an item asks (source_for)."""
        given, settings = self._session.workerinput, self._session.settings
        if (address := given.get("gsm8k_answers")) is None:
            return
        where, token = (str(address[0]), int(address[1])), str(given["gsm8k_answers_token"])
        client = self.default_client()
        # 120 s beyond the controller's engine's own bounds (which end every request by then;
        # this ends only a wait that nothing else would)
        wait = settings.timeout * (settings.max_retries + 1) + 120.0
        try:
            self.channel = Channel(
                where, token, endpoint=client.endpoint, model=client.model, wait=wait
            )
            ids = [p.id for p in self._session.run.collected or ()]
            self.channel.offer(ids, fetch=not overridden)
        except OSError as exc:
            raise pytest.UsageError(
                f"gsm8k: cannot reach the xdist controller's answers ({exc})"
            ) from None

    def source_for(self, model: Any, protocol: Protocol) -> tuple[Engine | Channel | Matrix, bool]:
        """Where this item's answer comes from, and whether that source is single-use."""
        is_default = model is not None and model is self._client
        configs = bool(self._session.settings.vllm_config)
        if configs and not is_default:
            raise pytest.UsageError(CONFIG_OVERRIDE)
        if configs and self.matrix is None and self.channel is None:
            raise pytest.UsageError("gsm8k: --gsm8k-config: no config server was started")
        # the plan's protocol or an equal one of its class (a conftest's copy; a subclass may ask
        # otherwise, whatever its __eq__ says): ``in`` tries ``is`` first
        same = is_default and self.channel and type(protocol) is type(self._session.plan.protocol)
        if configs or (same and protocol in (self._session.plan.protocol,)):
            if self.channel is not None and not self.channel.fetch:  # an override: fetch now
                with contextlib.suppress(ConnectionError):  # a broken channel: said at the ask
                    ids = [p.id for p in self._session.run.collected or ()]
                    self.channel.offer(ids, fetch=True)
            return self.channel or self.matrix, False  # type: ignore[return-value]
        if is_default or self._scopes.get(id(model), "session") == "session":
            return self.engine_for(model, protocol), False
        if not self._warned_scope:
            self._warned_scope = True
            warnings.warn(
                pytest.PytestWarning(
                    "gsm8k: gsm8k_model is not session-scoped: each item calls it for its own "
                    "problem only, nothing is prefetched (make it session-scoped for speed)"
                ),
                stacklevel=3,
            )
        return self._engine(model, 1, one_shot=True), True

    def answer(self, model: Any, protocol: Protocol, problem: Problem) -> ProblemRecord:
        """An item's scored record (NotRun or EndpointError when it has none). Once the xdist
        controller announced a stop, every engine here stops first."""
        heard = None if self._stop_heard or self.channel is None else self.channel.stopped()
        if heard is not None:
            self._stop_heard = True
            self.stop_engines(heard)
        source, single_use = self.source_for(model, protocol)
        if problem.group:  # --gsm8k-config: the problem's config decides its protocol
            protocol = self._session.plan.protocol_of(problem)
        try:
            # --gsm8k-repeats K: K separate asks, one item (an error in any is the item's error)
            asks = protocol.request(problem).asks(self._session.settings.repeats)
            return self._scored(problem, protocol, [source.result(ask) for ask in asks], source)
        finally:
            for message in source.take_warnings():
                warnings.warn(pytest.PytestWarning(message), stacklevel=1)
            if single_use:
                source.close()

    def _scored(
        self, problem: Problem, protocol: Protocol, responses: Sequence[ModelResponse], by: Any
    ) -> ProblemRecord:
        pattern = self._session.plan.pattern  # --gsm8k-repeats: each answer scored, combined
        record = combine_repeats([score_response(problem, r, protocol, pattern) for r in responses])
        return {**record, "endpoint": shown_url(by.endpoint), "model": record["model"] or by.model}

    def late_records(self, problems: list[Problem]) -> dict[str, ProblemRecord]:
        """The scored records of answers the plugin's engine holds but no test read."""
        plan, matrix = self._session.plan, self.matrix
        default = self.engines.get(id(self._client))  # (never a model's id: None is none)
        out: dict[str, ProblemRecord] = {}
        for problem in problems:
            protocol = plan.protocol_of(problem)
            request = protocol.request(problem)
            engine = default if matrix is None else matrix.engine_of(request)
            if engine is None:
                continue
            ready = [engine.ready(ask) for ask in request.asks(plan.settings.repeats)]
            responses = [response for response in ready if response is not None]
            if len(responses) == len(ready):  # a problem is scored on all its repeats or not
                out[problem.id] = self._scored(problem, protocol, responses, engine)
        return out

    def stop(self, message: str) -> None:
        """The run stopped early (configs stop one by one): every engine fetches nothing more, and
        on an xdist controller every worker hears it (also those that call a model of their own)."""
        self.stop_engines(message)
        if self.answer_server is not None:
            self.answer_server.stop_all(message)

    def stop_engines(self, message: str, abort: bool = False) -> None:
        """Every engine here ends: stopped early, or ``abort``ed (the started server died)."""
        for engine in list(self.engines.values()):
            (engine.abort if abort else engine.stop)(message)

    def take_notes(self) -> list[str]:
        """The engines' warnings and end-of-run notes no test issued (the controller's)."""
        parts = [*self.engines.values(), *(self.matrix.made if self.matrix else [])]
        return [line for part in parts for line in (*part.take_warnings(), *part.notes())]

    def close(self) -> None:
        for part in (self.channel, self.answer_server, *self.engines.values(), self.matrix):
            if part is not None:
                part.close()
        self.channel = self.answer_server = self.matrix = None
        self.engines.clear()
        if not self._session.is_worker:
            for cache in self._caches.values():
                cache.close()
            shutil.rmtree(self._run_dir, ignore_errors=True)
            if self.server is not None:
                self.server.stop()
                self.server = None


def get_session(config: pytest.Config) -> Gsm8kSession:
    """This process's session, made on first use by its role (registered in pytest_configure)."""
    role = config.pluginmanager.get_plugin(ROLE_NAME)
    if role is None:
        raise pytest.UsageError("gsm8k: pytest-gsm8k is not configured (-p no:gsm8k?)")
    return cast(Gsm8kSession, role.session)
