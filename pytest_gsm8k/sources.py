"""Where a test's answer comes from, and who closes it: one :class:`Sources` per process.

* the plugin's own client, one process: this process's :class:`Engine`;
* the plugin's own client under xdist: the controller's engine, through
  :class:`RemoteAnswers` (the controller fetches for every worker);
* a user's session-scoped callable: this process's engine for it (under xdist it is
  asked per item, as xdist hands the items out: each worker has its own copy of it);
* a narrower-scoped model: a one-shot engine for the item's own request (nothing can
  be prefetched for a model that exists for one item only).

It also holds the model server this run started, so that one object stops everything
the run opened. It reads the run through a :class:`SourceContext` (session.py builds both).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from typing import Protocol as TypingProtocol

import pytest

from pytest_gsm8k.core.plan import Endpoint, RunPlan
from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.records import ProblemRecord
from pytest_gsm8k.core.scrub import Scrubber, shown_url
from pytest_gsm8k.core.settings import Settings, is_local_spec
from pytest_gsm8k.core.types import ModelResponse, Problem, Request

if TYPE_CHECKING:
    from pytest_gsm8k.runtime.answers import AnswerServer, Channel, RemoteAnswers
    from pytest_gsm8k.runtime.cache import ResponseCache
    from pytest_gsm8k.runtime.client import OpenAIClient
    from pytest_gsm8k.runtime.engine import Engine
    from pytest_gsm8k.runtime.matrix import Matrix
    from pytest_gsm8k.runtime.serve import ServedProcess


class AnswerSource(TypingProtocol):
    """Where a test's answer comes from: an engine here, or the xdist controller's."""

    @property
    def endpoint(self) -> str: ...

    @property
    def model(self) -> str: ...

    def result(self, request: Request) -> ModelResponse: ...

    def take_warnings(self) -> list[str]: ...

    def close(self) -> None: ...


class ConfigsModel:
    """The ``gsm8k_model`` value of a --gsm8k-config run: each config's own server answers
    (through the :class:`~pytest_gsm8k.runtime.matrix.Matrix`, or the xdist controller)."""

    endpoint = "(the configs' servers)"
    model = "(the configs' models)"


@dataclass(frozen=True)
class SourceContext:
    """What the answer sources read of the run; the getters are asked when needed (the
    plan, the run folder and the collected problems come later than the sources)."""

    settings: Settings
    config: pytest.Config  # its cache folder
    run_id: str
    started: float  # when the run started (what --gsm8k-resume reads)
    is_worker: bool
    plan: Callable[[], RunPlan]
    endpoint: Callable[[], Endpoint]
    collected: Callable[[], tuple[Problem, ...] | None]
    run_dir: Callable[[], Path]
    concurrency: Callable[[], int]
    scrubber: Callable[[], Scrubber]


class Sources:
    """This process's answer sources, made on demand, closed together."""

    def __init__(self, context: SourceContext) -> None:
        self._run = context
        #: engines by id() of the model object they call (session-scoped models only)
        self.engines: dict[int, Engine] = {}
        #: engines made with plan=False: the first engine_for(plan=True) plans them
        self._unplanned: set[int] = set()
        #: the scope of each gsm8k_model value set up so far, by id() (pytest_fixture_setup)
        self._scopes: dict[int, str] = {}
        self._warned_scope = False
        self._caches: dict[bool, ResponseCache] = {}
        self._client: OpenAIClient | None = None
        #: xdist worker: the channel that carries its plan to the controller and the
        #: controller's stop back; with the plugin's own model, its answers too (:attr:`remote`)
        self.channel: Channel | None = None
        #: xdist controller: serves its engine's answers to the workers
        self.answer_server: AnswerServer | None = None
        #: the model server this run started (--gsm8k-serve or --gsm8k-model=local)
        self.server: ServedProcess | None = None
        #: what the report says of that server
        self.server_info: dict[str, Any] | None = None
        self.server_death: str | None = None
        self._stop_heard = False
        #: --gsm8k-config, on the process that fetches: the configs' servers in sequence
        self.matrix: Matrix | None = None
        #: --gsm8k-config: what each config's server reported, by config name
        self.config_servers: dict[str, dict[str, Any]] = {}
        #: servers this run started, by config name ("" for --gsm8k-serve and the local
        #: model): (what names it in cache keys, the generation of runs this one read)
        self.started: dict[str, tuple[str, int]] = {}

    # what the plugin attaches

    def use_server(self, server: ServedProcess, info: dict[str, Any]) -> None:
        self.server = server
        self.server_info = info

    def use_matrix(self, matrix: Matrix) -> None:
        self.matrix = matrix

    def note_config_server(self, name: str, info: dict[str, Any]) -> None:
        self.config_servers[name] = info

    def use_channel(self, channel: Channel) -> None:
        self.channel = channel

    def use_answer_server(self, server: AnswerServer) -> None:
        self.answer_server = server

    @property
    def remote(self) -> RemoteAnswers | None:
        """xdist worker: the controller's answers (plugin's own client and protocol only)."""
        if self.channel is None:
            return None
        from pytest_gsm8k.runtime.answers import RemoteAnswers

        return self.channel if isinstance(self.channel, RemoteAnswers) else None

    def note_scope(self, model: object, scope: str) -> None:
        self._scopes[id(model)] = scope

    # caches, clients, engines

    def cache(self, persistent: bool) -> ResponseCache:
        from pytest_gsm8k.runtime.cache import ResponseCache

        run = self._run
        persistent = persistent and not run.settings.no_cache
        root: Path | None = None
        if persistent:
            if run.settings.cache_dir:
                root = Path(run.settings.cache_dir).expanduser()
            elif getattr(run.config, "cache", None) is not None:
                root = run.config.cache.mkdir("gsm8k")
        if root is None:
            persistent = False
            root = run.run_dir() / "cache"
        if persistent not in self._caches:
            self._caches[persistent] = ResponseCache(
                root,
                run.run_id,
                persistent=persistent,
                resume=run.settings.resume,
                started=run.started,
            )
        return self._caches[persistent]

    def default_client(self) -> OpenAIClient:
        """The process's one OpenAI-compatible client (the same object every time)."""
        from pytest_gsm8k.runtime.client import Breaker, OpenAIClient
        from pytest_gsm8k.runtime.wire import WireClient

        if self._client is not None:
            return self._client
        run = self._run
        if run.settings.vllm_config:
            self._client = ConfigsModel()  # type: ignore[assignment]
            return self._client  # type: ignore[return-value]
        endpoint = run.endpoint()
        settings = run.settings
        if not endpoint.model:
            raise pytest.UsageError(
                "gsm8k_model: no --gsm8k-model given and no gsm8k_model fixture override"
            )
        # the vllm preset's exact bytes go as vLLM's script sends them: over aiohttp
        kind = WireClient if settings.preset == "vllm" else OpenAIClient
        started = _cache_endpoint(settings, self.server_info)
        try:
            client = kind(
                model=endpoint.model,
                base_url=endpoint.base_url,
                api_key=settings.api_key(),
                timeout=settings.timeout,
                max_retries=settings.max_retries,
                concurrency=run.concurrency(),
                breaker=Breaker(),
                # a server this run starts has a new port every run: the command line (with
                # {port} as written) or the GGUF names it in cache keys, so a resumed run
                # finds its answers (and the next run, see started_generation, does not)
                cache_endpoint=started and self.started_generation("", started),
            )
        except ValueError as exc:  # a proxy the client cannot use (runtime/wire.py)
            raise pytest.UsageError(f"gsm8k: {exc}") from None
        self._client = client
        return client

    def started_generation(self, config: str, base: str) -> str:
        """``base`` (what names a server this run starts; ``config`` "" for --gsm8k-serve
        and the local model) with the generation of its runs
        (:meth:`ResponseCache.generation`): answers resume an unfinished run only."""
        generation = self.cache(True).generation(base)
        self.started[config] = (base, generation)
        return f"{base} gen:{generation}"

    def finish_started(self, complete: Callable[[str], bool]) -> None:
        """At the end (controller or a run without xdist): each started server whose run
        ``complete(config name or "")`` says has every answer is done; the next run asks
        again."""
        for key, (name, generation) in self.started.items():
            if complete(key):
                self.cache(True).finished(name, generation)

    def is_default(self, model: object) -> bool:
        return model is not None and model is self._client

    def _requests(
        self, problems: tuple[Problem, ...] | None, protocol: Protocol | None = None
    ) -> list[Request]:
        protocol = protocol or self._run.plan().protocol
        repeats = self._run.settings.repeats
        return [r for p in problems or () for r in protocol.request(p).asks(repeats)]

    def engine_for(
        self, model: Any, *, plan: bool = True, protocol: Protocol | None = None
    ) -> Engine:
        """The engine that calls ``model`` (created once per model object).

        A session-scoped model's engine prefetches this process's collected items, asked
        as ``protocol`` asks them (the first protocol it is asked for: a conftest's own
        ``gsm8k_protocol`` too, whose requests the plan's would never match). An xdist
        worker prefetches only the plan's protocol of the plugin's own client: any other
        is asked per item, as xdist hands the items out (each worker would otherwise fetch
        every problem).
        """
        from pytest_gsm8k.runtime.client import CallableClient
        from pytest_gsm8k.runtime.engine import Engine

        run = self._run
        # identity, as source_for decides: an equal copy (a conftest rebuilt it) is asked
        # as any other override, and no item pays for comparing the train tuple
        own = protocol is None or protocol is run.plan().protocol
        engine = self.engines.get(id(model))
        if engine is not None:
            if plan and id(model) in self._unplanned:  # started early, unplanned until now
                self._unplanned.discard(id(model))
                if own or not run.is_worker:
                    engine.start(self._requests(run.collected(), protocol))
            return engine
        client = model
        if not hasattr(model, "complete"):
            if not callable(model):
                raise pytest.UsageError(
                    f"gsm8k_model: expected a callable or a client, got {type(model).__name__}"
                )
            client = CallableClient(model, concurrency=run.concurrency(), model=run.settings.model)
        settings = run.settings
        engine = Engine(
            client,
            self.cache(bool(getattr(client, "persistent_cache", False))),
            concurrency=run.concurrency(),
            # early stopping: fetch no further ahead of the tests than the concurrency
            lookahead=run.concurrency() if settings.early_stop else None,
            scrub=run.scrubber(),
            stall_timeout=settings.stall_timeout,
            # what the server says about itself describes the plugin's own client only
            identity=run.endpoint().identity if client is self._client else None,
            # no listing showed who answers a request without a model field: its replies do
            named=run.endpoint().model
            if client is self._client and run.endpoint().identity is None
            else None,
        )
        self.engines[id(model)] = engine
        if run.is_worker and (client is not self._client or not own):
            return engine  # a user's model or protocol under xdist: per item
        if plan:
            engine.start(self._requests(run.collected(), protocol))
        else:
            self._unplanned.add(id(model))
        return engine

    def default_engine(self) -> Engine | None:
        return self.engines.get(id(self._client)) if self._client is not None else None

    def source_for(self, model: Any, protocol: Protocol) -> tuple[AnswerSource, bool]:
        """Where this item's answer comes from, and whether that source is single-use."""
        if self._run.settings.vllm_config:
            if not self.is_default(model):
                raise pytest.UsageError(
                    "gsm8k: --gsm8k-config runs each config's own server: a gsm8k_model "
                    "override cannot take part (remove it, or run without --gsm8k-config)"
                )
            if self.remote is not None:
                return self.remote, False
            if self.matrix is None:
                raise pytest.UsageError("gsm8k: --gsm8k-config: no config server was started")
            return self.matrix, False
        default = self.is_default(model) and protocol is self._run.plan().protocol
        if default and self.remote is not None:
            return self.remote, False
        if self._scopes.get(id(model), "session") != "session":
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
        return self.engine_for(model, protocol=protocol), False

    def _one_shot(self, model: Any) -> Engine:
        from pytest_gsm8k.runtime.client import CallableClient
        from pytest_gsm8k.runtime.engine import Engine

        run = self._run
        client = (
            model
            if hasattr(model, "complete")
            else CallableClient(model, concurrency=1, model=run.settings.model)
        )
        return Engine(
            client,
            self.cache(False),
            concurrency=1,
            scrub=run.scrubber(),
            stall_timeout=run.settings.stall_timeout,
        )

    def late_records(self, problems: list[Problem]) -> dict[str, ProblemRecord]:
        """The scored records of answers the plugin's engine holds but no test read."""
        from pytest_gsm8k.core.outcome import score_repeats

        plan = self._run.plan()
        matrix = self.matrix
        default = self.default_engine() if matrix is None else None
        if default is None and matrix is None:
            return {}
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

    # stopping

    def stop(self, message: str) -> None:
        """The run stopped early: every engine fetches nothing more, and on an xdist
        controller every worker hears it on the answers channel (also those that call a
        model of their own)."""
        for engine in list(self.engines.values()):
            engine.stop(message)
        if self.matrix is not None:
            self.matrix.stop(message)
        if self.answer_server is not None:
            self.answer_server.stop_all(message)

    def heed_stop(self) -> None:
        """xdist worker, before each item: once the controller announced a stop, every
        engine here stops too (one non-blocking look at the channel)."""
        if self._stop_heard:
            return
        message = self.channel.stopped() if self.channel is not None else None
        if message is None:
            return
        self._stop_heard = True
        for engine in list(self.engines.values()):
            engine.stop(message)

    def server_died(self, message: str) -> None:
        """The model server this run started is gone: stop every engine with its message."""
        self.server_death = message
        for engine in list(self.engines.values()):
            engine.abort(message)

    def take_notes(self) -> list[str]:
        """The engines' warnings and end-of-run notes no test issued (the controller's)."""
        out: list[str] = []
        for engine in self.engines.values():
            out.extend(engine.take_warnings())
            out.extend(engine.notes())
        if self.matrix is not None:
            out.extend(self.matrix.take_warnings())
            out.extend(self.matrix.notes())
        return out

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if self.answer_server is not None:
            self.answer_server.close()
            self.answer_server = None
        for engine in self.engines.values():
            engine.close()
        self.engines.clear()
        if self.matrix is not None:
            self.matrix.close()
            self.matrix = None
        if not self._run.is_worker:
            for cache in self._caches.values():
                cache.close()
            if self.server is not None:
                self.server.stop()
                self.server = None


def _cache_endpoint(settings: Settings, server: dict[str, Any] | None) -> str | None:
    """What names a server this run starts in cache keys (None: its base URL does): the
    command line, or the GGUF file (its path and size: another build of the model is
    another file)."""
    from pytest_gsm8k.runtime.serve import server_env_digest

    if settings.serve:
        return f"serve:{settings.serve} env:{server_env_digest()}"
    gguf = (server or {}).get("gguf")
    if is_local_spec(settings.model) and isinstance(gguf, str):
        try:
            size = Path(gguf).stat().st_size
        except OSError:
            return None
        return f"local:{gguf}:{size} env:{server_env_digest()}"
    return None
