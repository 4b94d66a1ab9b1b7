"""The fixtures users request and override, and who gives ``gsm8k_model``: an override, or
the plugin's own, which needs a model (:func:`unmeasured`). pytest imports this module in
every session: what a fixture needs is imported when it runs."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_gsm8k.core.prompts import Protocol
    from pytest_gsm8k.core.records import Outcome, ProblemRecord
    from pytest_gsm8k.core.types import Problem

RECORD_KEY = pytest.StashKey["ProblemRecord"]()  # an item's record until its report (roles.py)
NO_MODEL = "gsm8k: no model given"  # how a run that needs a model and has none ends


class GSM8KOutcome:
    """What a test gets from ``gsm8k_outcome``: the scored answer to its problem.
    ``extracted`` is the answer under the gating rule as canonical number text (None: none
    found); ``response`` the first sample's text."""

    def __init__(self, record: ProblemRecord) -> None:
        self.record = record
        self.outcome: Outcome = record["outcome"]
        self.correct: bool = record["correct"]
        self.extracted: str | None = record["extracted"]
        self.gold: str = record["gold"]
        self.response: str = record["response"]

    def __repr__(self) -> str:
        extracted, gold = self.extracted, self.gold
        return f"GSM8KOutcome({self.record['id']}: {self.outcome}, {extracted=}, {gold=})"


@pytest.fixture
def gsm8k_problem() -> Problem:
    """The GSM8K problem of this item (parametrized by the plugin over the selected split)."""
    raise pytest.UsageError("gsm8k_problem is parametrized by pytest-gsm8k; it was not here")


@pytest.fixture(scope="session")
def gsm8k_protocol(pytestconfig: pytest.Config) -> Protocol:
    """The evaluation protocol (test@1/pass@N/maj@N, shots, api, extractor ...)."""
    from pytest_gsm8k.core.dataset import DatasetError
    from pytest_gsm8k.session import get_session

    try:
        return get_session(pytestconfig).plan.protocol
    except DatasetError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None


@pytest.fixture(scope="session")
def gsm8k_model(pytestconfig: pytest.Config) -> Any:
    """The model: an OpenAI-compatible endpoint from the options. Override it in your
    conftest.py with any callable that takes a :class:`~pytest_gsm8k.Request` and returns a
    text or a list of texts (sync or async) to gate a model that has no HTTP endpoint."""
    from pytest_gsm8k.session import get_session

    return get_session(pytestconfig).sources.default_client()


@pytest.fixture
def gsm8k_outcome(
    request: pytest.FixtureRequest,
    gsm8k_problem: Problem,
    gsm8k_model: Any,
    gsm8k_protocol: Protocol,
) -> GSM8KOutcome:
    """The scored answer for this item's problem (fetched ahead by the engine)."""
    from pytest_gsm8k.core.outcome import error_record
    from pytest_gsm8k.runtime.failures import EndpointAborted, EndpointError, NotRun, SaidElsewhere
    from pytest_gsm8k.session import get_session

    failed: NotRun | EndpointError | None = None
    item = request.node
    try:
        sources = get_session(request.config).sources
        record = sources.answer(gsm8k_model, gsm8k_protocol, gsm8k_problem)
    except (NotRun, EndpointError) as exc:
        failed, record = exc, error_record(gsm8k_problem, str(exc))
    if not isinstance(failed, NotRun):
        if isinstance(failed, EndpointAborted):
            record["aborted"] = True
            request.session.shouldfail = f"gsm8k: {failed}"
        item.stash[RECORD_KEY] = record
        item.user_properties.append(("gsm8k_outcome", record["outcome"]))
        if failed is None:
            item.user_properties.append(("gsm8k_extracted", record["extracted"]))
            item.user_properties.append(("gsm8k_gold", record["gold"]))
    if isinstance(failed, (NotRun, SaidElsewhere)):  # an error for the counts, said elsewhere
        pytest.skip(f"gsm8k: not run: {failed}")
    if failed is not None:  # out of the except block, where pytest would print it twice
        pytest.fail(f"gsm8k: {failed}", pytrace=False)
    return GSM8KOutcome(record)


def defines(
    where: pytest.Config | pytest.Item, names: tuple[str, ...] = ("gsm8k_model", "gsm8k_protocol")
) -> bool:
    """Whether a conftest or plugin registered so far (``where`` a config), or an item's
    module or class, defines one of ``names`` itself (a conftest may merely import ours)."""
    if isinstance(where, pytest.Item):
        holders = [getattr(where, "module", None), getattr(where, "cls", None)]
    else:
        plugins = where.pluginmanager.get_plugins()
        holders = [p for p in plugins if not getattr(p, "__name__", "").startswith("pytest_gsm8k")]
    return any(getattr(h, n, None) not in (None, globals().get(n)) for h in holders for n in names)


def problem_of(item: pytest.Item) -> Any:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("gsm8k_problem") if callspec is not None else None


def unmeasured(session: pytest.Session, items: list[pytest.Item], idle: bool) -> str | None:
    """Why a run given no model cannot do what it was asked, as one line (else 1,319 tests
    fail the same way, or a gate that gated nothing exits green); None when it can. An
    ``idle`` session (no GSM8K work so far) is left alone unless something asks for GSM8K."""
    config = session.config
    markexpr = getattr(config.option, "markexpr", "")
    wants_model = [item for item in items if "gsm8k_model" in getattr(item, "fixturenames", ())]
    if idle and not wants_model and not selects_gsm8k(markexpr):
        return None
    from pytest_gsm8k.core.scrub import clip
    from pytest_gsm8k.core.settings import OPTIONS
    from pytest_gsm8k.core.types import Problem
    from pytest_gsm8k.session import get_session

    state = get_session(config)
    if state.settings.asked or state.dry or session.testsfailed or state.run.data_error:
        return None  # --co and --setup-plan ask for no model
    usage = "pass --gsm8k-model=ID (with --gsm8k-base-url=URL, ending in /v1) or --gsm8k-serve CMD"
    needing = [
        item
        for item in wants_model
        if "gsm8k_model" not in getattr(getattr(item, "callspec", None), "params", {})
        and not defines(item, ("gsm8k_model",))
    ]
    if needing and not defines(config, ("gsm8k_model",)):
        more = f" and {len(needing) - 1} more" if len(needing) > 1 else ""
        return (
            f"{NO_MODEL}: {clip(state.scrubber().text(needing[0].nodeid))}{more} use the "
            f"gsm8k_model fixture; {usage}, or override gsm8k_model in a conftest.py"
        )
    if any(isinstance(problem_of(item), Problem) for item in items):
        return None
    if selects_gsm8k(markexpr):
        return (
            f"{NO_MODEL}: -m {markexpr!r} selects the GSM8K items, which exist only "
            f"with a model: {usage} (or gsm8k_model in the ini)"
        )
    if asked := [o.flag for o in OPTIONS if config.getoption(o.dest) is not None]:
        return (
            f"{NO_MODEL} and no test uses the gsm8k fixtures, so nothing was measured or gated "
            f"({', '.join(asked)} given): {usage}, or run a test that uses gsm8k_outcome"
        )
    return None


def selects_gsm8k(markexpr: str) -> bool:
    """Whether ``-m markexpr`` is true for an item with only the ``gsm8k`` marker and false for
    one without it, read as Python's ``and``/``or``/``not`` over marker names (pytest's
    grammar); an expression with anything else (keyword arguments) is left alone."""
    tokens = re.findall(r"\(|\)|[^\s()]+", markexpr)
    if not tokens or any(not re.fullmatch(r"[()]|[A-Za-z_][\w.-]*", t) for t in tokens):
        return False
    words = {"and", "or", "not", "(", ")"}

    def value(gsm8k: bool) -> bool:
        text = " ".join(t if t in words else str(gsm8k if t == "gsm8k" else False) for t in tokens)
        try:
            return bool(eval(text, {"__builtins__": {}}, {}))  # only True/False/and/or/not
        except SyntaxError:
            return False

    return value(True) and not value(False)
