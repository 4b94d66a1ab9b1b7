"""The verdict step: records and plain facts in (what a JSON report gives back, so a merge and
``compare`` decide the same way), one frozen verdict out that every output renders from. Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.calibrated import evidence
from pytest_gsm8k.core.early_stop import FLOOR
from pytest_gsm8k.core.gates import GateVerdict, ToleranceFloor, Verdict, undecided
from pytest_gsm8k.core.plan import GateSpecs, StoredBaseline
from pytest_gsm8k.core.records import OUTCOMES, REPORT_SCHEMA, ProblemRecord, Report, Word
from pytest_gsm8k.core.scoring import RULES
from pytest_gsm8k.core.stats import accuracy_interval, pass_at_k
from pytest_gsm8k.core.types import Problem


@dataclass(frozen=True)
class Group:
    """One group before any answer: a run's only group (``name`` "") or one config;
    ``extra``: the report blocks it carries; ``report``: the JSON report's path or ""."""

    name: str
    label: str
    protocol: Mapping[str, Any]
    protocol_label: str  # the protocol's own label (the floor's sentence)
    dataset: Mapping[str, Any]
    subset: Mapping[str, Any]
    model: str
    endpoint: str
    specs: GateSpecs
    floor: ToleranceFloor | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    report: str = ""


@dataclass(frozen=True)
class Selection:
    """Facts about what ran for one group (``ids``: what it set out to do, in plan order)."""

    ids: tuple[str, ...]
    deselected: int = 0
    deselected_by: str = "-k/-m/--lf"
    interrupted: bool = False
    unreached: int = 0  # never reached after an endpoint failure (errors in the records)
    resumed: bool = False
    shard: tuple[int, int] | None = None  # --gsm8k-shard I/N
    #: why what ran is not the whole selection where the records cannot show it (compare)
    not_whole: str | None = None
    clashes: tuple[tuple[str, str, str], ...] = ()  # (problem id, two node ids): they disagree


@dataclass(frozen=True)
class EarlyOutcome:
    """One group's early stop, frozen at the end of the loop (core/early_stop.py): its
    ``record`` (the report's block), its line, and whether it ``stopped`` the group before
    its last problem; a verdict None in the record is moot."""

    record: Mapping[str, Any]
    headline: str
    stopped: bool
    not_stopped: str  # why a decision before the last problem did not stop the group


@dataclass(frozen=True)
class BaselineInput:
    """The stored baseline and its rules: ``split`` what it may hold, ``named`` named by option,
    ``from_report`` compare's report A (checked), ``write_error`` the one derived copy's."""

    stored: StoredBaseline
    split: tuple[Problem, ...]
    update: bool = False
    partial_ok: bool = False
    named: bool = False
    repeats: int = 1
    from_report: bool = False
    write_error: str | None = None


@dataclass(frozen=True)
class GroupInput:
    group: Group
    records: tuple[ProblemRecord, ...]
    selection: Selection
    baseline: BaselineInput | None = None
    early: EarlyOutcome | None = None


@dataclass(frozen=True)
class GroupVerdict:
    """One group's records, numbers, gates and notes, decided; never edited. The numbers
    come from the records alone, so they are the same with and without xdist."""

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
    matrix: bool = False  # a --gsm8k-config run's top (its configs may all be deselected)

    @property
    def groups(self) -> tuple[GroupVerdict, ...]:
        return self.configs if self.matrix else (self,)

    @property
    def expected(self) -> int:
        return len(self.selection.ids)

    @property
    def n(self) -> int:
        return len(self.records)

    @property
    def correct(self) -> int:  # with repeats: problems whose most common answer is
        return sum(1 for r in self.records if r["correct"])

    @property
    def runs(self) -> int:  # answers per problem: --gsm8k-repeats K's K, else 1
        return max((len(r.get("repeats") or ()) for r in self.records), default=0) or 1

    @property
    def answers_correct(self) -> int:
        runs = (int(r.get("repeats_correct") or 0) for r in self.records)
        return sum(runs) if self.runs > 1 else self.correct

    @property
    def accuracy(self) -> float:
        """test@1: the mean over every answer (with repeats, never a majority of them)."""
        return self.answers_correct / (self.n * self.runs) if self.n else 0.0

    @property
    def answered(self) -> int:
        """Problems the model answered: with none, accuracy is undefined, not 0."""
        return self.n - self.counts()["error"]

    def interval(self) -> tuple[float, float]:
        """Wilson's interval; with repeats, at the effective number of problems."""
        k = self.runs
        rates = [int(r.get("repeats_correct") or 0) / k for r in self.records]
        return accuracy_interval(rates if k > 1 else [float(r["correct"]) for r in self.records], k)

    def counts(self) -> dict[str, int]:
        counter = Counter(r["outcome"] for r in self.records)
        return {o: counter.get(o, 0) for o in OUTCOMES}

    def pass_at(self) -> dict[str, float]:
        """Unbiased pass@k (Chen et al. 2021) for k = 1 and the powers of two below N."""
        samples = int(self.group.protocol["samples"])
        if not str(self.group.protocol["name"]).startswith("pass@") or samples < 2:
            return {}
        scored = [r for r in self.records if r["outcome"] != "error"]
        ks = {1, samples, *(2**i for i in range(1, samples.bit_length()) if 2**i < samples)}
        return {
            f"pass@{k}": sum(pass_at_k(max(r["n_samples"], k), r["n_correct"], k) for r in scored)
            / (self.n or 1)
            for k in sorted(ks)
        }

    def from_cache(self) -> int:
        return sum(1 for r in self.records if r.get("cached"))

    def reported_models(self) -> list[str]:
        return sorted({str(r["model"]) for r in self.records if r.get("model")})

    def earlier_answers(self) -> str:
        """How many answers came from earlier runs, as every output of a resumed run says."""
        return f"{self.from_cache()} of {self.n} answers from earlier runs (--gsm8k-resume)"

    @property
    def failed(self) -> bool:
        return any(not g.passed for g in self.gates)

    def matrix_headline(self) -> str:
        words = [word_of(g.word for g in c.gates) for c in self.configs]
        passed, undecided = words.count("PASS"), words.count("UNDECIDED")
        only_vllm = all(g.name.endswith(f":{FLOOR}") for c in self.configs for g in c.gates)
        rule = "every gate of each config"
        rule = "accuracy >= accuracy_threshold - tolerance each" if only_vllm else rule
        # a config deselected whole (-k, -m) gates nothing, but a CI log must show it never ran
        skipped = self.extra.get("not_run") or []
        not_run = f"; not run (deselected whole): {', '.join(skipped)}" if skipped else ""
        of = f"{passed} of {len(self.configs)} pass" + f", {undecided} undecided" * bool(undecided)
        return f"gsm8k vLLM configs: {of} ({rule}){not_run}"

    def headline(self) -> str:
        if self.configs:
            return self.matrix_headline()
        errors, (low, high) = self.counts()["error"], self.interval()
        acc = f" = {self.accuracy:.4f}  [95% CI {low:.4f}-{high:.4f}]"
        acc = acc if self.answered else ": no answers" + f": {errors} errors" * bool(errors)
        split = self.group.dataset.get("split")
        odd = f"  [{split} split: not a reportable number]" * (split != "test")
        return f"gsm8k acc ({self.group.label}){acc}  n={self.n}{odd}"

    def to_json(self) -> Report:
        """The JSON report: the only place it is built (and every number the outputs show)."""
        matrix, n, runs, records = bool(self.configs), self.n, self.runs, self.records
        names = list(dict.fromkeys([*RULES, *(rule for r in records for rule in r["rules"])]))
        right = Counter(rule for r in records for rule, ok in r["rules"].items() if ok)
        gated, tokens = self.group.protocol["extractor"], Counter[str]()
        for r in records:
            tokens.update(r.get("usage") or {})
        missed = (r["rules"] for r in records if not r["rules"].get(gated))
        report: Report = {
            "schema": REPORT_SCHEMA,
            "headline": self.headline(),
            # a matrix pools different models and protocols: its configs say the accuracy
            "accuracy": self.accuracy if self.answered and not matrix else None,
            "correct": self.correct,
            "n": n,
            "expected": self.expected,
            "complete": n == self.expected and not self.selection.interrupted,
            "ci95": list(self.interval()) if self.answered and not matrix else None,
            "counts": self.counts(),
            # our rules, then any a preset adds (lm-eval's strict-match, flexible-extract)
            "rules": {rule: right[rule] / n if n else 0.0 for rule in names},
            # problems the gated extractor missed but another rule got right
            "format_failures": sum(
                any(v for rule, v in r.items() if rule != gated) for r in missed
            ),
            "pass_at_k": self.pass_at(),
            "protocol": {**self.group.protocol, "label": self.group.label},
            "model": self.group.model,
            "reported_models": self.reported_models(),
            "endpoint": self.group.endpoint,
            "dataset": dict(self.group.dataset),
            "subset": dict(self.group.subset),
            "tokens": dict(tokens),
            "from_cache": self.from_cache(),
            "resumed": self.selection.resumed,
            "gates": [g.to_json() for g in self.gates],
            **self.extra,  # type: ignore[typeddict-item]
            "problems": sorted(records, key=lambda r: int(r["index"])),
        }
        if runs > 1:  # --gsm8k-repeats K: the mean over every answer and maj@K
            low, high = self.interval()
            report["repeats"] = {
                "per_problem": runs,
                "answers": n * runs,
                "mean_accuracy": round(self.accuracy, 6),
                "ci95": [round(low, 6), round(high, 6)],
                "majority_accuracy": round(self.correct / n, 6) if n else 0.0,
            }
        if matrix:  # each config's problems are the top's (their ids carry the config's name)
            configs = [c.to_json() for c in self.configs]
            report["configs"] = [{k: v for k, v in c.items() if k != "problems"} for c in configs]
        return report


#: the run's verdict is its top group's: one group, or a matrix's top over each config's
RunVerdict = GroupVerdict


def word_of(gate_words: Iterable[str]) -> Word:
    """A config's or a run's word from its gates' (FAIL, else UNDECIDED, else PASS): a group
    with a gate that was not decided never passes."""
    words = set(gate_words)
    return "FAIL" if "FAIL" in words else "UNDECIDED" if "UNDECIDED" in words else "PASS"


def decide(given: GroupInput) -> GroupVerdict:
    """One group's verdict (the rules in the module's order)."""
    group, baseline, selection, early = given.group, given.baseline, given.selection, given.early
    stopped = early is not None and early.stopped
    extra: dict[str, Any] = dict(group.extra)
    notes = []
    if selection.unreached:
        notes.append(
            f"  {selection.unreached} of the errors were not reached: the run stopped on the "
            "endpoint failure (pytest counts them as skipped)"
        )
    if early is not None:
        extra["early_stop"] = dict(early.record)
        said, n, after = early.headline, early.record["n_total"], early.record["decided_after"]
        if after is not None and after < n and not early.stopped:
            said += f"; not stopped: {early.not_stopped}"
            extra["early_stop"]["not_stopped"] = early.not_stopped  # (render.config_rows)
        elif group.name and after == n:
            said = f"not stopped early: its verdicts were open until the last of its {n} problems"
        notes.append(f"  early stop ({early.record['mode']}): {said}")
    v = GroupVerdict(group, given.records, selection, (), tuple(notes), extra, baseline=baseline)
    # 1-2: the numbers and each spec's verdict on them
    specs, gates = group.specs, []
    for floor, label in ((group.floor, group.protocol_label), (specs.min_acc, group.label)):
        if floor is not None:  # the config's (vLLM's), then --gsm8k-min-acc
            gates.append(floor.verdict(v.answers_correct, v.n, label, v.runs))
    for spec in specs.health:  # each answer's outcome (an error is the whole item's)
        answers = [a for r in v.records for a in r.get("repeats") or [r["outcome"]] * v.runs]
        gates.append(spec.verdict(answers.count(spec.outcome), v.n, v.runs))
    v = replace(v, gates=tuple(gates))
    # 4: the baseline (a gate and notes, or a document to write)
    writing = baseline is not None and baseline.update
    if baseline is not None:
        v = _write(v, baseline, stopped) if writing else _compare(v, baseline)
    # 3: the early stop's decision on the gates it settled
    if early is not None and early.stopped:
        v = replace(v, gates=tuple(_early(g, early, group.name, writing) for g in v.gates))
    # 5-6: two tests' different answers to a problem; coverage (a write has its own rules)
    if not writing:
        clash = _clash(selection.clashes)
        v = replace(v, gates=tuple(undecided(g, clash, fails_too=True) for g in v.gates))
        v = replace(v, gates=_coverage(v, stopped))
    # 7: resumed answers
    said = f"; {v.earlier_answers()}" if selection.resumed else ""
    v = replace(v, gates=tuple(replace(g, detail=g.detail + said) for g in v.gates))
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
    verdicts: Mapping[str, Verdict | None] = early.record["verdicts"]
    if key not in verdicts or (writing and key == "baseline"):
        return gate
    decided, threshold = verdicts[key], None if key == "baseline" else gate.threshold
    moot = f"undecided: the {'config' if config else 'run'} stopped early on another gate's FAIL"
    said = early.headline if decided is not None else moot
    return GateVerdict(
        gate.name, "early-stop", decided != "FAIL", said, None, threshold, decided is None
    )


def _coverage(v: GroupVerdict, stopped_early: bool) -> tuple[GateVerdict, ...]:
    """No gate passes unless every problem of its selection has a result: what -k, -m,
    --lf or skips left is not a sample of them (a subset on purpose is ``--gsm8k-limit``);
    the problems an early stop left are decided by its guarantee."""
    deselected = v.selection.deselected
    missing = 0 if stopped_early else v.expected - v.n
    of = f"of the {v.expected + deselected} problems of its selection"
    stopped = "; the run was interrupted" if v.selection.interrupted else ""
    said = [f"{deselected} {of} were deselected ({v.selection.deselected_by})"] * bool(deselected)
    said += [f"{missing} {of} have no result (skipped, or not reached{stopped})"] * (missing > 0)
    whole = "run the whole selection (a subset on purpose: --gsm8k-limit)"
    whys = [f"{' and '.join(said)}; a gate holds for the whole selection: {whole}"] if said else []
    whys += [v.selection.not_whole] if v.selection.not_whole else []
    return tuple(undecided(g, "; ".join(whys)) for g in v.gates) if whys else v.gates


def _clash(clashes: Sequence[tuple[str, str, str]]) -> str | None:
    if not clashes:
        return None
    (pid, a, b), n = clashes[0], len(clashes)
    said = f"{n} problem{'s were' if n > 1 else ' was'} answered differently by two tests, "
    return f"{said}first {pid}: {a} and {b}; run one of them (-k, or a marker of your own and -m)"


def _fail(v: GroupVerdict, detail: str) -> GroupVerdict:
    gate = GateVerdict("baseline", "baseline", False, detail)
    return replace(v, gates=(*v.gates, gate))


def _compare(v: GroupVerdict, baseline: BaselineInput) -> GroupVerdict:
    """The baseline gate with the comparison's notes and block; a missing baseline is a note
    (a FAIL with --gsm8k-require-baseline), a refused one a FAIL."""
    stored, specs, report = baseline.stored, v.group.specs, v.to_json()
    shown, record = stored.shown, "pytest <same options> --snapshot-update"
    if not stored.exists:
        moved = bl.moved_from(stored.beside, report)
        if moved is not None and not baseline.named:
            # found by its label, a changed protocol finds no file: never "no baseline yet"
            other = f"but one of another protocol on the same data: {moved}"
            here = f"no baseline of this protocol at {shown}, {other}"
            return _fail(v, f"{here}; record this protocol's with: {record}")
        message = f"no baseline at {shown}; record one with: {record}"
        if moved is not None:
            message += f" (one of another protocol is beside it: {moved})"
        if specs.require_baseline:
            return _fail(v, message + " (--gsm8k-require-baseline)")
        return replace(v, notes=(*v.notes, f"  baseline: {message}"))
    document = stored.document if baseline.from_report else None
    try:
        document = bl.check(stored, report, baseline.split) if document is None else document
    except bl.BaselineError as exc:
        return _fail(v, str(exc))
    rule, pairs, partial = specs.baseline, bl.pairs(document, v.records), document.get("partial")
    found = evidence(pairs)  # once: the gate, the rise warning and the block read it
    seen = bl.noise_block(document, v.records, v.selection.ids, rule.alpha, found)
    block = {"path": shown, "partial": partial is not None, **seen}
    v = replace(v, compared=document, extra={**v.extra, "baseline": block})
    shared, missing, run_n = seen["shared"], seen["not_in_baseline"], len(set(v.selection.ids))
    if shared == 0:
        return _fail(v, f"no problem id in common with {shown}")
    notes, uncovered = list(v.notes), None
    if missing:  # the comparison counts only the shared problems: never unsaid for the run
        uncovered = f"{shown} covers {run_n - missing} of this run's {run_n} problems: "
        uncovered += f"{missing} are not in it"
        if partial is not None:
            uncovered += f" (a partial baseline: {partial.get('reason', '')})"
        if not specs.require_baseline:
            notes.append(f"  baseline: {uncovered}; the gate compares the {shared} it holds")
    was = document.get("model")
    if isinstance(was, str) and was != v.group.model:
        notes.append(f"  the baseline was recorded with model {was} (this run: {v.group.model})")
    notes += [f"  {rise}" for rise in [rule.rise(pairs, found)] if rise is not None]
    v = replace(v, notes=tuple(notes))
    if uncovered is not None and specs.require_baseline:
        need = "--gsm8k-require-baseline needs every problem of the run in it: record a baseline"
        return _fail(v, f"{uncovered}; {need} of the whole selection with --snapshot-update")
    return replace(v, gates=(*v.gates, rule.verdict(pairs, found)))


def _write(v: GroupVerdict, baseline: BaselineInput, stopped_early: bool) -> GroupVerdict:
    """``--snapshot-update``'s document, only from a whole selection and never over a baseline
    holding problems the run lacks (else partial); a failed write returns as ``write_error``."""
    stored, errors, report = baseline.stored, v.counts()["error"], v.to_json()
    if baseline.write_error is not None:
        return _fail(v, f"{stored.shown}: cannot write it ({baseline.write_error})")
    deselected = v.selection.deselected
    selection = v.expected + deselected
    partial = None
    if stopped_early:
        partial = "the run stopped early (--gsm8k-early-stop) after "
        partial += f"{v.n} of the {selection} problems of its selection"
    elif deselected:
        partial = f"{deselected} of the {selection} problems of its selection were deselected "
        partial += f"({v.selection.deselected_by})"
    dropped = 0 if baseline.partial_ok else bl.dropped(stored, report, baseline.split)
    whole = "a baseline holds the whole selection (--gsm8k-baseline-partial writes a partial one)"
    smaller = "delete it to record a smaller one, or pass --gsm8k-baseline-partial"
    unanswered = v.n < v.expected and not stopped_early
    for bad, why in (
        (v.selection.interrupted, "the run was interrupted"),
        (errors, f"{errors} problems ended in an error"),
        (unanswered, f"only {v.n} of {v.expected} problems have a result"),
        (partial is not None and not baseline.partial_ok, f"{partial}; {whole}"),
        (dropped, f"it holds {dropped} problems this run does not have; {smaller}"),
        (True, bl.fewer_repeats(stored.document, baseline.repeats)),
        (True, _clash(v.selection.clashes)),
    ):
        if bad and why is not None:
            return _fail(v, f"not written to {stored.shown}: {why}")
    size = f"n={v.n}"
    size += f" of the {selection} of its selection, partial: {partial};" if partial else ","
    note = f"  baseline written: {stored.shown} ({size} accuracy {v.accuracy:.4f})"
    block = {"path": stored.shown, "written": True, "partial": partial is not None}
    extra = {**v.extra, "baseline": block}
    return replace(v, notes=(*v.notes, note), extra=extra, baseline_write=bl.build(report, partial))


def _named(config: str) -> Callable[[GateVerdict], GateVerdict]:
    """A config's gate named after it (``Qwen3:min-acc``; its floor already is)."""
    named = f"{config}:"
    return lambda g: g if g.name.startswith(named) else replace(g, name=named + g.name)


def decide_run(
    inputs: Sequence[GroupInput], *, top: Group | None, times: tuple[str, str, float] | None
) -> RunVerdict:
    """Each group decided; with ``top`` (a matrix) each config's gates named after it under a
    top counting every config's records. ``times``: (started, finished, seconds)."""
    decided = [decide(i) for i in inputs]
    if top is None:
        (verdict,) = decided
    else:
        decided = [replace(d, gates=tuple(map(_named(d.group.name), d.gates))) for d in decided]
        both = tuple(g for d in decided for g in d.gates)
        ids = tuple(pid for d in decided for pid in d.selection.ids)
        interrupted = any(i.selection.interrupted for i in inputs)
        resumed = any(i.selection.resumed for i in inputs)
        selection = Selection(ids, interrupted=interrupted, resumed=resumed)
        records = tuple(r for d in decided for r in d.records)
        verdict = GroupVerdict(
            top, records, selection, both, extra=top.extra, configs=tuple(decided)
        )
    if times is not None:
        when = dict(zip(("started_at", "finished_at", "duration_s"), times, strict=True))
        verdict = replace(verdict, extra={**verdict.extra, **when})
    return replace(verdict, matrix=top is not None)
