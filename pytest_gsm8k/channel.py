"""The start of a run before any request, and of fetching: the controller's one engine served
to every xdist worker (with a head start when nothing can change the plan), a worker's offer
of its plan, and a plain run's own engine.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import pytest

from pytest_gsm8k.fixtures import overrides_present, plugins_define
from pytest_gsm8k.session import Gsm8kSession
from pytest_gsm8k.sources import CONFIG_OVERRIDE

if TYPE_CHECKING:
    from pytest_gsm8k.runtime.answers import AnswerServer

#: how long a worker waits for one answer beyond the controller's engine's own bounds (which
#: end every request by then; this ends only a wait that nothing else would)
REMOTE_WAIT_SLACK = 120.0
#: the controller's head start: this many rounds of the engine's concurrency (about the
#: workers' start-up at a fast endpoint's latency), at most HEAD_START_MAX requests
HEAD_START_ROUNDS = 4
HEAD_START_MAX = 256
#: options after which the workers may collect other items than the plan's
FILTERS = ("deselect", "lf", "stepwise", "stepwise_skip", "collectonly", "setupplan", "setuponly")


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
    return not filtered and not plugins_define(config)


def fetch(state: Gsm8kSession, session: pytest.Session) -> None:
    """At the end of collection: the configs' servers begin on the collected problems, or
    the plugin's own client's engine fetches them (an override's engine starts at its first
    fixture setup); an xdist worker offers its plan to the controller instead. Not in a
    dry or broken run, nor with nothing collected (bad data: no plan can be built)."""
    option = session.config.option
    broken = session.testsfailed and not getattr(option, "continue_on_collection_errors", False)
    if not state.run.collected or state.dry or broken:
        return
    if not (state.settings.vllm_config or state.plan.endpoint.model):
        return
    if state.is_worker:
        return _connect(state, session)
    sources, plan, repeats = state.sources, state.plan, state.settings.repeats
    if sources.matrix is not None:
        problems = state.run.collected or ()
        sources.matrix.begin(
            [r for p in problems for r in plan.protocol_of(p).request(p).asks(repeats)]
        )
    elif not overrides_present(session):
        sources.engine_for(sources.default_client())


def _connect(state: Gsm8kSession, session: pytest.Session) -> None:
    """xdist worker: its plan offered to the controller and, without an override, the
    controller's answers used."""
    from pytest_gsm8k.runtime.answers import Channel, RemoteAnswers

    if (address := state.workerinput.get("gsm8k_answers")) is None:
        return
    where, token = (str(address[0]), int(address[1])), str(state.workerinput["gsm8k_answers_token"])
    try:
        if overrides_present(session):
            channel = Channel(where, token)
        else:
            client, settings = state.sources.default_client(), state.settings
            wait = settings.timeout * (settings.max_retries + 1) + REMOTE_WAIT_SLACK
            channel = RemoteAnswers(
                where, token, endpoint=client.endpoint, model=client.model, wait=wait
            )
        channel.offer([p.id for p in state.run.collected or ()])
    except OSError as exc:
        raise pytest.UsageError(
            f"gsm8k: cannot reach the xdist controller's answers ({exc})"
        ) from None
    state.sources.use_channel(channel)


def _start_controller(state: Gsm8kSession, overridden: bool) -> AnswerServer:
    """xdist controller: one engine for the plugin's own client (or the configs' servers),
    served to the workers. It imports the HTTP client while xdist starts the workers and,
    when allowed, sends the first requests of the plan; the rest waits for a worker's offer."""
    from pytest_gsm8k.runtime.answers import AnswerServer

    sources, plan, repeats = state.sources, state.plan, state.settings.repeats
    if sources.matrix is not None:
        server = AnswerServer(sources.matrix, plan.request_for, repeats=repeats)
        server.start()
        return server
    client = sources.default_client()
    engine = sources.engine_for(client, plan=False)
    server = AnswerServer(engine, plan.request_for, repeats=repeats)
    # Listen before the import: warming runs on the loop's thread and, on a loaded machine,
    # importing openai there once held the listen step past its bound.
    server.start()
    engine.loop.call_soon_threadsafe(client.warm)
    if not overridden and head_start_allowed(state.config):
        limit = min(HEAD_START_ROUNDS * engine.concurrency, HEAD_START_MAX)
        server.head_start([p.id for p in plan.run_order], limit)
    return server


def start(state: Gsm8kSession, controller: bool) -> None:
    """The start of a run, before any request: the outputs checked; with a model, server or
    configs to ask, the data, protocol and baseline (a bad file is one line before any server
    starts), the servers and the endpoint's preflight, the plan set once; then the engine,
    served to the workers by an xdist ``controller``."""
    from pytest_gsm8k.core.dataset import DatasetError
    from pytest_gsm8k.core.settings import is_local_spec
    from pytest_gsm8k.serving import preflight, start_local, start_matrix, start_serve
    from pytest_gsm8k.writing import check_outputs

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
    overridden = plugins_define(config, ("gsm8k_model",))
    if draft.groups:  # each config's server starts in turn once the items are known
        if overridden:
            raise pytest.UsageError(CONFIG_OVERRIDE)
        state.set_plan(draft)
        state.sources.use_matrix(start_matrix(state))
    else:
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
    if controller:
        state.sources.use_answer_server(_start_controller(state, overridden))
    elif not overridden and state.sources.matrix is None and not state.dry:
        # the engine imports and builds the HTTP client on its thread while pytest collects
        # (openai's imports would otherwise sit between collection's end and the first request)
        client = state.sources.default_client()
        state.sources.engine_for(client, plan=False).loop.call_soon_threadsafe(client.warm)
