"""The xdist answers channel and the start of fetching: the controller's one engine served
to every worker (with a head start when nothing can change the plan), a worker's offer of
its plan, and a plain run's own engine started at the end of collection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_gsm8k.fixtures import overrides_present, plugins_define
from pytest_gsm8k.state import State

if TYPE_CHECKING:
    from pytest_gsm8k.runtime.answers import AnswerServer, Channel, RemoteAnswers

#: how long an xdist worker waits for one answer from the controller beyond the engine's
#: own bounds (the controller's engine ends every request by then; this ends only a wait
#: that nothing else would)
REMOTE_WAIT_SLACK = 120.0


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
