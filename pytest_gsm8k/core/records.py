"""The shapes that travel, typed so mypy checks every reader and writer: a record rides the
pytest report to the xdist controller and lands unchanged in the JSON report. Pure."""

from __future__ import annotations

from typing import Literal, TypedDict

REPORT_SCHEMA = 2

Outcome = Literal["correct", "wrong", "unparsed", "truncated", "error"]

OUTCOMES: tuple[Outcome, ...] = ("correct", "wrong", "unparsed", "truncated", "error")

#: UNDECIDED: not decided and not blocking (moot beside another gate's early FAIL; a shard's
#: gates wait for the merge); an undecided gate that blocks says FAIL, "not a verdict: ..."
Word = Literal["PASS", "FAIL", "UNDECIDED"]


class SampleRecord(TypedDict):
    text: str
    finish_reason: str | None
    extracted: dict[str, str | None]
    correct: bool  # under the gating rule
    reasoning: str | None
    truncated: bool


class _RecordExtras(TypedDict, total=False):
    endpoint: str  # the endpoint that answered (credentials removed)
    votes: list[list[str | int | None]]  # maj@N: [number, votes], most votes first
    note: str  # why the answer looks unusual (empty content, answer only in the reasoning)
    aborted: bool  # the run stopped on this item's failure (the endpoint is gone)
    #: --gsm8k-repeats K > 1: the K outcomes in ask order (the record is the most common one's)
    repeats: list[Outcome]
    repeats_correct: int


class ProblemRecord(_RecordExtras):
    index: int
    id: str
    gold: str
    outcome: Outcome
    correct: bool
    extracted: str | None  # the problem's answer under the gating rule
    rules: dict[str, bool]
    n_samples: int
    n_correct: int  # samples correct under the gating rule
    response: str  # the first sample's text
    samples: list[SampleRecord]
    usage: dict[str, int]
    cached: int  # samples that came from the cache
    model: str | None  # the model the server said answered
    error: str | None


class GateRecord(TypedDict):
    name: str
    rule: str
    passed: bool  # does not block the run
    verdict: Word  # what every output shows: an undecided gate never passes
    value: float | None
    threshold: float | None
    detail: str


class ReportExtras(TypedDict, total=False):
    """Report fields present only for some runs (docs/report.md says each)."""

    baseline: dict[str, object]
    early_stop: dict[str, object]
    served: dict[str, object]
    local_server: dict[str, object]
    config: dict[str, object]
    configs: list[dict[str, object]]  # each config's own report; the top counts them all
    not_run: list[str]  # configs deselected whole (-k, -m): never run, no verdict of theirs
    repeats: dict[str, object]
    shard: dict[str, object]
    started_at: str
    finished_at: str
    duration_s: float


class Report(ReportExtras):
    """The JSON report (``--gsm8k-report``); report.schema.json says the same for other tools."""

    schema: int
    headline: str
    accuracy: float | None  # None when no problem was answered: undefined, not 0
    correct: int
    n: int
    expected: int
    complete: bool
    ci95: list[float] | None
    counts: dict[str, int]
    rules: dict[str, float]
    format_failures: int
    pass_at_k: dict[str, float]
    protocol: dict[str, object]
    model: str
    reported_models: list[str]
    endpoint: str
    dataset: dict[str, object]
    subset: dict[str, object]
    tokens: dict[str, int]
    from_cache: int
    resumed: bool  # --gsm8k-resume: ``from_cache`` answers came from earlier runs
    gates: list[GateRecord]
    problems: list[ProblemRecord]
