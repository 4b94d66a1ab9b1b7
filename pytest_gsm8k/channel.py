"""The start of fetching and the xdist answers channel: the controller's one engine served to
every worker (with a head start when nothing can change the plan), a worker's offer of its
plan, and a plain run's own engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_gsm8k.fixtures import overrides_present, plugins_define
from pytest_gsm8k.session import Gsm8kSession

if TYPE_CHECKING:
    from pytest_gsm8k.runtime.answers import AnswerServer, Channel

#: how long an xdist worker waits for one answer from the controller beyond the engine's
#: own bounds (the controller's engine ends every request by then; this ends only a wait
#: that nothing else would)
REMOTE_WAIT_SLACK = 120.0
#: xdist controller: the head start (:meth:`AnswerServer.head_start`) is this many rounds of
#: the engine's concurrency, about the workers' start-up at a fast endpoint's latency, and
#: never more than :data:`HEAD_START_MAX` requests
HEAD_START_ROUNDS = 4
HEAD_START_MAX = 256
#: options after which the workers may collect other items than the plan's
FILTERS = ("deselect", "lf", "stepwise", "stepwise_skip", "collectonly", "setupplan", "setuponly")


def head_start_allowed(config: pytest.Config) -> bool:
    """xdist controller: whether it may send requests of its own plan before a worker
    offers one: only while nothing visible at session start says the workers will collect
    other items or ask another model (no -k, no -m but ``gsm8k``, --deselect, --lf, stepwise,
    test ids, collect-only or setup plan, no conftest or plugin with its own ``gsm8k_model``
    or ``gsm8k_protocol``). What stays invisible costs at most the head start's requests."""
    option = config.option
    filtered = (
        getattr(option, "keyword", "")
        or (getattr(option, "markexpr", "") or "").strip() not in ("", "gsm8k")
        or any(getattr(option, name, None) for name in FILTERS)
        or any("::" in str(arg) for arg in config.args)
    )
    return not filtered and not plugins_define(config)


def fetches_now(state: Gsm8kSession, session: pytest.Session) -> bool:
    """Whether fetching starts at the end of collection: something was collected, the run
    is not a dry one or broken, and it has a model (or configs) to ask."""
    config = session.config
    idle = config.option.collectonly or getattr(config.option, "setupplan", False)
    broken = session.testsfailed and not getattr(
        config.option, "continue_on_collection_errors", False
    )
    if not state.run.collected or idle or broken:
        return False  # before the plan: with nothing collected (bad data) it cannot be built
    return bool(state.settings.vllm_config or state.plan.endpoint.model)


def fetch(state: Gsm8kSession, session: pytest.Session) -> None:
    """One process, at the end of collection: the configs' servers begin on the collected
    problems, or the plugin's own client's engine fetches them (an override's engine starts
    at its first fixture setup)."""
    sources = state.sources
    if sources.matrix is not None:
        asks = state.settings.repeats
        problems = state.run.collected or ()
        sources.matrix.begin(
            [r for p in problems for r in state.plan.protocol_of(p).request(p).asks(asks)]
        )
    elif not overrides_present(session):
        sources.engine_for(sources.default_client())


def connect(state: Gsm8kSession, remote: bool) -> Channel | None:
    """xdist worker: the channel to the controller, this worker's plan offered on it; with
    ``remote`` the controller's answers too (None when the controller serves none)."""
    from pytest_gsm8k.runtime.answers import Channel, RemoteAnswers

    given = state.workerinput or {}
    address = given.get("gsm8k_answers")
    if address is None:
        return None
    where, token = (str(address[0]), int(address[1])), str(given["gsm8k_answers_token"])
    try:
        if remote:
            client = state.sources.default_client()
            settings = state.settings
            wait = settings.timeout * (settings.max_retries + 1) + REMOTE_WAIT_SLACK
            channel: Channel = RemoteAnswers(
                where, token, endpoint=client.endpoint, model=client.model, wait=wait
            )
        else:
            channel = Channel(where, token)
        channel.offer([p.id for p in state.run.collected or ()])
    except OSError as exc:
        raise pytest.UsageError(
            f"gsm8k: cannot reach the xdist controller's answers ({exc})"
        ) from None
    return channel


def warm_engine(state: Gsm8kSession) -> None:
    """One process: start the engine for the plugin's own client now, and import and build
    the HTTP client on its thread while pytest collects (openai's imports would otherwise
    sit between the end of collection and the first request)."""
    sources = state.sources
    client = sources.default_client()
    engine = sources.engine_for(client, plan=False)
    engine.loop.call_soon_threadsafe(client.warm)


def start_controller(state: Gsm8kSession, head_start: bool = False) -> AnswerServer:
    """xdist controller: one engine for the plugin's own client (or the configs' servers),
    served to the workers. The engine imports the HTTP client while xdist starts the workers
    and, with ``head_start``, sends the first requests of the plan; the rest waits until a
    worker offers its plan."""
    from pytest_gsm8k.runtime.answers import AnswerServer

    sources = state.sources
    repeats = state.settings.repeats
    if sources.matrix is not None:
        server = AnswerServer(sources.matrix, state.plan.request_for, repeats=repeats)
        server.start()
        return server
    client = sources.default_client()
    engine = sources.engine_for(client, plan=False)
    server = AnswerServer(engine, state.plan.request_for, repeats=repeats)
    # Listen before the import: warming runs on the loop's thread and, on a loaded machine,
    # importing openai there once held the listen step past its bound.
    server.start()
    engine.loop.call_soon_threadsafe(client.warm)
    if head_start:
        limit = min(HEAD_START_ROUNDS * engine.concurrency, HEAD_START_MAX)
        server.head_start([p.id for p in state.plan.run_order], limit)
    return server


def start(state: Gsm8kSession, config: pytest.Config) -> bool | None:
    """The start of a run, before any request: the outputs checked; with a model, server or
    configs to ask, the data, protocol and baseline (a bad file is one line before any server
    starts), the servers and the endpoint's preflight; the plan published once. Returns
    whether a conftest or plugin overrides ``gsm8k_model`` (None: nothing to fetch)."""
    import dataclasses

    from pytest_gsm8k.core.dataset import DatasetError
    from pytest_gsm8k.core.settings import is_local_spec
    from pytest_gsm8k.serving import preflight, start_local, start_matrix, start_serve
    from pytest_gsm8k.writing import check_outputs

    settings = state.settings
    check_outputs(state, ("report", "html", "markdown"))  # asked for by name: any run
    if not (settings.model or settings.serve or settings.vllm_config):
        return None
    try:
        draft = state.build_plan(state.default_endpoint())
    except DatasetError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    limit, size = settings.limit, len(draft.split.problems)
    if limit is not None and limit > size:
        config.issue_config_time_warning(
            pytest.PytestWarning(
                f"gsm8k: --gsm8k-limit {limit} is above the {size} problems of the split: "
                f"all {size} run"
            ),
            stacklevel=2,
        )
    check_outputs(state, ("step_summary",), draft)  # and the baselines, the open-file limit
    overridden = plugins_define(config, ("gsm8k_model",))
    if draft.groups:  # each config's server starts in turn once the items are known
        if overridden:
            raise pytest.UsageError(
                "gsm8k: --gsm8k-config runs each config's own server: a gsm8k_model "
                "override cannot take part (remove it, or run without --gsm8k-config)"
            )
        state.set_plan(draft)
        state.sources.use_matrix(start_matrix(state))
        return False
    started = start_serve(state) if settings.serve else None
    if started is None and is_local_spec(settings.model):
        started = start_local(state)
    endpoint = draft.endpoint
    if started is not None:
        state.sources.use_server(started.server, started.info)
        endpoint = started.endpoint
    if not overridden:  # the endpoint the options name may not be what is asked at all
        endpoint = preflight(state, endpoint)
    state.set_plan(dataclasses.replace(draft, endpoint=endpoint))
    return overridden
