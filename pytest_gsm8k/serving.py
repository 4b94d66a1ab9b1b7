"""The start of a run before any request (the outputs checked, the plan, the run's model
servers, the endpoint's preflight, the engine or the xdist answer server) and of fetching
once the items are collected (docs/serving.md): a failure is one line."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gsm8k.core.dataset import DatasetError
from pytest_gsm8k.core.plan import Endpoint
from pytest_gsm8k.core.presets import sends_model
from pytest_gsm8k.core.scrub import printable, shown_url
from pytest_gsm8k.core.settings import DEFAULT_BASE_URL, is_local_spec, url_problem, with_v1
from pytest_gsm8k.fixtures import defines
from pytest_gsm8k.session import CONFIG_OVERRIDE
from pytest_gsm8k.session import Gsm8kSession as State

if TYPE_CHECKING:  # the launchers, the preflight, the matrix: a run's start (not a worker's)
    from pytest_gsm8k.runtime import serve
    from pytest_gsm8k.runtime.engine import Engine

#: the longest the session-start ``GET /models`` may take (``--gsm8k-timeout`` when
#: shorter): a server that cannot send a small listing in this time is not one a run can use
PREFLIGHT_TIMEOUT = 10.0

#: --gsm8k-config without --gsm8k-serve: how vLLM's test starts a config's server
#: (RemoteOpenAIServer: ``vllm serve <model> <args>`` on a free port), on loopback here
VLLM_SERVE = "vllm serve {model} {server_args} --host 127.0.0.1 --port {port}"

_REFUSALS: dict[object, str] = {  # the preflight's, by the status or kind of GET /models failure
    401: "{shown} rejected the API key (HTTP 401); set it in ${env}",
    403: "{shown} refused access (HTTP 403)",
    "timeout": "{shown} did not answer GET /models within {timeout:g} s (see --gsm8k-timeout)",
    "unreachable": "cannot reach {shown}: {detail} (check --gsm8k-base-url)",
    "proxy": "{detail}",
}


def head_start_allowed(config: pytest.Config) -> bool:
    """Only while nothing visible at session start says the workers will collect other items
    (-k, -m but ``gsm8k``, FILTERS, test ids) or ask another model (a conftest or plugin's
    own ``gsm8k_model`` or ``gsm8k_protocol``): what stays invisible costs the head start."""
    option = config.option
    filtered = (
        getattr(option, "keyword", "")
        or (getattr(option, "markexpr", "") or "").strip() not in ("", "gsm8k")
        or any(getattr(option, name, None) for name in FILTERS)
        or any("::" in str(arg) for arg in config.args)
    )
    return not filtered and not defines(config)


def serve_run(state: State) -> serve.Started | None:
    """The run's own server, if any: ``--gsm8k-serve CMD`` or ``--gsm8k-model=local[:PATH]``,
    the GGUF served by llama.cpp (docs/local-model.md)."""
    from pytest_gsm8k.runtime import local, serve

    settings, command = state.settings, state.settings.serve or ""
    if not command and not is_local_spec(settings.model):
        return None
    with _one_line(state):
        if command:  # it holds {port}: core/settings.py refuses it without
            shown = state.scrubber().command(command)
            spec = serve.serve_spec(command, settings.model)
            check = "" if settings.model else "adopt"
            started = _launch(state, spec, "serve.log", check=check, about={"command": shown})
            what = f"{_shown(state, started.server.model)} with {shown!r}"
        else:
            path = local.resolve_model(settings.model or "local")
            # room for a 5-shot prompt (~1,000 tokens) plus the answer
            n_ctx = settings.local_ctx or max(
                local.DEFAULT_N_CTX, 1536 + (settings.max_tokens or 0)
            )
            spec = local.local_spec(path, n_ctx=n_ctx, threads=settings.local_threads)
            started = _launch(state, spec, "llama-server.log", about={"gguf": str(path)})
            what = f"{_shown(state, path.name)} with llama.cpp"
    return _serving(state, started, what)


def _launch_config(state: State, name: str) -> tuple[serve.ServedProcess, Engine]:
    """One config's server (docs/serving.md, "vLLM's configs") and the engine that asks it;
    a failure is one scrubbed ``ServeError`` line, the matrix's error for that config."""
    from pytest_gsm8k.runtime import serve

    config = state.plan.configs[name]
    command = state.settings.serve or VLLM_SERVE
    shown = state.scrubber().command(command)
    with _one_line(state, serve.ServeError):
        args, env = config.serve_args(), {**os.environ, **config.serve_env()}
        where = f"config {config.source}"
        spec = serve.serve_spec(command, config.model_name, args, env=env, context=where)
        about = {"command": shown, "argv_args": state.scrubber().words(args)}
        wait = config.startup_max_wait_seconds
        started = _launch(state, spec, f"serve-{name}.log", wait, check="listed", about=about)
        try:
            engine = state.sources.config_engine(name, config, started, shown)
        except ValueError as exc:  # a proxy the client cannot use (runtime/wire.py)
            started.server.stop(timeout=2.0)
            raise serve.ServeError(str(exc)) from None
    _serving(state, started, _shown(state, config.model_name), head=f"config {name}: ")
    return started.server, engine


@contextlib.contextmanager
def _one_line(state: State, error: Callable[[str], Exception] | None = None) -> Iterator[None]:
    """A launch's failure as one scrubbed line: a ``UsageError``, or ``error(line)``."""
    from pytest_gsm8k.runtime import serve

    try:
        yield
    except serve.ServeError as exc:
        line = state.scrubber().command(str(exc))
        raise (error(line) if error else pytest.UsageError(f"gsm8k: {line}")) from None


def _launch(
    state: State, spec: serve.Launch, log_name: str, timeout: float | None = None, **how: Any
) -> serve.Started:
    from pytest_gsm8k.runtime import serve

    # a file that stays after the run, so that the path an error line names can be read
    try:
        log = Path(state.config.cache.mkdir("gsm8k")) / log_name
    except (OSError, AttributeError):  # no cache folder: a temporary file
        name = f"gsm8k-{Path(log_name).stem}-"
        with tempfile.NamedTemporaryFile(prefix=name, suffix=".log", delete=False) as file:
            log = Path(file.name)
    waiting = (
        "gsm8k: waiting for the model server to answer GET /v1/models ({:.0f} s so far; log {})"
    )
    return serve.launch(
        spec,
        log_path=log,
        startup_timeout=state.settings.serve_timeout if timeout is None else timeout,
        scrub=state.scrubber(),
        api_key=state.settings.api_key(),
        list_timeout=min(state.settings.timeout, PREFLIGHT_TIMEOUT),
        progress=lambda waited: _write_line(state, waiting.format(waited, log)),
        **how,
    )


def _serving(state: State, started: serve.Started, what: str, head: str = "") -> serve.Started:
    """The server is the run's: named on the terminal (and, but for a config's, watched)."""
    server = started.server
    if not head:
        server.watch(lambda message: state.sources.stop_engines(message, abort=True))
    _write_line(
        state,
        f"gsm8k: {head}serving {what} at {_shown(state, server.base_url)} "
        f"(pid {server.pid}, ready in {server.startup_seconds:.1f} s)",
    )
    return started


def _shown(state: State, text: str) -> str:
    """Text a server sent (a model id), fit for the terminal: no secret, no escapes."""
    return printable(state.scrubber().text(text))


def _write_line(state: State, line: str) -> None:
    """A line of its own while the loop writes letters: under xdist pytest does not mark the
    line as taken (``currentfspath``), and ``write_line`` would splice it into the dots."""
    reporter = state.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    if state.run.records and not reporter.currentfspath:
        reporter.write("\n")  # letters (or the progress line) are on the current line
    reporter.write_line(line)


def preflight(state: State, endpoint: Endpoint) -> Endpoint:
    """One cheap call at session start: unreachable, bad key, unknown model, or a model that
    would not answer the preset's requests (an adapter's run would grade its base) is one
    line. Returns ``endpoint`` with what the server says of the model (for the cache)."""
    from pytest_gsm8k.runtime import serve
    from pytest_gsm8k.runtime.client import PreflightError, list_models

    # (core/settings.py refuses a bad --gsm8k-base-url; a started server's is the run's own)
    if endpoint.base_url and (problem := url_problem(endpoint.base_url)):
        raise pytest.UsageError(f"gsm8k: $OPENAI_BASE_URL: {problem}")  # it may hold a secret
    url, key = endpoint.base_url or DEFAULT_BASE_URL, state.settings.api_key()
    timeout = min(state.settings.timeout, PREFLIGHT_TIMEOUT)
    unnamed = None if sends_model(state.settings.preset) else "--gsm8k-model "
    try:
        with _one_line(state):
            model, scrub = endpoint.model or "", state.scrubber()
            identity = serve.check_model(url, model, scrub, key, timeout, unnamed)
    except PreflightError as exc:
        shown = shown_url(url)
        if (kind := exc.status or exc.kind) in _REFUSALS:
            line = _REFUSALS[kind].format(
                shown=shown, env=state.settings.api_key_env, timeout=timeout, detail=exc
            )
            raise pytest.UsageError(f"gsm8k: {line}") from None
        # a 404: when the same server answers under /v1, that is the URL to give
        if exc.status == 404 and (suggested := with_v1(url)):
            with contextlib.suppress(PreflightError):
                list_models(suggested, key, timeout=timeout)
                raise pytest.UsageError(
                    f"gsm8k: GET {shown.rstrip('/')}/models answered 404 and "
                    f"{suggested}/models answers: the base URL needs /v1 "
                    f"(--gsm8k-base-url={suggested})"
                ) from None
        return endpoint  # some servers have no /models; the first request will tell
    return Endpoint(endpoint.base_url, endpoint.model, identity)


#: options after which the workers may collect other items than the plan's
FILTERS = ("deselect", "lf", "stepwise", "stepwise_skip", "collectonly", "setupplan", "setuponly")


def fetch(state: State, session: pytest.Session) -> None:
    """At the end of collection: the configs' servers or the plugin's own engine fetch the
    collected problems (an override's engine starts at its first fixture setup); an xdist
    worker offers its plan to the controller instead. Not in a dry or broken run."""
    option = session.config.option
    broken = session.testsfailed and not getattr(option, "continue_on_collection_errors", False)
    if not state.run.collected or state.dry or broken:
        return
    if not (state.settings.vllm_config or state.plan.endpoint.model):
        return
    sources, plan, repeats = state.sources, state.plan, state.settings.repeats
    # whether a collected test may get gsm8k_model or gsm8k_protocol elsewhere
    overridden = defines(session.config) or any(map(defines, session.items))
    if state.is_worker:
        sources.connect(overridden)
    elif sources.matrix is not None:
        asks = (
            r for p in state.run.collected for r in plan.protocol_of(p).request(p).asks(repeats)
        )
        sources.matrix.start(list(asks))
    elif not overridden:
        sources.engine_for(sources.default_client(), plan.protocol)


def start(state: State, controller: bool) -> None:
    """The start of a run (module docstring): the data, protocol and baseline are read
    before any server starts (a bad file is one line), the plan is set once."""
    from pytest_gsm8k.reporting import check_outputs
    from pytest_gsm8k.runtime.matrix import Matrix

    settings, config = state.settings, state.config
    check_outputs(state, ("report", "html", "markdown"))  # asked for by name: any run
    if not settings.asked:
        return
    try:
        draft = state.build_plan()
    except DatasetError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    if (limit := settings.limit) is not None and limit > (size := len(draft.split.problems)):
        why = f"--gsm8k-limit {limit} is above the {size} problems of the split: all {size} run"
        config.issue_config_time_warning(pytest.PytestWarning(f"gsm8k: {why}"), stacklevel=2)
    check_outputs(state, ("step_summary",), draft)  # and the baselines, the open-file limit
    overridden = defines(config, ("gsm8k_model",))
    endpoint = draft.endpoint
    if draft.configs:  # each config's server starts in turn once the items are known
        if overridden:
            raise pytest.UsageError(CONFIG_OVERRIDE)
        state.sources.use_matrix(  # each stopped before the next one starts
            Matrix(
                [g.name for g in draft.groups],
                lambda name: _launch_config(state, name),
                say=lambda line: _write_line(state, printable(line)),
                lookahead=state.concurrency() if settings.early_stop else None,
            )
        )
    elif (started := serve_run(state)) is not None:
        state.sources.use_server(started)
        endpoint = started.endpoint
    if not (draft.configs or overridden):  # the options' endpoint may not be what is asked
        endpoint = preflight(state, endpoint)
    state.set_plan(dataclasses.replace(draft, endpoint=endpoint))
    if controller:
        state.sources.serve_workers(head_start_allowed(config))
    elif not overridden and state.sources.matrix is None and not state.dry:
        state.sources.warm()  # while pytest collects
