"""The run's model servers, as pytest sees them: ``--gsm8k-serve``, the local GGUF, each
``--gsm8k-config`` config's server, and the session-start preflight of the endpoint. Every
failure is one ``UsageError`` line (or a config's ``LaunchError``); the starting itself is
runtime/serve.py's.
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

from pytest_gsm8k.core.plan import Endpoint
from pytest_gsm8k.core.scrub import printable, shown_url
from pytest_gsm8k.core.settings import DEFAULT_BASE_URL, url_problem, with_v1
from pytest_gsm8k.session import Gsm8kSession as State

if TYPE_CHECKING:
    from pytest_gsm8k.runtime.matrix import Launched, Matrix
    from pytest_gsm8k.runtime.serve import ServedProcess, ServerSpec

_S = TypeVar("_S", bound="ServedProcess")


#: the longest the session-start ``GET /models`` may take in all (``--gsm8k-timeout`` when
#: shorter): a listing is small, and a server that cannot send it in this time is not one a
#: run can use
PREFLIGHT_TIMEOUT = 10.0


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
