"""Session steps the plugin's hooks call: the local server, the preflight check, the
start of fetching (here, or on the xdist controller for every worker), the release
gates. pytest types only; no hook definitions here.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gsm8k import fixtures
from pytest_gsm8k.core.dataset import DatasetError
from pytest_gsm8k.core.scrub import printable
from pytest_gsm8k.runtime.client import DEFAULT_BASE_URL
from pytest_gsm8k.state import State, safe_url

if TYPE_CHECKING:
    from pytest_gsm8k.core.early_stop import EarlyStop

#: the longest the session-start ``GET /models`` may take in all (``--gsm8k-timeout`` when
#: shorter): a listing is small, and a server that cannot send it in this time is not one a
#: run can use
PREFLIGHT_TIMEOUT = 10.0

#: how long an xdist worker waits for one answer from the controller beyond the engine's
#: own bounds (the controller's engine ends every request by then; this ends only a wait
#: that nothing else would)
REMOTE_WAIT_SLACK = 120.0


def release_gates(state: State, session: pytest.Session) -> None:
    """Baseline write/compare and the GitHub step summary, once, on the controller."""
    from pytest_gsm8k import gates

    config = session.config
    summary = state.summary
    assert summary is not None
    dirname = str(getattr(config.option, "snapshot_dirname", None) or "__snapshots__")
    path = gates.baseline_path(state.settings, config.rootpath, summary.label, dirname)
    try:
        shown = str(path.resolve().relative_to(config.rootpath.resolve()))
    except ValueError:
        shown = str(path)
    update = bool(getattr(config.option, "update_snapshots", False))
    state.baseline_file = path
    if update and state.early_stopped is not None:
        summary.add_gate(
            "baseline",
            False,
            f"not written to {shown}: the run stopped early "
            "(--gsm8k-early-stop); a baseline is always a complete run",
        )
    else:
        gates.apply_baseline(summary, state.settings, path, update, shown)
        _early_baseline_verdict(state)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        questions = {p.id: p.question for p in state.split().problems}
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(gates.markdown(summary, questions, html=state.settings.html))


def early_stop_for(state: State, session: pytest.Session) -> EarlyStop | None:
    """The run's :class:`EarlyStop` (``--gsm8k-early-stop``), or None with nothing to decide.

    Its problems are those this run set out to do (after deselection); its
    baseline gate uses the stored baseline when one exists that this run may be
    compared with (any refusal is reported by the normal baseline gate at the end).
    """
    from pytest_gsm8k.core import baseline as bl
    from pytest_gsm8k.core.early_stop import EarlyStop

    settings = state.settings
    assert settings.early_stop in ("certain", "sequential")
    wanted = state.planned_ids
    ids = [p.id for p in state.selected() if wanted is None or p.id in wanted]
    protocol = state.protocol()
    config = session.config
    dirname = str(getattr(config.option, "snapshot_dirname", None) or "__snapshots__")
    path = gates_path(state, config, dirname)
    outcomes: dict[str, int] | None = None
    if path.is_file() and not getattr(config.option, "update_snapshots", False):
        try:
            stored = bl.loads(path.read_text(encoding="utf-8"), str(path))
        except (OSError, UnicodeDecodeError, bl.BaselineError):
            stored = None
        here = {
            "protocol": {**protocol.identity(), "label": protocol.label},
            "dataset": state.split().identity(),
        }
        if stored is not None and bl.first_difference(stored, here) is None:
            outcomes = {}
            for pid, value in stored["problems"].items():
                outcome = value.get("outcome") if isinstance(value, dict) else value
                outcomes[str(pid)] = int(outcome == "correct")
            if not set(outcomes) & set(ids):
                outcomes = None
    if settings.min_acc is None and outcomes is None:
        return None
    return EarlyStop(
        ids,
        mode=settings.early_stop,  # type: ignore[arg-type]
        seed=settings.seed,
        alpha=settings.early_stop_alpha,
        min_acc=settings.min_acc,
        baseline=outcomes,
        max_drop=settings.max_drop,
        mcnemar_alpha=settings.alpha,
    )


def gates_path(state: State, config: pytest.Config, dirname: str) -> Path:
    from pytest_gsm8k import gates

    return gates.baseline_path(state.settings, config.rootpath, state.protocol().label, dirname)


def _early_baseline_verdict(state: State) -> None:
    """After an early stop the baseline gate's verdict is the early decision's, not the one
    the partial run's drop would give (a gate another gate's FAIL made moot is not a FAIL)."""
    early, summary = state.early, state.summary
    if early is None or early.decision is None or state.early_stopped is None or not summary:
        return
    verdict = early.decision.verdicts.get("baseline")
    for gate in summary.gates:
        if gate.name == "baseline":
            if verdict is None:
                gate.passed = True
                gate.detail = "undecided: the run stopped early on another gate's FAIL"
            else:
                gate.passed = verdict == "PASS"
                gate.detail = early.headline()


def write_html(state: State, report: dict[str, Any]) -> None:
    """The run's page (``--gsm8k-html``), atomically; the baseline's outcomes beside ours."""
    from pytest_gsm8k.core import baseline as bl
    from pytest_gsm8k.core.html_report import outcomes_from_baseline, problem_texts, render_html
    from pytest_gsm8k.runtime.files import write_atomic

    assert state.settings.html is not None
    outcomes = None
    path = state.baseline_file
    if path is not None and path.is_file():
        with contextlib.suppress(OSError, UnicodeDecodeError, bl.BaselineError):
            outcomes = outcomes_from_baseline(bl.loads(path.read_text(encoding="utf-8"), str(path)))
    page = render_html(report, problem_texts(state.split().problems), outcomes)
    write_atomic(state.settings.html, page)


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
    if not state.planned or not state.model_name or idle or broken:
        return
    if overrides_present(session):
        return  # each model's engine starts at its first fixture setup
    workerinput = state.workerinput
    if workerinput is not None:
        address = workerinput.get("gsm8k_answers")
        if address is None:
            return
        from pytest_gsm8k.runtime.answers import RemoteAnswers

        client = state.default_client()
        wait = state.settings.timeout * (state.settings.max_retries + 1) + REMOTE_WAIT_SLACK
        try:
            state.remote = RemoteAnswers(
                (str(address[0]), int(address[1])),
                str(workerinput["gsm8k_answers_token"]),
                endpoint=client.endpoint,
                model=client.model,
                wait=wait,
            )
            state.remote.offer([p.id for p in state.planned])
        except OSError as exc:
            raise pytest.UsageError(
                f"gsm8k: cannot reach the xdist controller's answers ({exc})"
            ) from None
        return
    state.engine_for(state.default_client())


def warm_engine(state: State) -> None:
    """One process: start the engine for the plugin's own client now, and import and build
    the HTTP client on its thread while pytest collects (about 0.3 s of openai imports
    that would otherwise sit between the end of collection and the first request). The
    plan follows at the end of collection (:func:`start_early`)."""
    client = state.default_client()
    engine = state.engine_for(client, plan=False)
    engine.loop.call_soon_threadsafe(client.warm)


def start_controller(state: State) -> None:
    """xdist controller: one engine for the plugin's own client, served to the workers.

    The engine starts importing the HTTP client now, while xdist starts the
    workers; it sends nothing until a worker offers its plan (a run whose
    tests all override the model never asks).
    """
    from pytest_gsm8k.runtime.answers import AnswerServer

    client = state.default_client()
    engine = state.engine_for(client, plan=False)
    engine.loop.call_soon_threadsafe(client.warm)
    state.answer_server = AnswerServer(engine, state.request_for)
    state.answer_server.start()


def start_local(state: State) -> None:
    from pytest_gsm8k.runtime import local

    try:
        path = local.resolve_model(state.settings.model or "local")
        log = state.run_dir / "llama-server.log"
        # room for a 5-shot prompt (~1,000 tokens) plus the answer
        n_ctx = state.settings.local_ctx or max(
            local.DEFAULT_N_CTX, 1536 + (state.settings.max_tokens or 0)
        )
        server = local.start_local_server(
            path,
            alias=local.DEFAULT_ALIAS,
            log_path=log,
            n_ctx=n_ctx,
            threads=state.settings.local_threads,
            startup_timeout=state.settings.serve_timeout,
            progress=_progress_line(state, log),
        )
    except local.LocalServerError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    state.local_server = server
    try:
        server.probe()
    except local.LocalServerError as exc:
        server.stop(timeout=2.0)
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    server.watch(state.server_died)
    state.local_info = {
        "pid": server.pid,
        "gguf": str(path),
        "base_url": server.base_url,
        "model": server.model,
        "startup_seconds": round(server.startup_seconds, 2),
    }
    _write_line(
        state,
        f"gsm8k: serving {_shown(state, path.name)} with llama.cpp at "
        f"{_shown(state, server.base_url)} "
        f"(pid {server.pid}, ready in {server.startup_seconds:.1f} s)",
    )
    state.base_url = server.base_url
    state.model_name = server.model


def _shown(state: State, text: str) -> str:
    """Text a server sent (a model id), fit for the terminal: no secret, no escapes."""
    return printable(state.scrubber().text(text))


def _listing(state: State, models: list[str]) -> str:
    """Up to ten model ids a server listed, fit for the terminal (secrets and escapes out)."""
    shown = ", ".join(_shown(state, m) for m in models[:10])
    return shown + (", ..." if len(models) > 10 else "")


def _write_line(state: State, line: str) -> None:
    reporter = state.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)


def _progress_line(state: State, log: Path) -> Callable[[float], None]:
    def progress(waited: float) -> None:
        _write_line(
            state,
            f"gsm8k: waiting for the model server to answer GET /v1/models "
            f"({waited:.0f} s so far; log {log})",
        )

    return progress


def start_serve(state: State) -> None:
    """``--gsm8k-serve CMD``: start the run's server, wait for it, take its model if not given.

    Started on the controller before xdist starts the workers, which get its URL and
    model through ``workerinput``; stopped by ``State.close`` (and atexit, and the
    kernel when pytest dies).
    """
    from pytest_gsm8k.runtime import serve
    from pytest_gsm8k.runtime.client import PreflightError, list_models

    settings = state.settings
    command = settings.serve or ""
    scrub = state.scrubber()
    log = state.run_dir / "serve.log"
    if "{port}" not in command:
        raise pytest.UsageError(
            "gsm8k: --gsm8k-serve: the command line has no {port}: the server must listen on "
            "the port the plugin picks (e.g. --port {port})"
        )
    try:
        server = serve.start_served(
            command,
            model=settings.model,
            log_path=log,
            startup_timeout=settings.serve_timeout,
            progress=_progress_line(state, log),
        )
    except serve.ServeError as exc:
        raise pytest.UsageError(f"gsm8k: {scrub.command(str(exc))}") from None
    state.local_server = server
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
        server.model = models[0]
    server.watch(state.server_died)
    shown = scrub.command(command)
    state.local_info = {
        "pid": server.pid,
        "command": shown,
        "base_url": server.base_url,
        "model": server.model,
        "startup_seconds": round(server.startup_seconds, 2),
    }
    _write_line(
        state,
        f"gsm8k: serving {_shown(state, server.model)} with {shown!r} at {server.base_url} "
        f"(pid {server.pid}, ready in {server.startup_seconds:.1f} s)",
    )
    state.base_url = server.base_url
    state.model_name = server.model


def model_overridden(config: pytest.Config) -> bool:
    """Whether a conftest or plugin loaded so far (session start: before collection)
    defines its own ``gsm8k_model`` fixture.

    Then the endpoint of the options may not be what is asked at all, and the
    session-start check would refuse a run that needs no endpoint.
    """
    return plugins_define(config, ("gsm8k_model",))


def _preflight_timeout(state: State) -> float:
    return min(state.settings.timeout, PREFLIGHT_TIMEOUT)


def preflight(state: State) -> None:
    """One cheap call at session start: unreachable, bad key or unknown model is one line."""
    from pytest_gsm8k.runtime.client import PreflightError, list_models

    url = state.base_url
    shown = safe_url(url or DEFAULT_BASE_URL)
    timeout = _preflight_timeout(state)
    try:
        models = list_models(url, state.settings.api_key(), timeout=timeout)
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
        return  # some servers have no /models; the first request will tell
    if models and state.model_name not in models:
        raise pytest.UsageError(
            f"gsm8k: model {state.model_name!r} is not served by {shown} "
            f"(it serves: {_listing(state, models)})"
        )


def check_data(state: State) -> None:
    """Load the split and the protocol now: a bad file or option is one usage-error line."""
    try:
        state.selected()
        state.protocol()
    except DatasetError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    limit, size = state.settings.limit, len(state.split().problems)
    if limit is not None and limit > size:
        state.config.issue_config_time_warning(
            pytest.PytestWarning(
                f"gsm8k: --gsm8k-limit {limit} is above the {size} problems of the split: "
                f"all {size} run"
            ),
            stacklevel=2,
        )
