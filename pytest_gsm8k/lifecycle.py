"""Session steps the plugin's hooks call on the controller: local server, preflight,
early start of the fetcher, release gates. pytest types only; no hook definitions here.
"""

from __future__ import annotations

import contextlib
import os

import pytest

from pytest_gsm8k import fixtures
from pytest_gsm8k.state import State, _safe_url


def _release_gates(state: State, session: pytest.Session) -> None:
    """Baseline write/compare and the GitHub step summary, once, on the controller."""
    from pytest_gsm8k import gates

    config = session.config
    summary = state.summary
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


def _start_early(state: State, session: pytest.Session) -> None:
    """Start fetching now, not at the first test.

    When every planned item uses the plugin's own ``gsm8k_model`` and
    ``gsm8k_protocol`` (nothing overrides them), the engine can start as
    soon as the items are known. An xdist worker first offers its plan to
    the controller's fetcher (see ``_lead``) and, when it takes it, only
    follows (it never imports openai); otherwise it fetches for itself.
    A worker with no plan for the fetcher offers an empty one, which frees
    the workers the controller holds back until the fetcher is ready.
    """
    config = session.config
    idle = config.option.collectonly or getattr(config.option, "setupplan", False)
    broken = session.testsfailed and not getattr(
        config.option, "continue_on_collection_errors", False)
    default = bool(state.model_name) and all(
        _uses_default_fixtures(item) for item in session.items
        if "gsm8k_problem" in getattr(item, "fixturenames", ()))
    planned = bool(state.planned) and default and not (idle or broken)
    if state.is_worker and state.model_name:
        from pytest_gsm8k.lead import offer_plan

        with contextlib.suppress(Exception):  # the fixtures report it at the first test
            client = state.default_client()
            if planned:
                requests = [state.protocol().request(p) for p in state.planned]
                state.follow = offer_plan(state.run_dir, client, requests)
            else:  # frees the held-back workers; nothing here to follow
                offer_plan(state.run_dir, client, [], wait=0.0)
    if not planned:
        return
    with contextlib.suppress(Exception):  # the fixtures report it at the first test
        if state.follow is None:
            # Import the HTTP client now, before the test loop (nothing can be answered
            # earlier anyway), so its modules are old when the loop starts (gc.freeze).
            state.default_client().warm()
        state.engine_for(state.default_client(), state.protocol())


def _lead(state: State) -> None:
    """xdist controller: start the run's one fetcher, for the plan the first worker offers.

    It runs in a process of its own (see lead.Lead) with the whole
    ``--gsm8k-concurrency``, importing the HTTP client while the workers
    start; workers that get no answer (or another plan) fetch for
    themselves, sharing the work by claims.
    """
    from pytest_gsm8k.lead import Lead

    client = state.default_client()
    cache = state.cache(True)
    state.lead = Lead(state.run_dir, {
        "run_dir": str(state.run_dir),
        "endpoint": client.endpoint,
        "model": client.model,
        "api_key_env": state.settings.api_key_env,  # the key itself stays in the environment
        "timeout": state.settings.timeout,
        "max_retries": state.settings.max_retries,
        "concurrency": state.settings.concurrency,
        "cache_root": str(cache.root),
        "persistent": cache.persistent,
        "run_id": state.run_id,
    })
    state.lead.start()


def _uses_default_fixtures(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = getattr(info, "name2fixturedefs", None) or {}
    for name in ("gsm8k_model", "gsm8k_protocol"):
        chain = defs.get(name)
        if not chain or getattr(chain[-1].func, "__module__", None) != fixtures.__name__:
            return False
    return True


def _start_local(state: State) -> None:
    from pytest_gsm8k.runtime import local

    try:
        path = local.resolve_model(state.settings.model or "local")
        log = state.run_dir / "llama-server.log"
        # room for a 5-shot prompt (~1,000 tokens) plus the answer
        n_ctx = state.settings.local_ctx or max(local.DEFAULT_N_CTX,
                                                1536 + state.settings.max_tokens)
        server = local.start_local_server(path, alias=local.DEFAULT_ALIAS, log_path=log,
                                          n_ctx=n_ctx, threads=state.settings.local_threads)
    except local.LocalServerError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    state.local_server = server
    try:
        server.probe()
    except local.LocalServerError as exc:
        server.stop(timeout=2.0)
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    server.watch(state.server_died)
    state.local_info = {"pid": server.pid, "gguf": str(path), "base_url": server.base_url,
                        "model": server.model, "startup_seconds": round(server.startup_seconds, 2)}
    reporter = state.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"gsm8k: serving {path.name} with llama.cpp at {server.base_url} "
                            f"(pid {server.pid}, ready in {server.startup_seconds:.1f} s)")
    state.base_url = server.base_url
    state.model_name = server.model


def _model_overridden(config: pytest.Config) -> bool:
    """Whether a conftest loaded so far defines its own ``gsm8k_model`` fixture.

    Then the endpoint of the options may not be what is asked at all, and the
    session-start check would refuse a run that needs no endpoint.
    """
    for plugin in config.pluginmanager.get_plugins():
        path = str(getattr(plugin, "__file__", "") or "")
        if path.endswith("conftest.py") and getattr(plugin, "gsm8k_model", None) is not None:
            return True
    return False


def _preflight(state: State) -> None:
    """One cheap call at session start: unreachable, bad key or unknown model is one line."""
    from pytest_gsm8k.runtime.client import PreflightError, list_models

    url = state.base_url
    shown = _safe_url(url or "https://api.openai.com/v1")
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


# -- pytest hooks -----------------------------------------------------------------
