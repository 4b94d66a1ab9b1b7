"""Session steps the plugin's hooks call: the local server, the preflight check, the
start of fetching (here, or on the xdist controller for every worker), the release
gates. pytest types only; no hook definitions here.
"""

from __future__ import annotations

import os

import pytest

from pytest_gsm8k import fixtures
from pytest_gsm8k.core.dataset import DatasetError
from pytest_gsm8k.runtime.client import DEFAULT_BASE_URL
from pytest_gsm8k.state import State, safe_url

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
    gates.apply_baseline(summary, state.settings, path, update, shown)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        questions = {p.id: p.question for p in state.split().problems}
        with open(step_summary, "a", encoding="utf-8") as handle:
            handle.write(gates.markdown(summary, questions))


def overrides_present(session: pytest.Session) -> bool:
    """Whether any test of this run may get ``gsm8k_model`` or ``gsm8k_protocol`` from a
    fixture other than the plugin's: a conftest or plugin that defines one, or a test
    module or class that does. Public pytest API only (plugins, item.module, item.cls)."""
    names = ("gsm8k_model", "gsm8k_protocol")
    ours = {id(fixtures.gsm8k_model), id(fixtures.gsm8k_protocol)}

    def defines(obj: object) -> bool:
        return any(
            id(getattr(obj, n, None)) not in ours and getattr(obj, n, None) is not None
            for n in names
        )

    if any(
        defines(plugin)
        for plugin in session.config.pluginmanager.get_plugins()
        if plugin is not None and not getattr(plugin, "__name__", "").startswith("pytest_gsm8k")
    ):
        return True
    for item in session.items:
        for holder in (getattr(item, "module", None), getattr(item, "cls", None)):
            if holder is not None and defines(holder):
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
            local.DEFAULT_N_CTX, 1536 + state.settings.max_tokens
        )
        server = local.start_local_server(
            path,
            alias=local.DEFAULT_ALIAS,
            log_path=log,
            n_ctx=n_ctx,
            threads=state.settings.local_threads,
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
    reporter = state.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"gsm8k: serving {path.name} with llama.cpp at {server.base_url} "
            f"(pid {server.pid}, ready in {server.startup_seconds:.1f} s)"
        )
    state.base_url = server.base_url
    state.model_name = server.model


def model_overridden(config: pytest.Config) -> bool:
    """Whether a conftest loaded so far defines its own ``gsm8k_model`` fixture.

    Then the endpoint of the options may not be what is asked at all, and the
    session-start check would refuse a run that needs no endpoint.
    """
    for plugin in config.pluginmanager.get_plugins():
        path = str(getattr(plugin, "__file__", "") or "")
        if path.endswith("conftest.py") and getattr(plugin, "gsm8k_model", None) is not None:
            return True
    return False


def preflight(state: State) -> None:
    """One cheap call at session start: unreachable, bad key or unknown model is one line."""
    from pytest_gsm8k.runtime.client import PreflightError, list_models

    url = state.base_url
    shown = safe_url(url or DEFAULT_BASE_URL)
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
