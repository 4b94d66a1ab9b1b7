"""The run's model servers as pytest sees them, and the session-start preflight of the
endpoint (docs/serving.md). runtime/serve.py's ``launch`` starts each server; here its
failure becomes one ``UsageError`` line (a config's: that config's error), its success a line.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gsm8k.core.plan import Endpoint
from pytest_gsm8k.core.scrub import printable, shown_url
from pytest_gsm8k.core.settings import DEFAULT_BASE_URL, url_problem, with_v1
from pytest_gsm8k.session import Gsm8kSession as State

if TYPE_CHECKING:
    from pytest_gsm8k.runtime.engine import Engine
    from pytest_gsm8k.runtime.matrix import Matrix
    from pytest_gsm8k.runtime.serve import Launch, ServedProcess, Started

#: the longest the session-start ``GET /models`` may take (``--gsm8k-timeout`` when
#: shorter): a server that cannot send a small listing in this time is not one a run can use
PREFLIGHT_TIMEOUT = 10.0

#: --gsm8k-config without --gsm8k-serve: how vLLM's test starts a config's server
#: (RemoteOpenAIServer: ``vllm serve <model> <args>`` on a free port), on loopback here
VLLM_SERVE = "vllm serve {model} {server_args} --host 127.0.0.1 --port {port}"

_REFUSALS = {  # the preflight's, by the kind of GET /models failure
    "auth": "{shown} rejected the API key (HTTP 401); set it in ${env}",
    "forbidden": "{shown} refused access (HTTP 403)",
    "timeout": "{shown} did not answer GET /models within {timeout:g} s (see --gsm8k-timeout)",
    "unreachable": "cannot reach {shown}: {detail} (check --gsm8k-base-url)",
    "proxy": "{detail}",
}


def start_local(state: State) -> Started:
    """``--gsm8k-model=local[:PATH]``: serve the GGUF with llama.cpp (docs/local-model.md)."""
    from pytest_gsm8k.runtime import local

    settings = state.settings
    with _one_line(state):
        path = local.resolve_model(settings.model or "local")
        # room for a 5-shot prompt (~1,000 tokens) plus the answer
        n_ctx = settings.local_ctx or max(local.DEFAULT_N_CTX, 1536 + (settings.max_tokens or 0))
        spec = local.local_spec(
            path, alias=local.DEFAULT_ALIAS, n_ctx=n_ctx, threads=settings.local_threads
        )
        started = _launch(state, spec, "llama-server.log", about={"gguf": str(path)})
    return _serving(state, started, f"{_shown(state, path.name)} with llama.cpp")


def start_serve(state: State) -> Started:
    """``--gsm8k-serve CMD``, on the controller before xdist starts the workers (they get
    its URL and model through ``workerinput``)."""
    from pytest_gsm8k.runtime.serve import serve_spec

    command = state.settings.serve or ""  # holds {port}: core/settings.py refuses it without
    shown = state.scrubber().command(command)
    with _one_line(state):
        spec = serve_spec(command, state.settings.model)
        check = "" if state.settings.model else "adopt"
        started = _launch(state, spec, "serve.log", check=check, about={"command": shown})
    return _serving(state, started, f"{_shown(state, started.server.model)} with {shown!r}")


def start_matrix(state: State) -> Matrix:
    """--gsm8k-config: the configs' servers, started in sequence once the items are known
    (:meth:`Matrix.begin`), each stopped before the next one starts."""
    from pytest_gsm8k.runtime.matrix import Matrix

    return Matrix(
        [g.name for g in state.plan.groups],
        lambda name: _launch_config(state, name),
        say=lambda line: _write_line(state, printable(line)),
        lookahead=state.concurrency() if state.settings.early_stop else None,
    )


def _launch_config(state: State, name: str) -> tuple[ServedProcess, Engine]:
    """One config's server (docs/serving.md, "vLLM's configs") and the engine that asks it;
    a failure is one scrubbed ``ServeError`` line, the matrix's error for that config."""
    from pytest_gsm8k.runtime.serve import ServeError, serve_spec

    config = state.plan.group_by_name[name].config
    command = state.settings.serve or VLLM_SERVE
    shown = state.scrubber().command(command)
    with _one_line(state, ServeError):
        args = config.serve_args()
        env = {**os.environ, **config.serve_env()}
        where = f"config {config.source}"
        spec = serve_spec(command, config.model_name, server_args=args, env=env, context=where)
        about = {"command": shown, "argv_args": state.scrubber().words(args)}
        wait = config.startup_max_wait_seconds
        started = _launch(state, spec, f"serve-{name}.log", wait, check="listed", about=about)
        try:
            engine = state.sources.config_engine(name, config, started, shown)
        except ValueError as exc:  # a proxy the client cannot use (runtime/wire.py)
            started.server.stop(timeout=2.0)
            raise ServeError(str(exc)) from None
    _serving(state, started, _shown(state, config.model_name), head=f"config {name}: ")
    return started.server, engine


@contextlib.contextmanager
def _one_line(state: State, error: Callable[[str], Exception] | None = None) -> Iterator[None]:
    """A launch's failure as one scrubbed line: a ``UsageError``, or ``error(line)``."""
    from pytest_gsm8k.runtime.serve import ServeError

    try:
        yield
    except ServeError as exc:
        line = state.scrubber().command(str(exc))
        raise (error(line) if error else pytest.UsageError(f"gsm8k: {line}")) from None


def _launch(
    state: State, spec: Launch[Any], log_name: str, timeout: float | None = None, **how: Any
) -> Started:
    from pytest_gsm8k.runtime.serve import launch

    # a file that stays after the run, so that the path an error line names can be read
    log: Path | None = None
    with contextlib.suppress(OSError, AttributeError):  # pytest's cache folder, else temp
        log = Path(state.config.cache.mkdir("gsm8k")) / log_name
    if log is None:
        handle, path = tempfile.mkstemp(prefix=f"gsm8k-{Path(log_name).stem}-", suffix=".log")
        os.close(handle)
        log = Path(path)
    waiting = (
        "gsm8k: waiting for the model server to answer GET /v1/models ({:.0f} s so far; log {})"
    )
    return launch(
        spec,
        log_path=log,
        startup_timeout=state.settings.serve_timeout if timeout is None else timeout,
        scrub=state.scrubber(),
        api_key=state.settings.api_key(),
        list_timeout=min(state.settings.timeout, PREFLIGHT_TIMEOUT),
        progress=lambda waited: _write_line(state, waiting.format(waited, log)),
        **how,
    )


def _serving(state: State, started: Started, what: str, head: str = "") -> Started:
    """The server is the run's: named on the terminal (and, but for a config's, watched)."""
    server = started.server
    if not head:
        server.watch(state.sources.server_died)
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
    """A line of its own, also while the test loop writes its letters: under xdist pytest
    writes them without marking the line as taken (``currentfspath``), so ``write_line``
    would splice the line into the dots (``..gsm8k: config B: serving ...``)."""
    reporter = state.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return
    if state.run.records and not reporter.currentfspath:
        reporter.write("\n")  # letters (or the progress line) are on the current line
    reporter.write_line(line)


def preflight(state: State, endpoint: Endpoint) -> Endpoint:
    """One cheap call at session start: unreachable, bad key, unknown model, or a model that
    would not answer the preset's requests (they name none: an adapter's run would grade
    its base) is one line. Returns ``endpoint`` with what the server says about the model:
    cached answers are reused only while it says the same."""
    from pytest_gsm8k.core.identity import describe_server, unnamed_answerer, unnamed_refusal
    from pytest_gsm8k.core.presets import sends_model
    from pytest_gsm8k.runtime.client import PreflightError, list_models

    url, key, model = endpoint.base_url, state.settings.api_key(), endpoint.model or ""
    if url and (problem := url_problem(url)):
        source = "--gsm8k-base-url" if state.settings.base_url else "$OPENAI_BASE_URL"
        raise pytest.UsageError(f"gsm8k: {source}: {problem}")  # the URL may hold a secret
    shown = shown_url(url or DEFAULT_BASE_URL)
    cards: list[dict[str, Any]] = []
    timeout = min(state.settings.timeout, PREFLIGHT_TIMEOUT)
    try:
        models = list_models(url, key, timeout=timeout, cards=cards)
    except PreflightError as exc:
        if exc.kind in _REFUSALS:
            line = _REFUSALS[exc.kind].format(
                shown=shown, env=state.settings.api_key_env, timeout=timeout, detail=exc.detail
            )
            raise pytest.UsageError(f"gsm8k: {line}") from None
        # a 404: when the same server answers under /v1, that is the URL to give
        if exc.status == 404 and (suggested := with_v1(url or DEFAULT_BASE_URL)):
            with contextlib.suppress(PreflightError):
                list_models(suggested, key, timeout=timeout)
                raise pytest.UsageError(
                    f"gsm8k: GET {shown.rstrip('/')}/models answered 404 and "
                    f"{suggested}/models answers: the base URL needs /v1 "
                    f"(--gsm8k-base-url={suggested})"
                ) from None
        return endpoint  # some servers have no /models; the first request will tell
    if models and endpoint.model not in models:
        listing = ", ".join(_shown(state, m) for m in models[:10])
        raise pytest.UsageError(
            f"gsm8k: model {endpoint.model!r} is not served by {shown} "
            f"(it serves: {listing}{', ...' if len(models) > 10 else ''})"
        )
    why = None if sends_model(state.settings.preset) else unnamed_answerer(cards, model)
    if why is not None:
        line = unnamed_refusal(model, why)
        raise pytest.UsageError(f"gsm8k: --gsm8k-model {_shown(state, line)}")
    return Endpoint(endpoint.base_url, endpoint.model, describe_server(cards, model))
