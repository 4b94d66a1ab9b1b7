"""The fixtures users request and override: gsm8k_problem, gsm8k_model, gsm8k_protocol,
gsm8k_outcome. The plugin module re-exports them so pytest registers them.

pytest imports this module in every session (the fixtures are registered whether or not a
test asks for them): what a fixture needs is imported when it runs.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_gsm8k.core.prompts import Protocol
    from pytest_gsm8k.core.records import Outcome, ProblemRecord
    from pytest_gsm8k.core.types import Problem

# -- fixtures -------------------------------------------------------------------


class GSM8KOutcome:
    """What a test gets from ``gsm8k_outcome``: the scored answer to its problem."""

    def __init__(self, record: ProblemRecord) -> None:
        self.record = record

    @property
    def outcome(self) -> Outcome:
        return self.record["outcome"]

    @property
    def correct(self) -> bool:
        return self.record["correct"]

    @property
    def extracted(self) -> str | None:
        """The answer under the gating rule, as canonical number text (None: none found)."""
        return self.record["extracted"]

    @property
    def gold(self) -> str:
        return self.record["gold"]

    @property
    def response(self) -> str:
        """The first sample's text."""
        return self.record["response"]

    def __repr__(self) -> str:
        return (
            f"GSM8KOutcome({self.record['id']}: {self.outcome}, extracted={self.extracted!r}, "
            f"gold={self.gold!r})"
        )


@pytest.fixture
def gsm8k_problem() -> Problem:
    """The GSM8K problem of this item (parametrized by the plugin over the selected split)."""
    raise pytest.UsageError("gsm8k_problem is parametrized by pytest-gsm8k; it was not here")


@pytest.fixture(scope="session")
def gsm8k_protocol(pytestconfig: pytest.Config) -> Protocol:
    """The evaluation protocol (test@1/pass@N/maj@N, shots, api, extractor ...)."""
    from pytest_gsm8k.core.dataset import DatasetError
    from pytest_gsm8k.state import get_state

    try:
        return get_state(pytestconfig).plan.protocol
    except DatasetError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None


@pytest.fixture(scope="session")
def gsm8k_model(pytestconfig: pytest.Config) -> Any:
    """The model: an OpenAI-compatible endpoint from the options.

    Override it in your conftest.py with any callable that takes a
    :class:`~pytest_gsm8k.Request` and returns a text or a list of texts
    (sync or async) to gate a model that has no HTTP endpoint.
    """
    from pytest_gsm8k.state import get_state

    return get_state(pytestconfig).sources.default_client()


@pytest.fixture
def gsm8k_outcome(
    request: pytest.FixtureRequest,
    gsm8k_problem: Problem,
    gsm8k_model: Any,
    gsm8k_protocol: Protocol,
) -> GSM8KOutcome:
    """The scored answer for this item's problem (fetched ahead by the engine)."""
    from pytest_gsm8k.core.outcome import error_record, score_repeats
    from pytest_gsm8k.core.scrub import shown_url
    from pytest_gsm8k.runtime.failures import EndpointAborted, EndpointError, NotRun, SaidElsewhere
    from pytest_gsm8k.state import RECORD_KEY, get_state

    state = get_state(request.config)
    sources = state.sources
    sources.heed_stop()
    source, single_use = sources.source_for(gsm8k_model, gsm8k_protocol)
    item = request.node
    failure: str | None = None
    not_run: str | None = None
    if gsm8k_problem.group:  # --gsm8k-config: the problem's config decides its protocol
        gsm8k_protocol = state.plan.protocol_of(gsm8k_problem)
    asks = gsm8k_protocol.request(gsm8k_problem).asks(state.settings.repeats)
    try:
        # --gsm8k-repeats K: K separate asks, one item (an error in any is the item's error)
        responses = [source.result(ask) for ask in asks]
    except NotRun as exc:
        not_run = str(exc)
    except EndpointError as exc:
        record = error_record(gsm8k_problem, str(exc))
        if isinstance(exc, EndpointAborted):
            record["aborted"] = True
            request.session.shouldfail = f"gsm8k: {exc}"
        item.stash[RECORD_KEY] = record
        item.user_properties.append(("gsm8k_outcome", "error"))
        if isinstance(exc, SaidElsewhere):
            not_run = str(exc)  # an error for the counts; another item said it in full
        else:
            failure = f"gsm8k: {exc}"
    finally:
        for message in source.take_warnings():
            warnings.warn(pytest.PytestWarning(message), stacklevel=1)
        if single_use:
            source.close()
    if not_run is not None:
        pytest.skip(f"gsm8k: not run: {not_run}")
    if failure is not None:
        # Outside the except block: inside it, pytest would print the EndpointError too
        # ("During handling of the above exception, another exception occurred").
        pytest.fail(failure, pytrace=False)
    record = score_repeats(gsm8k_problem, responses, gsm8k_protocol, state.plan.pattern)
    record["endpoint"] = shown_url(source.endpoint)
    record["model"] = record["model"] or source.model
    item.stash[RECORD_KEY] = record
    item.user_properties.extend(
        [
            ("gsm8k_outcome", record["outcome"]),
            ("gsm8k_extracted", record["extracted"]),
            ("gsm8k_gold", record["gold"]),
        ]
    )
    return GSM8KOutcome(record)


#: the plugin's own fixtures a user may replace (a conftest, plugin, test module or class)
OVERRIDABLE = ("gsm8k_model", "gsm8k_protocol")


def defines_fixture(holder: object, names: tuple[str, ...] = OVERRIDABLE) -> bool:
    """Whether ``holder`` (a conftest or plugin module, a test module or class) defines
    one of the fixtures ``names`` other than the plugin's own: a conftest that merely
    imports ``pytest_gsm8k.fixtures.gsm8k_model`` overrides nothing."""
    for name in names:
        value = getattr(holder, name, None)
        if value is not None and value is not globals().get(name):
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


def model_overridden(config: pytest.Config) -> bool:
    """Whether a conftest or plugin loaded so far (session start: before collection)
    defines its own ``gsm8k_model`` fixture.

    Then the endpoint of the options may not be what is asked at all, and the
    session-start check would refuse a run that needs no endpoint.
    """
    return plugins_define(config, ("gsm8k_model",))
