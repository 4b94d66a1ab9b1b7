"""The verdict step: a run's records and plain facts in, one frozen verdict out. Pure.

Every output renders from the :class:`RunVerdict` :func:`decide_run` returns, and nothing
edits it after (the one derived copy is made again with the baseline write's failure). Its
inputs are plain data a JSON report gives back, so a shard's merge and ``compare`` decide the
same way. Inside :func:`decide` each rule is written once, in the order docs/design.md gives:
numbers, each spec's verdict, the baseline, the early stop, coverage, resumed answers, shards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.calibrated import evidence
from pytest_gsm8k.core.counts import Counts
from pytest_gsm8k.core.early_stop import FLOOR
from pytest_gsm8k.core.gates import (
    GateVerdict,
    ToleranceFloor,
    Verdict,
    difference_words,
    failing_words,
    undecided,
)
from pytest_gsm8k.core.plan import GateSpecs, StoredBaseline
from pytest_gsm8k.core.records import REPORT_SCHEMA, ProblemRecord, Report
from pytest_gsm8k.core.types import Problem

#: problem ids a terminal list of flips shows before "+N more"
SHOWN_IDS = 10


@dataclass(frozen=True)
class Group:
    """One group of the run before any answer: a run's only group (``name`` "") or one
    ``--gsm8k-config`` config; ``extra``: report blocks it carries (its config, its server)."""

    name: str
    label: str
    #: the protocol's identity, and its own label (the floor's sentence)
    protocol: Mapping[str, Any]
    protocol_label: str
    dataset: Mapping[str, Any]
    subset: Mapping[str, Any]
    model: str
    endpoint: str
    specs: GateSpecs
    floor: ToleranceFloor | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: the JSON report's path ("" without one): where the flips are listed in full
    report: str = ""


@dataclass(frozen=True)
class Selection:
    """Facts about what ran for one group; no verdicts."""

    #: the problems the group set out to do (after -k/-m/--lf deselection), in plan order
    ids: tuple[str, ...]
    deselected: int = 0
    deselected_by: str = "-k/-m/--lf"
    interrupted: bool = False
    #: problems never reached after an endpoint failure (errors in the records)
    unreached: int = 0
    resumed: bool = False
    #: --gsm8k-shard I/N: (I, N)
    shard: tuple[int, int] | None = None
    #: why what ran is not the whole selection where the records cannot show it (compare:
    #: errors on shared problems, a report that left problems out), one clause with what to do
    not_whole: str | None = None


@dataclass(frozen=True)
class EarlyOutcome:
    """The early stop of one group, frozen at the end of the loop (core/early_stop.py)."""

    mode: str
    #: it decided (by the group's last problem); it stopped (before it)
    decided: bool
    stopped: bool
    #: each gate's decision (None: moot, another gate FAILed), by its early-stop name
    verdicts: Mapping[str, Verdict | None]
    headline: str
    n_total: int
    #: the report's block
    record: Mapping[str, Any]


@dataclass(frozen=True)
class BaselineInput:
    """The group's stored baseline (read once at plan time) and what to do with it."""

    stored: StoredBaseline
    #: the whole split under the group's ids: what a baseline may hold
    split: tuple[Problem, ...]
    #: --snapshot-update; --gsm8k-baseline-partial
    update: bool = False
    partial_ok: bool = False
    #: --gsm8k-baseline or --gsm8k-baseline-name named the file (no search by protocol)
    named: bool = False
    repeats: int = 1
    #: another run's JSON report (compare), already checked by its reader: no file or split
    from_report: bool = False
    #: the write failed: the one line why (the derived copy after the writer ran)
    write_error: str | None = None


@dataclass(frozen=True)
class GroupInput:
    group: Group
    records: tuple[ProblemRecord, ...]
    selection: Selection
    baseline: BaselineInput | None = None
    early: EarlyOutcome | None = None


@dataclass(frozen=True)
class GroupVerdict(Counts):
    """One group's records, numbers, gates and notes, decided; never edited."""

    group: Group
    records: tuple[ProblemRecord, ...]
    selection: Selection
    gates: tuple[GateVerdict, ...] = ()
    #: terminal lines printed before the gates (the baseline comparison, the early stop)
    notes: tuple[str, ...] = ()
    #: the report's blocks beyond the numbers (served, config, early_stop, baseline)
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: --snapshot-update: the baseline document to write (decide never writes)
    baseline_write: Mapping[str, Any] | None = None
    baseline: BaselineInput | None = None
    #: the stored baseline document it was compared with (the page shows its outcomes)
    compared: Mapping[str, Any] | None = None
    #: a matrix's top: each config's verdict (the top counts them all together)
    configs: tuple[GroupVerdict, ...] = ()

    @property
    def label(self) -> str:
        return self.group.label

    @property
    def model(self) -> str:
        return self.group.model

    @property
    def expected(self) -> int:
        return len(self.selection.ids)

    def protocol(self) -> Mapping[str, Any]:
        return self.group.protocol

    # -- the verdict ------------------------------------------------------------------

    @property
    def failed(self) -> bool:
        return any(not g.passed for g in self.gates)

    @property
    def interrupted(self) -> bool:
        return self.selection.interrupted

    def floor_gate(self) -> GateVerdict | None:
        """A config's vLLM floor gate, however it was decided."""
        return next((g for g in self.gates if g.name.endswith(f":{FLOOR}")), None)

    def stopped_after(self) -> tuple[int, int] | None:
        """(problems, of) when the early stop ended this group before its last problem."""
        early: Any = self.extra.get("early_stop") or {}
        after, total = early.get("decided_after"), early.get("n_total")
        if isinstance(after, int) and isinstance(total, int) and after < total:
            return after, total
        return None

    def baseline_word(self) -> str:
        """A config's baseline gate in one word, for the verdict table."""
        gate = next((g for g in self.gates if g.name.rpartition(":")[2] == "baseline"), None)
        if gate is not None:
            return gate.word
        base: Any = self.extra.get("baseline") or {}
        return "written" if base.get("written") else "none"

    def matrix_headline(self) -> str:
        passed = sum(1 for c in self.configs if not c.failed)
        only_vllm = all(g is c.floor_gate() for c in self.configs for g in c.gates)
        rule = (
            "accuracy >= accuracy_threshold - tolerance each"
            if only_vllm
            else "every gate of each config"
        )
        # a config deselected whole (-k, -m) gates nothing, but a CI log must show it never ran
        skipped = self.extra.get("not_run") or []
        not_run = f"; not run (deselected whole): {', '.join(skipped)}" if skipped else ""
        return f"gsm8k vLLM configs: {passed} of {len(self.configs)} pass ({rule}){not_run}"

    def headline(self) -> str:
        if self.configs:
            return self.matrix_headline()
        if not self.answered:
            errors = self.counts()["error"]
            line = f"gsm8k acc ({self.label}): no answers"
            line += (f": {errors} errors" if errors else "") + f"  n={self.n}"
        else:
            low, high = self.interval()
            line = (
                f"gsm8k acc ({self.label}) = {self.accuracy:.4f}  "
                f"[95% CI {low:.4f}-{high:.4f}]  n={self.n}"
            )
        split = self.group.dataset.get("split")
        if split != "test":
            line += f"  [{split} split: not a reportable number]"
        return line

    def to_json(self) -> Report:
        matrix = bool(self.configs)
        report: Report = {
            "schema": REPORT_SCHEMA,
            "headline": self.headline(),
            # a matrix pools different models and protocols: its configs say the accuracy
            "accuracy": self.accuracy if self.answered and not matrix else None,
            "correct": self.correct,
            "n": self.n,
            "expected": self.expected,
            "complete": self.n == self.expected and not self.interrupted,
            "ci95": list(self.interval()) if self.answered and not matrix else None,
            "counts": self.counts(),
            "rules": self.rule_accuracy(),
            "format_failures": self.format_failures(),
            "pass_at_k": self.pass_at(),
            "protocol": {**self.group.protocol, "label": self.label},
            "model": self.model,
            "reported_models": self.reported_models(),
            "endpoint": self.group.endpoint,
            "dataset": dict(self.group.dataset),
            "subset": dict(self.group.subset),
            "tokens": self.tokens(),
            "from_cache": self.from_cache(),
            "resumed": self.selection.resumed,
            "gates": [g.to_json() for g in self.gates],
            **self.extra,  # type: ignore[typeddict-item]
            "problems": sorted(self.records, key=lambda r: int(r["index"])),
        }
        repeats = self.repeats()
        if repeats is not None:
            report["repeats"] = repeats
        if matrix:
            # each config's problems are the top level's (their ids carry the config's name)
            report["configs"] = [
                {k: v for k, v in c.to_json().items() if k != "problems"} for c in self.configs
            ]
        return report


@dataclass(frozen=True)
class RunVerdict:
    """The run's verdict: one group, or each config's under a top that counts them all."""

    top: GroupVerdict
    matrix: bool
    #: outputs that could not be written: key -> the one line why (they fail the run)
    write_errors: Mapping[str, str] = field(default_factory=dict)

    @property
    def groups(self) -> tuple[GroupVerdict, ...]:
        return self.top.configs if self.matrix else (self.top,)

    @property
    def gates(self) -> tuple[GateVerdict, ...]:
        return self.top.gates

    @property
    def failed(self) -> bool:
        return self.top.failed or bool(self.write_errors)

    def to_json(self) -> Report:
        """The JSON report: the only place it is built."""
        return self.top.to_json()


def shared_words(block: Mapping[str, Any]) -> str:
    """Which problems a baseline block compared, as every output says it."""
    shared = block.get("shared")
    if block.get("subset"):
        return f"on the {shared} problems shared with the baseline's {block['baseline_n']} (subset)"
    return f"on {shared} problems"


# -- decide ---------------------------------------------------------------------------


def decide(
    group: Group,
    records: Sequence[ProblemRecord],
    baseline: BaselineInput | None,
    selection: Selection,
    early: EarlyOutcome | None,
) -> GroupVerdict:
    """One group's verdict (the rules in the module's order)."""
    extra: dict[str, Any] = dict(group.extra)
    notes: list[str] = []
    if selection.unreached:
        notes.append(
            f"  {selection.unreached} of the errors were not reached: the run stopped on the "
            "endpoint failure (pytest counts them as skipped)"
        )
    if early is not None:
        extra["early_stop"] = dict(early.record)
        said = early.headline
        if group.name and early.decided and not early.stopped:
            said = (
                "not stopped early: its verdicts were open until the last of its "
                f"{early.n_total} problems"
            )
        notes.append(f"  early stop ({early.mode}): {said}")
    v = GroupVerdict(
        group, tuple(records), selection, notes=tuple(notes), extra=extra, baseline=baseline
    )
    # 1-2: the numbers and each spec's verdict on them
    specs = group.specs
    gates: list[GateVerdict] = []
    if group.floor is not None:
        gates.append(group.floor.verdict(v.answers_correct, v.n, group.protocol_label, v.runs))
    if specs.min_acc is not None:
        gates.append(specs.min_acc.verdict(v.answers_correct, v.n, group.label, v.runs))
    for spec in specs.health:
        count = sum(v.answers(r).count(spec.outcome) for r in v.records)
        gates.append(spec.verdict(count, v.n, v.runs))
    v = replace(v, gates=tuple(gates))
    # 4: the baseline (a gate and notes, or a document to write)
    writing = baseline is not None and baseline.update
    if baseline is not None:
        v = _write(v, baseline, early) if writing else _compare(v, baseline)
    # 3: the early stop's decision on the gates it settled
    if early is not None and early.stopped:
        v = replace(v, gates=tuple(_early(g, early, group.name, writing) for g in v.gates))
    # 6: coverage (a baseline write has its own rules)
    if not writing:
        v = replace(v, gates=_coverage(v, early is not None and early.stopped))
    # 7: resumed answers
    if selection.resumed:
        said = v.earlier_answers()
        v = replace(v, gates=tuple(replace(g, detail=f"{g.detail}; {said}") for g in v.gates))
    # 8: a shard's gates wait for the merge
    if selection.shard is not None:
        wait = f"shard {selection.shard[0]} of {selection.shard[1]}: verdict at the merge"
        shard = {"rule": "shard", "passed": True, "undecided": True, "detail": wait}
        v = replace(v, gates=tuple(replace(g, **shard) for g in v.gates))  # type: ignore[arg-type]
    return v


def _early(gate: GateVerdict, early: EarlyOutcome, config: str, writing: bool) -> GateVerdict:
    """A gate the early stop settled takes its decision (the partial counts' verdict would
    not be the full run's; the decision's is, exactly or within its alpha)."""
    key = FLOOR if gate.rule == FLOOR else gate.name
    if key not in early.verdicts or (writing and key == "baseline"):
        return gate
    decided = early.verdicts[key]
    moot = f"undecided: the {'config' if config else 'run'} stopped early on another gate's FAIL"
    return GateVerdict(
        gate.name,
        "early-stop",
        decided != "FAIL",
        early.headline if decided is not None else moot,
        threshold=None if key == "baseline" else gate.threshold,
        undecided=decided is None,
    )


def _coverage(v: GroupVerdict, stopped_early: bool) -> tuple[GateVerdict, ...]:
    """No gate passes unless every problem of its selection has a result: what -k, -m,
    --lf or skips left is not a sample of them (a subset on purpose is ``--gsm8k-limit``);
    the problems an early stop left are decided by its guarantee."""
    deselected = v.selection.deselected
    missing = 0 if stopped_early else v.expected - v.n
    of = f"of the {v.expected + deselected} problems of its selection"
    said = []
    if deselected:
        said.append(f"{deselected} {of} were deselected ({v.selection.deselected_by})")
    if missing > 0:
        stopped = "; the run was interrupted" if v.interrupted else ""
        said.append(f"{missing} {of} have no result (skipped, or not reached{stopped})")
    whys = [v.selection.not_whole] if v.selection.not_whole else []
    if said:
        whys.insert(
            0,
            f"{' and '.join(said)}; a gate holds for the whole selection: run the whole "
            "selection (a subset on purpose: --gsm8k-limit)",
        )
    if not whys:
        return v.gates
    return tuple(undecided(g, "; ".join(whys)) for g in v.gates)


def _facts(v: GroupVerdict) -> Report:
    """What the baseline rules read of the group (protocol, dataset, config, problems)."""
    return replace(v, gates=()).to_json()


def _fail(v: GroupVerdict, detail: str, **extra: Any) -> GroupVerdict:
    gate = GateVerdict("baseline", "baseline", False, detail)
    return replace(v, gates=(*v.gates, gate), **extra)


def _compare(v: GroupVerdict, baseline: BaselineInput) -> GroupVerdict:
    """The baseline gate with the comparison's notes and block; a missing baseline is a note
    (a FAIL with --gsm8k-require-baseline), a refused one a FAIL."""
    stored, specs = baseline.stored, v.group.specs
    shown = stored.shown
    report = _facts(v)
    if not stored.exists:
        record = "pytest <same options> --snapshot-update"
        moved = bl.moved_from(stored.beside, report)
        if moved is not None and not baseline.named:
            # found by its label, a changed protocol finds no file: never "no baseline yet"
            return _fail(
                v,
                f"no baseline of this protocol at {shown}, but one of another protocol on "
                f"the same data: {moved}; record this protocol's with: {record}",
            )
        message = f"no baseline at {shown}; record one with: {record}"
        if moved is not None:
            message += f" (one of another protocol is beside it: {moved})"
        if specs.require_baseline:
            return _fail(v, message + " (--gsm8k-require-baseline)")
        return replace(v, notes=(*v.notes, f"  baseline: {message}"))
    try:
        document = (
            stored.document
            if baseline.from_report and stored.document is not None
            else bl.check(stored, report, baseline.split)
        )
    except bl.BaselineError as exc:
        return _fail(v, str(exc))
    v = replace(v, compared=document)
    cmp = bl.compare(document, v.records, v.selection.ids)
    partial = document.get("partial")
    rule = specs.baseline
    pairs = bl.pairs(document, v.records)
    found = evidence(pairs)  # once: the gate, the rise warning and the block read it
    seen = bl.noise_block(pairs, rule.alpha, found)
    block = {"path": shown, "partial": partial is not None, **cmp, **seen}
    v = replace(v, extra={**v.extra, "baseline": block})
    shared, missing, run_n = cmp["shared"], cmp["not_in_baseline"], len(set(v.selection.ids))
    if shared == 0:
        return _fail(v, f"no problem id in common with {shown}")
    notes = list(v.notes)
    uncovered = None
    if missing:
        # the comparison counts only the shared problems: never unsaid for the whole run
        uncovered = (
            f"{shown} covers {run_n - missing} of this run's {run_n} problems: {missing} are "
            "not in it"
        )
        if partial is not None:
            uncovered += f" (a partial baseline: {partial.get('reason', '')})"
        if not specs.require_baseline:
            notes.append(f"  baseline: {uncovered}; the gate compares the {shared} it holds")
    notes.append(
        f"  baseline {shown}: {seen['baseline_accuracy']:.4f} -> "
        f"{seen['current_accuracy']:.4f} {shared_words(cmp)}; {difference_words(pairs)}"
    )
    recorded_with = document.get("model")
    if isinstance(recorded_with, str) and recorded_with != v.model:
        notes.append(
            f"  the baseline was recorded with model {recorded_with} (this run: {v.model})"
        )
    notes.append(f"  {bl.noise_sentence(seen)}")
    notes.append(f"  {failing_words(pairs)}; p={seen['p_value']:.4g}")
    rise = rule.rise(pairs, found)
    if rise is not None:
        notes.append(f"  {rise}")
    where_all = "in the JSON report" if v.group.report else "with --gsm8k-report PATH"
    runs = seen["repeats"]["baseline"]
    for title, ids in (
        (
            f"newly failing, stable (right in all {runs} baseline runs)"
            if runs > 1
            else "newly failing",
            seen["stable_flips"] if runs > 1 else seen["newly_failing"],
        ),
        ("newly failing, noisy (right in some baseline runs)", seen["noisy_failing"]),
    ):
        if ids:
            left = len(ids) - SHOWN_IDS
            more = f" (+{left} more {where_all})" if left > 0 else ""
            notes.append(f"  {title}: {', '.join(ids[:SHOWN_IDS])}{more}")
    v = replace(v, notes=tuple(notes))
    if uncovered is not None and specs.require_baseline:
        return _fail(
            v,
            f"{uncovered}; --gsm8k-require-baseline needs every problem of the run in it: "
            "record a baseline of the whole selection with --snapshot-update",
        )
    return replace(v, gates=(*v.gates, rule.verdict(pairs, found)))


def _write(v: GroupVerdict, baseline: BaselineInput, early: EarlyOutcome | None) -> GroupVerdict:
    """``--snapshot-update``: the document to write, only from a run of its whole selection
    and never over a baseline holding problems the run does not (unless
    ``--gsm8k-baseline-partial``). The writer writes; a failure comes back as ``write_error``."""
    stored = baseline.stored
    shown = stored.shown
    if baseline.write_error is not None:
        return _fail(v, f"{shown}: cannot write it ({baseline.write_error})")
    stopped_early = early is not None and early.stopped
    counts = v.counts()
    reason = None
    if v.interrupted:
        reason = "the run was interrupted"
    elif counts["error"]:
        reason = f"{counts['error']} problems ended in an error"
    elif v.n < v.expected and not stopped_early:
        reason = f"only {v.n} of {v.expected} problems have a result"
    if reason:
        return _fail(v, f"not written to {shown}: {reason}")
    deselected = v.selection.deselected
    selection = v.expected + deselected
    partial = None
    if stopped_early:
        partial = (
            f"the run stopped early (--gsm8k-early-stop) after {v.n} of the {selection} "
            "problems of its selection"
        )
    elif deselected:
        partial = (
            f"{deselected} of the {selection} problems of its selection were deselected "
            f"({v.selection.deselected_by})"
        )
    if partial is not None and not baseline.partial_ok:
        return _fail(
            v,
            f"not written to {shown}: {partial}; a baseline holds the whole selection "
            "(--gsm8k-baseline-partial writes a partial one)",
        )
    report = _facts(v)
    if not baseline.partial_ok:
        dropped = bl.dropped(stored, report, baseline.split)
        if dropped:
            return _fail(
                v,
                f"not written to {shown}: it holds {dropped} problems this run does not have; "
                "delete it to record a smaller one, or pass --gsm8k-baseline-partial",
            )
    fewer = bl.fewer_repeats(stored.document, baseline.repeats)
    if fewer is not None:
        return _fail(v, f"not written to {shown}: {fewer}")
    size = f"n={v.n}"
    size += f" of the {selection} of its selection, partial: {partial};" if partial else ","
    note = f"  baseline written: {shown} ({size} accuracy {v.accuracy:.4f})"
    block = {"path": shown, "written": True, "partial": partial is not None}
    return replace(
        v,
        notes=(*v.notes, note),
        extra={**v.extra, "baseline": block},
        baseline_write=bl.build(report, partial),
    )


def decide_run(
    inputs: Sequence[GroupInput],
    *,
    top: Group | None = None,
    not_run: Sequence[str] = (),
    times: tuple[str, str, float] | None = None,
    write_errors: Mapping[str, str] | None = None,
) -> RunVerdict:
    """Each group decided; with ``top`` (a matrix) each config's gates named after it
    (``Qwen3:min-acc``) under a top that counts every config's records (``not_run``: configs
    deselected whole). ``times``: (started, finished, seconds)."""
    decided = [decide(i.group, i.records, i.baseline, i.selection, i.early) for i in inputs]
    if top is None:
        (verdict,) = decided
    else:
        decided = [
            replace(
                d,
                gates=tuple(
                    g
                    if g.name.startswith(f"{d.group.name}:")
                    else replace(g, name=f"{d.group.name}:{g.name}")
                    for g in d.gates
                ),
            )
            for d in decided
        ]
        ids = tuple(pid for d in decided for pid in d.selection.ids)
        selection = Selection(
            ids,
            interrupted=any(i.selection.interrupted for i in inputs),
            resumed=any(i.selection.resumed for i in inputs),
        )
        verdict = GroupVerdict(
            top,
            tuple(r for d in decided for r in d.records),
            selection,
            gates=tuple(g for d in decided for g in d.gates),
            extra={**top.extra, "not_run": list(not_run)},
            configs=tuple(decided),
        )
    if times is not None:
        started, finished, seconds = times
        when = {"started_at": started, "finished_at": finished, "duration_s": seconds}
        verdict = replace(verdict, extra={**verdict.extra, **when})
    return RunVerdict(verdict, top is not None, write_errors or {})
