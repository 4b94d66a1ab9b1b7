"""Where a test's answer comes from, and who closes it: one :class:`Sources` per process.
The plugin's own client: this process's engine, or under xdist the controller's; a user's
session-scoped callable: an engine here; a narrower-scoped one: a one-shot engine per item;
--gsm8k-config: the configs' servers (:class:`Matrix`). It holds the servers this run
started too, so that one object stops everything the run opened."""

from __future__ import annotations

import contextlib
import typing
import warnings
from collections.abc import Container
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gsm8k.core.plan import Endpoint, RunPlan
from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.records import ProblemRecord
from pytest_gsm8k.core.scrub import Scrubber, shown_url
from pytest_gsm8k.core.settings import Settings, is_local_spec
from pytest_gsm8k.core.tally import Tally
from pytest_gsm8k.core.types import Problem

if TYPE_CHECKING:
    from pytest_gsm8k.core.vllm_config import VllmConfig
    from pytest_gsm8k.runtime.answers import AnswerServer, Channel, RemoteAnswers
    from pytest_gsm8k.runtime.cache import ResponseCache
    from pytest_gsm8k.runtime.client import OpenAIClient
    from pytest_gsm8k.runtime.engine import Engine
    from pytest_gsm8k.runtime.matrix import Matrix
    from pytest_gsm8k.runtime.serve import ServedProcess, Started

    AnswerSource = Engine | RemoteAnswers | Matrix


CONFIG_OVERRIDE = (
    "gsm8k: --gsm8k-config runs each config's own server: a gsm8k_model "
    "override cannot take part (remove it, or run without --gsm8k-config)"
)


class ConfigsModel:
    """``gsm8k_model`` in a --gsm8k-config run: each config's own server answers."""

    endpoint = "(the configs' servers)"
    model = "(the configs' models)"


class SourceContext(typing.Protocol):
    """What the sources read of the run (Gsm8kSession): the plan, the run folder and the
    collected problems come later than the sources, so they are asked when needed."""

    settings: Settings
    config: pytest.Config  # its cache folder
    run_id: str
    is_worker: bool
    run: Tally  # when the run started (what --gsm8k-resume reads), the collected problems

    @property
    def plan(self) -> RunPlan: ...
    def endpoint(self) -> Endpoint: ...
    def run_dir(self) -> Path: ...
    def concurrency(self) -> int: ...
    def scrubber(self) -> Scrubber: ...


class Sources:
    """This process's answer sources, made on demand, closed together."""

    def __init__(self, context: SourceContext) -> None:
        self._session = context
        self.engines: dict[int, Engine] = {}  # by id() of the model they call
        self._unplanned: set[int] = set()  # engines made with plan=False
        self._scopes: dict[int, str] = {}  # each gsm8k_model value's fixture scope, by id()
        self._warned_scope = self._stop_heard = False
        self._caches: dict[bool, ResponseCache] = {}
        self._client: OpenAIClient | None = None
        #: xdist worker: the channel to the controller (its answers too: :attr:`remote`)
        self.channel: Channel | None = None
        self.answer_server: AnswerServer | None = None  # xdist controller
        #: the model server this run started (--gsm8k-serve, --gsm8k-model=local), its report
        self.server: ServedProcess | None = None
        self.server_info: dict[str, Any] | None = None
        self.matrix: Matrix | None = None  # --gsm8k-config, on the process that fetches
        self.config_servers: dict[str, dict[str, Any]] = {}  # what each config's reported
        #: started servers by config name ("" for the run's): (cache name, generation read)
        self.started: dict[str, tuple[str, int]] = {}

    def use_server(self, server: ServedProcess, info: dict[str, Any]) -> None:
        self.server, self.server_info = server, info

    def use_matrix(self, matrix: Matrix) -> None:
        self.matrix = matrix

    def use_channel(self, channel: Channel) -> None:
        self.channel = channel

    def use_answer_server(self, server: AnswerServer) -> None:
        self.answer_server = server

    def note_scope(self, model: object, scope: str) -> None:
        self._scopes[id(model)] = scope

    @property
    def remote(self) -> RemoteAnswers | None:
        """xdist worker: the controller's answers (plugin's own client and protocol only)."""
        if self.channel is None:
            return None
        from pytest_gsm8k.runtime.answers import RemoteAnswers

        return self.channel if isinstance(self.channel, RemoteAnswers) else None

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
            self._caches[persistent] = ResponseCache(
                root or session.run_dir() / "cache",
                session.run_id,
                persistent=persistent,
                resume=session.settings.resume,
                started=session.run.started,
            )
        return self._caches[persistent]

    def _new_client(
        self, key: str, endpoint: Endpoint, timeout: float, concurrency: int, started: str | None
    ) -> OpenAIClient:
        """An OpenAI-compatible client; the vllm preset's exact bytes go over aiohttp, as
        vLLM's script sends them. A server this run starts (``key``: its config, "" for the
        run's) has a new port every run: ``started`` names it in cache keys instead, with
        the generation of its runs (answers resume an unfinished run only)."""
        from pytest_gsm8k.runtime.client import OpenAIClient
        from pytest_gsm8k.runtime.wire import WireClient

        settings = self._session.settings
        if started is not None:
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
        if self._client is None:
            session, endpoint = self._session, self._session.endpoint()
            if session.settings.vllm_config:
                self._client = ConfigsModel()  # type: ignore[assignment]
            elif not endpoint.model:
                raise pytest.UsageError(
                    "gsm8k_model: no --gsm8k-model given and no gsm8k_model fixture override"
                )
            else:
                try:
                    started = self._started_name()
                    self._client = self._new_client(
                        "", endpoint, session.settings.timeout, session.concurrency(), started
                    )
                except ValueError as exc:  # a proxy the client cannot use
                    raise pytest.UsageError(f"gsm8k: {exc}") from None
        return self._client  # type: ignore[return-value]

    def _started_name(self) -> str | None:
        """What names the server this run started in cache keys: the command line (with
        {port} as written), or the GGUF (its path and size: another build is another file)."""
        from pytest_gsm8k.runtime.serve import server_env_digest

        settings, gguf = self._session.settings, (self.server_info or {}).get("gguf")
        if settings.serve:
            return f"serve:{settings.serve} env:{server_env_digest()}"
        if is_local_spec(settings.model) and isinstance(gguf, str):
            with contextlib.suppress(OSError):
                return f"local:{gguf}:{Path(gguf).stat().st_size} env:{server_env_digest()}"
        return None

    def config_engine(self, name: str, config: VllmConfig, started: Started, shown: str) -> Engine:
        """A config's engine (not started) on the server started for it; ValueError for a
        proxy the client cannot use."""
        from pytest_gsm8k.runtime.serve import server_env_digest

        args, timeout = " ".join(config.serve_args()), config.request_timeout_seconds
        concurrency = config.max_concurrency or self._session.concurrency()
        cached = f"serve:{shown} config:{name} args:{args} env:{server_env_digest(config.env)}"
        client = self._new_client(name, started.endpoint, timeout, concurrency, cached)
        self.config_servers[name] = started.info
        # vLLM's test waits request_timeout_seconds for an answer: less is not a stall
        return self._engine(client, concurrency, True, started.endpoint, stall_floor=timeout)

    def _engine(
        self,
        client: Any,
        concurrency: int,
        persistent: bool,
        endpoint: Endpoint | None,
        stall_floor: float = 0.0,
        one_shot: bool = False,
    ) -> Engine:
        """``endpoint``: the server the plugin's own client asks, whose description of the
        model its answers are cached under; a reply to a request naming no model must name
        it when no listing showed who answers such a request."""
        from pytest_gsm8k.runtime.engine import Engine

        settings = self._session.settings
        return Engine(
            client,
            self.cache(persistent),
            concurrency=concurrency,
            # early stopping: what is fetched past the decision is paid for and unused
            lookahead=concurrency if settings.early_stop and not one_shot else None,
            scrub=self._session.scrubber(),
            stall_timeout=settings.stall_timeout and max(settings.stall_timeout, stall_floor),
            identity=endpoint.identity if endpoint else None,
            named=endpoint.model if endpoint and endpoint.identity is None else None,
        )

    def finish_started(self, complete: Container[str]) -> None:
        """At the end: a started server whose run (by config name, "" for the run's) has
        every answer is done; the next run asks again."""
        for key, (name, generation) in self.started.items():
            if key in complete:
                self.cache(True).finished(name, generation)

    def _client_for(self, model: Any, concurrency: int) -> Any:
        """``model`` as a client: a client as is, a callable wrapped."""
        from pytest_gsm8k.runtime.client import CallableClient

        if hasattr(model, "complete"):
            return model
        if not callable(model):
            raise pytest.UsageError(
                f"gsm8k_model: expected a callable or a client, got {type(model).__name__}"
            )
        return CallableClient(model, concurrency=concurrency, model=self._session.settings.model)

    def engine_for(
        self, model: Any, *, plan: bool = True, protocol: Protocol | None = None
    ) -> Engine:
        """The engine that calls ``model`` (one per model object). A session-scoped model's
        engine prefetches this process's collected items as ``protocol`` asks them (the
        first it is asked for: a conftest's own ``gsm8k_protocol`` too). An xdist worker
        prefetches only the plan's protocol of the plugin's own client: any other is asked
        per item, as xdist hands the items out (else each worker would fetch every problem).
        """
        session = self._session
        # identity, as source_for decides: no item pays for comparing the train tuple
        own = protocol is None or protocol is session.plan.protocol
        engine = self.engines.get(id(model))
        if engine is None:
            concurrency = session.concurrency()
            client = self._client_for(model, concurrency)
            ours = client is self._client
            persistent = bool(getattr(client, "persistent_cache", False))
            endpoint = session.endpoint() if ours else None
            engine = self._engine(client, concurrency, persistent, endpoint)
            self.engines[id(model)] = engine
            if session.is_worker and not (ours and own):
                return engine  # a user's model or protocol under xdist: per item
            self._unplanned.add(id(model))
        if plan and id(model) in self._unplanned:
            self._unplanned.discard(id(model))
            if own or not session.is_worker:
                asked, repeats = protocol or session.plan.protocol, session.settings.repeats
                engine.start(
                    [r for p in session.run.collected or () for r in asked.request(p).asks(repeats)]
                )
        return engine

    def source_for(self, model: Any, protocol: Protocol) -> tuple[AnswerSource, bool]:
        """Where this item's answer comes from, and whether that source is single-use."""
        is_default = model is not None and model is self._client
        if self._session.settings.vllm_config:
            if not is_default:
                raise pytest.UsageError(CONFIG_OVERRIDE)
            if self.matrix is None and self.remote is None:
                raise pytest.UsageError("gsm8k: --gsm8k-config: no config server was started")
            return self.remote or self.matrix, False  # type: ignore[return-value]
        if is_default and protocol is self._session.plan.protocol and self.remote is not None:
            return self.remote, False
        if self._scopes.get(id(model), "session") == "session":
            return self.engine_for(model, protocol=protocol), False
        if not self._warned_scope:
            self._warned_scope = True
            warnings.warn(
                pytest.PytestWarning(
                    "gsm8k: gsm8k_model is not session-scoped: each item calls it for its own "
                    "problem only, nothing is prefetched (make it session-scoped for speed)"
                ),
                stacklevel=3,
            )
        return self._engine(self._client_for(model, 1), 1, False, None, one_shot=True), True

    def late_records(self, problems: list[Problem]) -> dict[str, ProblemRecord]:
        """The scored records of answers the plugin's engine holds but no test read."""
        from pytest_gsm8k.core.outcome import score_repeats

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
            if len(responses) < len(ready):
                continue  # a problem is scored on all its repeats or not at all
            record = score_repeats(problem, responses, protocol, plan.pattern)
            record["endpoint"] = shown_url(engine.endpoint)
            record["model"] = record["model"] or engine.model
            out[problem.id] = record
        return out

    def stop(self, message: str) -> None:
        """The run stopped early: every engine fetches nothing more, and on an xdist
        controller every worker hears it (also those that call a model of their own)."""
        for engine in list(self.engines.values()):
            engine.stop(message)
        if self.matrix is not None:
            self.matrix.stop(message)
        if self.answer_server is not None:
            self.answer_server.stop_all(message)

    def heed_stop(self) -> None:
        """xdist worker, before each item: once the controller announced a stop, every
        engine here stops too (one non-blocking look at the channel)."""
        if self._stop_heard or self.channel is None:
            return
        message = self.channel.stopped()
        if message is not None:
            self._stop_heard = True
            for engine in list(self.engines.values()):
                engine.stop(message)

    def server_died(self, message: str) -> None:
        """The model server this run started is gone: every engine ends with its message."""
        for engine in list(self.engines.values()):
            engine.abort(message)

    def take_notes(self) -> list[str]:
        """The engines' warnings and end-of-run notes no test issued (the controller's)."""
        out: list[str] = []
        sources: list[Engine | Matrix] = [*self.engines.values()]
        for source in sources + ([self.matrix] if self.matrix else []):
            out += [*source.take_warnings(), *source.notes()]
        return out

    def close(self) -> None:
        for part in (self.channel, self.answer_server, *self.engines.values(), self.matrix):
            if part is not None:
                part.close()
        self.channel = self.answer_server = self.matrix = None
        self.engines.clear()
        if not self._session.is_worker:
            for cache in self._caches.values():
                cache.close()
            if self.server is not None:
                self.server.stop()
                self.server = None
