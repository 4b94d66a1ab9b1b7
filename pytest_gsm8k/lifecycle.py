"""Session steps the plugin's hooks call: the run's server, the preflight check, the
start of fetching (here, or on the xdist controller for every worker), the early stops.
pytest types only; no hook definitions here.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from pytest_gsm8k import fixtures
from pytest_gsm8k.core.plan import Endpoint, RunPlan
from pytest_gsm8k.core.scrub import printable, shown_url
from pytest_gsm8k.core.settings import DEFAULT_BASE_URL, url_problem, with_v1
from pytest_gsm8k.state import State

if TYPE_CHECKING:
    from pytest_gsm8k.core.early_stop import EarlyStop
    from pytest_gsm8k.runtime.answers import AnswerServer, Channel, RemoteAnswers
    from pytest_gsm8k.runtime.matrix import Launched, Matrix
    from pytest_gsm8k.runtime.serve import ServedProcess, ServerSpec

_S = TypeVar("_S", bound="ServedProcess")

#: the longest the session-start ``GET /models`` may take in all (``--gsm8k-timeout`` when
#: shorter): a listing is small, and a server that cannot send it in this time is not one a
#: run can use
PREFLIGHT_TIMEOUT = 10.0

#: how long an xdist worker waits for one answer from the controller beyond the engine's
#: own bounds (the controller's engine ends every request by then; this ends only a wait
#: that nothing else would)
REMOTE_WAIT_SLACK = 120.0


def deselected_by(config: pytest.Config) -> str:
    """The options that may have deselected problems, as the command line spells them."""
    option = config.option
    named = [
        flag
        for flag, given in (
            ("-k", getattr(option, "keyword", "")),
            ("-m", getattr(option, "markexpr", "")),
            ("--lf", getattr(option, "lf", False)),
            ("--deselect", getattr(option, "deselect", None)),
        )
        if given
    ]
    return ", ".join(named) or "the test ids or paths given"


#: xdist controller: the head start (:meth:`AnswerServer.head_start`) is this many rounds of
#: the engine's concurrency, about the workers' start-up at a fast endpoint's latency, and
#: never more than :data:`HEAD_START_MAX` requests
HEAD_START_ROUNDS = 4
HEAD_START_MAX = 256


def head_start_allowed(config: pytest.Config) -> bool:
    """xdist controller: whether it may send requests of its own plan before a worker
    offers one.

    Only while nothing visible at session start says the workers will collect other
    items than the plan's, or ask another model: no -k, no -m but ``gsm8k``, no
    --deselect, --lf or stepwise, no test ids, no collect-only or setup plan, no conftest
    or plugin with its own ``gsm8k_model`` or ``gsm8k_protocol``. What stays invisible
    (a test module's own fixture, a conftest hook that deselects) costs at most the head
    start's requests, never an outcome.
    """
    option = config.option
    filtered = (
        getattr(option, "keyword", "")
        or (getattr(option, "markexpr", "") or "").strip() not in ("", "gsm8k")
        or getattr(option, "deselect", None)
        or getattr(option, "lf", False)
        or getattr(option, "stepwise", False)
        or getattr(option, "stepwise_skip", False)
        or getattr(option, "collectonly", False)
        or getattr(option, "setupplan", False)
        or getattr(option, "setuponly", False)
        or any("::" in str(arg) for arg in config.args)
    )
    return not filtered and not plugins_define(config)


def early_stop_for(state: State, name: str = "") -> EarlyStop | None:
    """The :class:`EarlyStop` of one group (``--gsm8k-early-stop``): the run's (``name``
    ""), or ``--gsm8k-config`` config ``name``'s; None with nothing to decide.

    Its problems are those the group set out to do (after deselection); every gate of the
    group takes part as the end of the run decides it, the noise-aware gate against the
    group's stored baseline when there is one it may be compared with: none with
    ``--snapshot-update`` (the run writes it), none that is refused (the baseline gate at
    the end says why).
    """
    from pytest_gsm8k.core import baseline as bl
    from pytest_gsm8k.core.early_stop import EarlyStop

    plan = state.plan
    settings = plan.settings
    wanted = {p.id for p in state.run.wanted(plan)}
    group = plan.group_by_name[name] if name else None
    here: dict[str, Any] = {"dataset": plan.split.identity()}
    if group is None:
        problems, stored, split = plan.problems, plan.baseline, plan.split.problems
        here["protocol"] = {**plan.protocol.identity(), "label": plan.protocol.label}
        floor, seed = None, settings.seed
    else:
        # a config is decided by the certain bounds only (no order counts there)
        problems, stored, split = group.problems, group.baseline, group.split_problems(plan.split)
        here["protocol"] = {**group.protocol.identity(), "label": group.label}
        here["config"] = {"name": group.name, "model_name": group.config.model_name}
        floor, seed = group.floor, 0
    document = None
    if stored is not None and stored.exists and not plan.update_baseline:
        with contextlib.suppress(bl.BaselineError):
            document = bl.check(stored, here, split)["problems"]
    return EarlyStop.for_group(
        [p.id for p in problems if p.id in wanted],
        plan.gates,
        mode=settings.early_stop,  # type: ignore[arg-type]
        floor=floor,
        baseline=document,
        seed=seed,
        alpha=settings.early_stop_alpha,
        repeats=settings.repeats,
    )


#: the plugin's own fixtures a user may replace (a conftest, plugin, test module or class)
OVERRIDABLE = ("gsm8k_model", "gsm8k_protocol")


def defines_fixture(holder: object, names: tuple[str, ...] = OVERRIDABLE) -> bool:
    """Whether ``holder`` (a conftest or plugin module, a test module or class) defines
    one of the fixtures ``names`` other than the plugin's own: a conftest that merely
    imports ``pytest_gsm8k.fixtures.gsm8k_model`` overrides nothing."""
    for name in names:
        value = getattr(holder, name, None)
        if value is not None and value is not getattr(fixtures, name, None):
            return True
    return False


def plugins_define(config: pytest.Config, names: tuple[str, ...] = OVERRIDABLE) -> bool:
    """Whether a conftest or plugin registered so far defines one of ``names`` itself."""
    return any(
        defines_fixture(plugin, names)
        for plugin in config.pluginmanager.get_plugins()
        if plugin is not None and not getattr(plugin, "__name__", "").startswith("pytest_gsm8k")
    )


def overrides_present(session: pytest.Session) -> bool:
    """Whether any collected test may get ``gsm8k_model`` or ``gsm8k_protocol`` from a
    fixture other than the plugin's: a conftest or plugin that defines one, or a test
    module or class that does. Public pytest API only (plugins, item.module, item.cls)."""
    if plugins_define(session.config):
        return True
    for item in session.items:
        for holder in (getattr(item, "module", None), getattr(item, "cls", None)):
            if holder is not None and defines_fixture(holder):
                return True
    return False


def start_early(state: State, session: pytest.Session) -> None:
    """Start fetching at the end of collection, not at the first test.

    When no test can get another model or protocol than the plugin's own,
    the plan is known now: one process fetches it itself; an xdist worker
    offers it to the controller, whose engine fetches for every worker.
    """
    config = session.config
    idle = config.option.collectonly or getattr(config.option, "setupplan", False)
    broken = session.testsfailed and not getattr(
        config.option, "continue_on_collection_errors", False
    )
    collected = state.run.collected
    matrix = bool(state.settings.vllm_config)
    if not collected or idle or broken or not (matrix or state.plan.endpoint.model):
        return
    sources = state.sources
    if sources.matrix is not None:
        repeats = state.settings.repeats
        sources.matrix.begin(
            [r for p in collected for r in state.plan.protocol_of(p).request(p).asks(repeats)]
        )
        return
    if overrides_present(session):
        # each model's engine starts at its first fixture setup; an xdist worker still
        # offers its plan, and hears the controller's stop, on the answers channel
        channel = open_channel(state)
        if channel is not None:
            sources.use_channel(channel)
        return
    if state.workerinput is not None:
        remote = connect_remote(state)
        if remote is not None:
            sources.use_remote(remote)
        return
    sources.engine_for(sources.default_client())


def connect_remote(state: State) -> RemoteAnswers | None:
    """xdist worker: the controller's answers, with this worker's plan offered (None when
    the controller serves none: a run whose tests bring their own model)."""
    from pytest_gsm8k.runtime.answers import RemoteAnswers

    workerinput = state.workerinput or {}
    address = workerinput.get("gsm8k_answers")
    if address is None:
        return None
    client = state.sources.default_client()
    settings = state.settings
    wait = settings.timeout * (settings.max_retries + 1) + REMOTE_WAIT_SLACK
    try:
        remote = RemoteAnswers(
            (str(address[0]), int(address[1])),
            str(workerinput["gsm8k_answers_token"]),
            endpoint=client.endpoint,
            model=client.model,
            wait=wait,
        )
        remote.offer([p.id for p in state.run.collected or ()])
    except OSError as exc:
        raise pytest.UsageError(
            f"gsm8k: cannot reach the xdist controller's answers ({exc})"
        ) from None
    return remote


def open_channel(state: State) -> Channel | None:
    """xdist worker whose tests bring their own model: the channel to the controller, this
    worker's plan offered on it (None outside xdist or without one)."""
    from pytest_gsm8k.runtime.answers import Channel

    workerinput = state.workerinput or {}
    address = workerinput.get("gsm8k_answers")
    if address is None:
        return None
    try:
        channel = Channel(
            (str(address[0]), int(address[1])), str(workerinput["gsm8k_answers_token"])
        )
        channel.offer([p.id for p in state.run.collected or ()])
    except OSError as exc:
        raise pytest.UsageError(
            f"gsm8k: cannot reach the xdist controller's answers ({exc})"
        ) from None
    return channel


def warm_engine(state: State) -> None:
    """One process: start the engine for the plugin's own client now, and import and build
    the HTTP client on its thread while pytest collects (openai's imports would otherwise
    sit between the end of collection and the first request). The plan follows at the end
    of collection (:func:`start_early`)."""
    sources = state.sources
    client = sources.default_client()
    engine = sources.engine_for(client, plan=False)
    engine.loop.call_soon_threadsafe(client.warm)


def start_controller(state: State, head_start: bool = False) -> AnswerServer:
    """xdist controller: one engine for the plugin's own client, served to the workers.

    The engine starts importing the HTTP client now, while xdist starts the
    workers and, with ``head_start`` (:func:`head_start_allowed`), sends the first
    requests of the plan; the rest waits until a worker offers its plan (a run whose
    tests all override the model asks for nothing more).
    """
    from pytest_gsm8k.runtime.answers import AnswerServer

    sources = state.sources
    if sources.matrix is not None:
        server = AnswerServer(
            sources.matrix, state.plan.request_for, repeats=state.settings.repeats
        )
        server.start()
        return server
    client = sources.default_client()
    engine = sources.engine_for(client, plan=False)
    server = AnswerServer(engine, state.plan.request_for, repeats=state.settings.repeats)
    # Listen before the import: warming runs on the loop's thread and, on a loaded machine,
    # importing openai there once held the listen step past its bound.
    server.start()
    engine.loop.call_soon_threadsafe(client.warm)
    if head_start:
        limit = min(HEAD_START_ROUNDS * engine.concurrency, HEAD_START_MAX)
        server.head_start([p.id for p in state.plan.run_order], limit)
    return server


def start_local(state: State) -> ServerStarted:
    """``--gsm8k-model=local[:PATH]``: serve the GGUF with llama.cpp, probe it once."""
    from pytest_gsm8k.runtime import local

    try:
        path = local.resolve_model(state.settings.model or "local")
        # room for a 5-shot prompt (~1,000 tokens) plus the answer
        n_ctx = state.settings.local_ctx or max(
            local.DEFAULT_N_CTX, 1536 + (state.settings.max_tokens or 0)
        )
        spec = local.local_spec(
            path, alias=local.DEFAULT_ALIAS, n_ctx=n_ctx, threads=state.settings.local_threads
        )
    except local.LocalServerError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    server = _start_server(state, spec, "llama-server.log")
    try:
        server.probe()
    except local.LocalServerError as exc:
        server.stop(timeout=2.0)
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    return _serving(
        state, server, {"gguf": str(path)}, f"{_shown(state, path.name)} with llama.cpp"
    )


def start_serve(state: State) -> ServerStarted:
    """``--gsm8k-serve CMD``: start the run's server, wait for it, take its model if not given.

    Started on the controller before xdist starts the workers, which get its URL and
    model through ``workerinput``; stopped by ``State.close`` (and atexit, and its
    supervisor when pytest dies).
    """
    from pytest_gsm8k.runtime import serve
    from pytest_gsm8k.runtime.client import PreflightError, list_models

    settings = state.settings
    command = settings.serve or ""  # holds {port}: core/settings.py refuses it without
    scrub = state.scrubber()
    try:
        spec = serve.serve_spec(command, settings.model)
    except serve.ServeError as exc:
        raise pytest.UsageError(f"gsm8k: {scrub.command(str(exc))}") from None
    server = _start_server(state, spec, "serve.log")
    if not settings.model:
        try:
            models = list_models(
                server.base_url, settings.api_key(), timeout=_preflight_timeout(state)
            )
        except PreflightError as exc:
            server.stop(timeout=2.0)
            raise pytest.UsageError(
                f"gsm8k: --gsm8k-serve: cannot list the server's models ({exc.detail}); "
                "give --gsm8k-model"
            ) from None
        if len(models) != 1:
            server.stop(timeout=2.0)
            raise pytest.UsageError(
                f"gsm8k: --gsm8k-serve: the server lists {len(models)} models "
                f"({_listing(state, models) or 'none'}); choose one with --gsm8k-model"
            )
        if scrub.text(models[0]) != models[0]:
            # adopted, the key would be the run's model name: terminal, report, baseline
            server.stop(timeout=2.0)
            raise pytest.UsageError(
                f"gsm8k: --gsm8k-serve: the server's only model id holds the API key "
                f"({_shown(state, models[0])}); choose the model with --gsm8k-model"
            )
        server.use_model(models[0])
    shown = scrub.command(command)
    return _serving(
        state, server, {"command": shown}, f"{_shown(state, server.model)} with {shown!r}"
    )


def server_log(state: State, name: str) -> Path:
    """Where a server's output goes: a file that stays after the run, so that the path an
    error line names can be read. Under pytest's cache folder (``.pytest_cache/d/gsm8k/``,
    the last run's) when the cache plugin is active; else a new file in the temp folder."""
    cache = getattr(state.config, "cache", None)
    if cache is not None:
        with contextlib.suppress(OSError):
            return Path(cache.mkdir("gsm8k")) / name
    handle, path = tempfile.mkstemp(prefix=f"gsm8k-{Path(name).stem}-", suffix=".log")
    os.close(handle)
    return Path(path)


def _start_server(state: State, spec: ServerSpec[_S], log_name: str) -> _S:
    """Start ``spec`` (the one way both presets start a server); its failure is one line."""
    from pytest_gsm8k.runtime.serve import start_server

    log = server_log(state, log_name)
    try:
        server = start_server(
            spec,
            log_path=log,
            startup_timeout=state.settings.serve_timeout,
            progress=_progress_line(state, log),
            scrub=state.scrubber().command,
        )
    except spec.error as exc:
        raise pytest.UsageError(f"gsm8k: {state.scrubber().command(str(exc))}") from None
    return server


@dataclass(frozen=True)
class ServerStarted:
    """A server this run started and is now the run's: what to ask it and what the report
    says of it."""

    server: ServedProcess
    info: dict[str, Any]

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(base_url=self.server.base_url, model=self.server.model)


def _serving(
    state: State, server: ServedProcess, about: dict[str, str], what: str
) -> ServerStarted:
    """The server is the run's: watched, in the report, named on the terminal."""
    server.watch(state.sources.server_died)
    info: dict[str, Any] = {
        "pid": server.pid,
        **about,
        "base_url": server.base_url,
        "model": server.model,
        "startup_seconds": round(server.startup_seconds, 2),
        "log": str(server.log_path),
    }
    _write_line(
        state,
        f"gsm8k: serving {what} at {_shown(state, server.base_url)} "
        f"(pid {server.pid}, ready in {server.startup_seconds:.1f} s)",
    )
    return ServerStarted(server, info)


def _shown(state: State, text: str) -> str:
    """Text a server sent (a model id), fit for the terminal: no secret, no escapes."""
    return printable(state.scrubber().text(text))


def _listing(state: State, models: list[str]) -> str:
    """Up to ten model ids a server listed, fit for the terminal (secrets and escapes out)."""
    shown = ", ".join(_shown(state, m) for m in models[:10])
    return shown + (", ..." if len(models) > 10 else "")


def _write_line(state: State, line: str) -> None:
    """A line of its own, also while the test loop writes its letters: under xdist pytest
    writes them without marking the line as taken (``currentfspath``), so ``write_line``
    would splice the line into the dots (``..gsm8k: config B: serving ...``)."""
    reporter = state.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    if state.run.records and not reporter.currentfspath:
        reporter.write("\n")  # letters (or the progress line) are on the current line
    reporter.write_line(line)


def _progress_line(state: State, log: Path) -> Callable[[float], None]:
    def progress(waited: float) -> None:
        _write_line(
            state,
            f"gsm8k: waiting for the model server to answer GET /v1/models "
            f"({waited:.0f} s so far; log {log})",
        )

    return progress


def model_overridden(config: pytest.Config) -> bool:
    """Whether a conftest or plugin loaded so far (session start: before collection)
    defines its own ``gsm8k_model`` fixture.

    Then the endpoint of the options may not be what is asked at all, and the
    session-start check would refuse a run that needs no endpoint.
    """
    return plugins_define(config, ("gsm8k_model",))


def _preflight_timeout(state: State) -> float:
    return min(state.settings.timeout, PREFLIGHT_TIMEOUT)


def preflight(state: State, endpoint: Endpoint) -> Endpoint:
    """One cheap call at session start: unreachable, bad key, unknown model, or a model that
    would not answer the preset's requests (they name none: an adapter's run would grade
    its base) is one line. Returns ``endpoint`` with what the server says about the model:
    cached answers are reused only while it says the same."""
    from pytest_gsm8k.core.identity import describe_server, unnamed_answerer, unnamed_refusal
    from pytest_gsm8k.core.presets import sends_model
    from pytest_gsm8k.runtime.client import PreflightError, list_models

    url = endpoint.base_url
    if url and (problem := url_problem(url)):
        source = "--gsm8k-base-url" if state.settings.base_url else "$OPENAI_BASE_URL"
        raise pytest.UsageError(f"gsm8k: {source}: {problem}")  # the URL may hold a secret
    shown = shown_url(url or DEFAULT_BASE_URL)
    cards: list[dict[str, Any]] = []
    timeout = _preflight_timeout(state)
    try:
        models = list_models(url, state.settings.api_key(), timeout=timeout, cards=cards)
    except PreflightError as exc:
        if exc.kind == "auth":
            raise pytest.UsageError(
                f"gsm8k: {shown} rejected the API key (HTTP 401); set it in "
                f"${state.settings.api_key_env}"
            ) from None
        if exc.kind == "forbidden":
            raise pytest.UsageError(f"gsm8k: {shown} refused access (HTTP 403)") from None
        if exc.kind == "timeout":
            raise pytest.UsageError(
                f"gsm8k: {shown} did not answer GET /models within {timeout:g} s "
                "(see --gsm8k-timeout)"
            ) from None
        if exc.kind == "unreachable":
            raise pytest.UsageError(
                f"gsm8k: cannot reach {shown}: {exc.detail} (check --gsm8k-base-url)"
            ) from None
        if exc.kind == "proxy":
            raise pytest.UsageError(f"gsm8k: {exc.detail}") from None
        if exc.status == 404:
            _refuse_without_v1(state, url or DEFAULT_BASE_URL, timeout)
        return endpoint  # some servers have no /models; the first request will tell
    if models and endpoint.model not in models:
        raise pytest.UsageError(
            f"gsm8k: model {endpoint.model!r} is not served by {shown} "
            f"(it serves: {_listing(state, models)})"
        )
    if not sends_model(state.settings.preset):
        why = unnamed_answerer(cards, endpoint.model or "")
        if why is not None:
            line = unnamed_refusal(endpoint.model or "", why)
            raise pytest.UsageError(f"gsm8k: --gsm8k-model {_shown(state, line)}")
    identity = describe_server(cards, endpoint.model or "")
    return Endpoint(endpoint.base_url, endpoint.model, identity)


def _refuse_without_v1(state: State, base_url: str, timeout: float) -> None:
    """``GET {base_url}/models`` answered 404: when the base URL does not end in /v1 and the
    same server answers under /v1, that is the URL to give; say so in one line (servers that
    have no /models at all are left to the first request, whose 404 says the same)."""
    from pytest_gsm8k.runtime.client import PreflightError, list_models

    suggested = with_v1(base_url)
    if suggested is None:
        return
    try:
        list_models(suggested, state.settings.api_key(), timeout=timeout)
    except PreflightError:
        return
    raise pytest.UsageError(
        f"gsm8k: GET {shown_url(base_url).rstrip('/')}/models answered 404 and "
        f"{suggested}/models answers: the base URL needs /v1 "
        f"(--gsm8k-base-url={suggested})"
    )


def limit_note(state: State, plan: RunPlan) -> None:
    """A --gsm8k-limit above the split's size runs the whole split: said once."""
    limit, size = plan.settings.limit, len(plan.split.problems)
    if limit is not None and limit > size:
        state.config.issue_config_time_warning(
            pytest.PytestWarning(
                f"gsm8k: --gsm8k-limit {limit} is above the {size} problems of the split: "
                f"all {size} run"
            ),
            stacklevel=2,
        )


#: --gsm8k-config without --gsm8k-serve: how vLLM's test starts a config's server
#: (RemoteOpenAIServer: ``vllm serve <model> <args>`` on a free port), on loopback here
VLLM_SERVE = "vllm serve {model} {server_args} --host 127.0.0.1 --port {port}"


def start_matrix(state: State) -> Matrix:
    """--gsm8k-config: the configs' servers, started in sequence once the items are known
    (:meth:`Matrix.begin`), each stopped before the next one starts."""
    from pytest_gsm8k.runtime.matrix import Matrix

    plan = state.plan
    return Matrix(
        [g.name for g in plan.groups],
        lambda name: _launch_config(state, name),
        say=lambda line: _write_line(state, printable(line)),
        lookahead=state.concurrency() if state.settings.early_stop else None,
    )


def _launch_config(state: State, name: str) -> Launched:
    """One config's server (its ``server_args`` and the flags vLLM's test adds, its
    ``env``, waited for up to its ``startup_max_wait_seconds``) and the engine that asks
    it; a failure is :class:`LaunchError`, one line."""
    from pytest_gsm8k.core.identity import describe_server, unnamed_answerer, unnamed_refusal
    from pytest_gsm8k.runtime import serve
    from pytest_gsm8k.runtime.client import Breaker, PreflightError, list_models
    from pytest_gsm8k.runtime.engine import Engine
    from pytest_gsm8k.runtime.matrix import Launched, LaunchError
    from pytest_gsm8k.runtime.wire import WireClient

    settings = state.settings
    group = state.plan.group_by_name[name]
    config = group.config
    command = settings.serve or VLLM_SERVE
    scrub = state.scrubber()
    env = {**os.environ, **config.serve_env()}
    try:
        spec = serve.serve_spec(
            command,
            config.model_name,
            server_args=config.serve_args(),
            env=env,
            context=f"config {config.source}",
        )
    except serve.ServeError as exc:
        raise LaunchError(scrub.command(str(exc))) from None
    log = server_log(state, f"serve-{name}.log")
    try:
        server = serve.start_server(
            spec,
            log_path=log,
            startup_timeout=config.startup_max_wait_seconds,
            progress=_progress_line(state, log),
            scrub=scrub.command,
        )
    except serve.ServeError as exc:
        raise LaunchError(scrub.command(str(exc))) from None
    cards: list[dict[str, Any]] = []
    try:
        models = list_models(
            server.base_url, settings.api_key(), timeout=_preflight_timeout(state), cards=cards
        )
    except PreflightError:
        models = []
    if models and config.model_name not in models:
        server.stop(timeout=2.0)
        raise LaunchError(
            f"the server does not serve {config.model_name!r} (it serves: "
            f"{_listing(state, models)})"
        )
    why = unnamed_answerer(cards, config.model_name)  # the vllm preset names no model
    if why is not None:
        server.stop(timeout=2.0)
        raise LaunchError(_shown(state, unnamed_refusal(config.model_name, why)))
    from pytest_gsm8k.runtime.serve import server_env_digest

    concurrency = config.max_concurrency or state.concurrency()
    # every config runs the vllm preset: its exact bytes over aiohttp, as vLLM's script
    try:
        client = WireClient(
            model=config.model_name,
            base_url=server.base_url,
            api_key=settings.api_key(),
            timeout=config.request_timeout_seconds,
            max_retries=settings.max_retries,
            concurrency=concurrency,
            breaker=Breaker(),
            # the port changes every run: the command, the config and its arguments name it
            cache_endpoint=state.sources.started_generation(
                name,
                f"serve:{scrub.command(command)} config:{name} "
                f"args:{' '.join(config.serve_args())} env:{server_env_digest(config.env)}",
            ),
        )
    except ValueError as exc:  # a proxy the client cannot use (runtime/wire.py)
        server.stop(timeout=2.0)
        raise LaunchError(str(exc)) from None
    engine = Engine(
        client,
        state.sources.cache(True),
        concurrency=concurrency,
        breaker=client.breaker,
        scrub=scrub,
        # a config's answers may each take up to its request_timeout_seconds (vLLM's test
        # waits that long): no answer for less than that is not a stall
        stall_timeout=settings.stall_timeout
        and max(settings.stall_timeout, config.request_timeout_seconds),
        identity=(identity := describe_server(cards, config.model_name)),
        named=config.model_name if identity is None else None,  # no listing: the replies tell
        # --gsm8k-early-stop: fetch no further ahead of the answers used than the
        # concurrency (what is fetched past the config's decision is paid for and unused)
        lookahead=concurrency if settings.early_stop else None,
    )
    info: dict[str, Any] = {
        "pid": server.pid,
        "command": scrub.command(command),
        "argv_args": scrub.words(config.serve_args()),
        "base_url": server.base_url,
        "model": config.model_name,
        "startup_seconds": round(server.startup_seconds, 2),
        "log": str(server.log_path),
    }
    state.sources.note_config_server(name, scrub.obj(info))
    _write_line(
        state,
        f"gsm8k: config {name}: serving {_shown(state, config.model_name)} at "
        f"{server.base_url} (pid {server.pid}, ready in {server.startup_seconds:.1f} s)",
    )
    return Launched(server, engine)
