"""The shapes that travel: one problem's record and one sample in it. Pure.

A record is a plain JSON-able dict (it rides the pytest report to the xdist
controller and lands unchanged in the JSON report), typed here so that mypy
checks every reader and writer of it. ``report.schema.json`` beside the package
describes the whole JSON report; its ``schema`` field is :data:`REPORT_SCHEMA`.
"""

from __future__ import annotations

from typing import Literal, TypedDict

#: version of the JSON report's shape (``"schema"`` field; report.schema.json)
REPORT_SCHEMA = 2

Outcome = Literal["correct", "wrong", "unparsed", "truncated", "error"]

OUTCOMES: tuple[Outcome, ...] = ("correct", "wrong", "unparsed", "truncated", "error")


class SampleRecord(TypedDict):
    """One sample (one choice of one request) of a problem's answer."""

    text: str
    finish_reason: str | None
    #: every rule's number (canonical text), None where the rule found none
    extracted: dict[str, str | None]
    #: correct under the gating rule
    correct: bool
    reasoning: str | None
    truncated: bool


class _RecordExtras(TypedDict, total=False):
    #: the endpoint that answered (credentials removed); set by the pytest layer
    endpoint: str
    #: maj@N: [number, votes] pairs, most votes first
    votes: list[list[str | int | None]]
    #: why the answer looks unusual (empty content, answer only in the reasoning)
    note: str
    #: the run stopped on this item's failure (the endpoint is gone)
    aborted: bool
    #: --gsm8k-repeats K > 1: the K outcomes in ask order (the record is the most common one's)
    repeats: list[Outcome]
    #: --gsm8k-repeats K > 1: how many of the K were correct
    repeats_correct: int


class ProblemRecord(_RecordExtras):
    """One problem's outcome: what every report, gate and page reads."""

    index: int
    id: str
    gold: str
    outcome: Outcome
    correct: bool
    #: the problem-level answer under the gating rule (canonical number text)
    extracted: str | None
    #: correctness under every rule
    rules: dict[str, bool]
    n_samples: int
    #: samples correct under the gating rule
    n_correct: int
    #: the first sample's text
    response: str
    samples: list[SampleRecord]
    usage: dict[str, int]
    #: samples that came from the cache
    cached: int
    #: the model the server said answered
    model: str | None
    error: str | None


class GateRecord(TypedDict):
    """One gate's verdict in the report (``GateVerdict.to_json``)."""

    name: str
    rule: str
    passed: bool
    value: float | None
    threshold: float | None
    detail: str


class ReportExtras(TypedDict, total=False):
    """Report fields present only for some runs."""

    #: the baseline comparison, or where the baseline was written
    baseline: dict[str, object]
    #: --gsm8k-early-stop: mode, alpha, decision, per-gate bounds
    early_stop: dict[str, object]
    #: --gsm8k-serve: command, pid, base URL, model, startup seconds
    served: dict[str, object]
    #: --gsm8k-model=local: the llama.cpp server
    local_server: dict[str, object]
    #: --gsm8k-config: the vLLM config of a config's report (its fields as given)
    config: dict[str, object]
    #: --gsm8k-config: each config's own report (the top level counts them all together)
    configs: list[dict[str, object]]
    #: --gsm8k-config: the configs deselected whole (-k, -m): never run, no verdict of theirs
    not_run: list[str]
    #: --gsm8k-repeats K > 1: K, the answers, and the mean accuracy over every answer
    repeats: dict[str, object]
    #: --gsm8k-shard: this shard's place, its problem ids and the run's plan, for the merge
    shard: dict[str, object]
    started_at: str
    finished_at: str
    duration_s: float


class Report(ReportExtras):
    """The JSON report (``--gsm8k-report``); report.schema.json says the same for other tools."""

    schema: int
    headline: str
    #: None when no problem was answered (every record an error): accuracy is undefined
    accuracy: float | None
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
    #: --gsm8k-resume: answers of earlier runs were read from the cache (``from_cache`` of them)
    resumed: bool
    gates: list[GateRecord]
    problems: list[ProblemRecord]
