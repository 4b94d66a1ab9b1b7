"""Aggregation of outcome records into the headline, the gates and the JSON report. Pure.

Runs once, on the controller (or the only process), after the test loop,
from the records that arrived in the reports: the same numbers with and
without xdist, because the inputs are the same records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, cast

from pytest_gsm8k.core.dataset import describe_subset
from pytest_gsm8k.core.gates import GateVerdict, MaxShare, MinAcc, ToleranceFloor, undecided
from pytest_gsm8k.core.health import chat_api_hint
from pytest_gsm8k.core.records import (
    OUTCOMES,
    REPORT_SCHEMA,
    GateRecord,
    ProblemRecord,
    Report,
    ReportExtras,
)
from pytest_gsm8k.core.scoring import RULES
from pytest_gsm8k.core.scrub import printable
from pytest_gsm8k.core.stats import accuracy_interval, pass_at_k

__all__ = ["REPORT_SCHEMA", "Summary"]


@dataclass
class Summary:
    protocol: dict[str, Any]
    label: str
    dataset: dict[str, Any]
    subset: dict[str, Any]
    model: str
    endpoint: str
    records: list[ProblemRecord]
    expected: int
    gates: list[GateVerdict] = field(default_factory=list)
    interrupted: bool = False
    #: extra terminal lines (baseline comparison), printed before the gates
    notes: list[str] = field(default_factory=list)
    #: top-level JSON report fields some runs have (baseline comparison, server, times)
    extra: ReportExtras = field(default_factory=lambda: ReportExtras())
    #: --gsm8k-config: each config's own summary, in run order (this one then counts them
    #: all together, and says no accuracy of its own: different models, different protocols)
    configs: list[Summary] = field(default_factory=list)
    #: --gsm8k-resume: the cache was read, and every output says how many answers it gave
    resumed: bool = False

    # -- derived numbers -----------------------------------------------------

    @property
    def n(self) -> int:
        return len(self.records)

    @property
    def correct(self) -> int:
        """Problems whose record is correct (with repeats: whose most common answer is)."""
        return sum(1 for r in self.records if r["correct"])

    @property
    def runs(self) -> int:
        """Answers per problem: ``--gsm8k-repeats K``'s K, else 1."""
        return max((len(r.get("repeats") or ()) for r in self.records), default=0) or 1

    def answers(self, record: ProblemRecord) -> list[str]:
        """A record's answers' outcomes: its repeats, or its one outcome for each of the
        run's answers (an error is the whole item's, every answer of it)."""
        return list(record.get("repeats") or ()) or [record["outcome"]] * self.runs

    @property
    def answers_correct(self) -> int:
        """Correct answers over every answer of the run (``correct`` without repeats)."""
        if self.runs == 1:
            return self.correct
        return sum(int(r.get("repeats_correct") or 0) for r in self.records)

    @property
    def accuracy(self) -> float:
        """test@1: the mean over every answer (with repeats, never a majority of them)."""
        return self.answers_correct / (self.n * self.runs) if self.n else 0.0

    @property
    def answered(self) -> int:
        """Problems the model answered (every outcome but ``error``): with none, accuracy is
        undefined, not 0."""
        return self.n - self.counts()["error"]

    def interval(self) -> tuple[float, float]:
        """Wilson's interval; with repeats, Wilson's at the effective number of problems
        (core/stats.py ``clustered_interval``: the problems are the unit, not the answers)."""
        k = self.runs
        rates = [
            int(r.get("repeats_correct") or 0) / k if k > 1 else float(bool(r["correct"]))
            for r in self.records
        ]
        return accuracy_interval(rates, k)

    def repeats(self) -> dict[str, object] | None:
        """With ``--gsm8k-repeats K``: K, the answers, the mean over every answer (the
        headline's test@1, with its interval over problems) and maj@K, the accuracy of
        each problem's most common answer (what the outcome counts count)."""
        if self.runs == 1:
            return None
        low, high = self.interval()
        return {
            "per_problem": self.runs,
            "answers": self.n * self.runs,
            "mean_accuracy": round(self.accuracy, 6),
            "ci95": [round(low, 6), round(high, 6)],
            "majority_accuracy": round(self.correct / self.n, 6) if self.n else 0.0,
        }

    def counts(self) -> dict[str, int]:
        counter = Counter(r["outcome"] for r in self.records)
        return {o: counter.get(o, 0) for o in OUTCOMES}

    def rule_names(self) -> list[str]:
        """Our rules, then any a preset adds (lm-eval's strict-match, flexible-extract)."""
        names = list(RULES)
        for record in self.records:
            names += [name for name in record["rules"] if name not in names]
        return names

    def rule_accuracy(self) -> dict[str, float]:
        names = self.rule_names()
        if not self.n:
            return dict.fromkeys(names, 0.0)
        return {
            rule: sum(1 for r in self.records if r["rules"].get(rule)) / self.n for rule in names
        }

    def silent_rules(self) -> set[str]:
        """Our extraction rules that found no number in any sample of the run (a page of
        0.0000 for them says nothing)."""
        found: set[str] = set()
        for record in self.records:
            for sample in record["samples"]:
                found.update(rule for rule, value in sample["extracted"].items() if value)
        return {rule for rule in RULES if rule not in found} if self.records else set()

    def format_failures(self) -> int:
        """Problems the gated extractor missed but another rule got right."""
        gated = self.protocol["extractor"]
        return sum(
            1
            for r in self.records
            if not r["rules"].get(gated) and any(v for k, v in r["rules"].items() if k != gated)
        )

    def pass_at(self) -> dict[str, float]:
        """Unbiased pass@k (Chen et al. 2021) for k = 1 and the powers of two below N."""
        samples = int(self.protocol["samples"])
        if not self.protocol["name"].startswith("pass@") or samples < 2:
            return {}
        scored = [r for r in self.records if r["outcome"] != "error"]
        ks = [1] + [2**i for i in range(1, samples.bit_length()) if 2**i < samples]
        ks.append(samples)
        out: dict[str, float] = {}
        for k in sorted(set(ks)):
            values = [pass_at_k(max(r["n_samples"], k), r["n_correct"], k) for r in scored]
            out[f"pass@{k}"] = sum(values) / len(self.records) if self.records else 0.0
        return out

    def tokens(self) -> dict[str, int]:
        total: Counter[str] = Counter()
        for r in self.records:
            total.update(r.get("usage") or {})
        return dict(total)

    def from_cache(self) -> int:
        return sum(1 for r in self.records if r.get("cached"))

    def truncated_share(self) -> float:
        return self.counts()["truncated"] / self.n if self.n else 0.0

    def reported_models(self) -> list[str]:
        return sorted({str(r["model"]) for r in self.records if r.get("model")})

    # -- gates -----------------------------------------------------------------

    def has_errors(self) -> bool:
        return self.counts()["error"] > 0

    def add_gate(
        self, name: str, passed: bool, detail: str, rule: str | None = None
    ) -> GateVerdict:
        """A verdict that compares no numbers (a refusal, a baseline that could not be used)."""
        return self.set_gate(GateVerdict(name, rule or name, passed, detail))

    def set_gate(self, verdict: GateVerdict) -> GateVerdict:
        """Add ``verdict``, replacing an earlier one of the same gate (in its place)."""
        if any(g.name == verdict.name for g in self.gates):
            self.gates = [verdict if g.name == verdict.name else g for g in self.gates]
        else:
            self.gates.append(verdict)
        return verdict

    def name_gates(self, config: str) -> None:
        """--gsm8k-config: every gate of a config's summary named after it (``Qwen3:min-acc``),
        so that the run's gates, in one list, stay apart."""
        self.gates = [
            g if g.name.startswith(f"{config}:") else replace(g, name=f"{config}:{g.name}")
            for g in self.gates
        ]

    def undecide_without_results(self, by: str, stopped_early: bool = False) -> None:
        """No gate passes unless every problem of its selection has a result.

        A threshold or a baseline holds for the problems it was set for; what a selection
        narrowed by -k, -m, --lf, --deselect or test ids left, or what ran around the items
        a marker or a conftest skipped (the very ones the model gets wrong, say) or the run
        never reached, is not a sample of them. What ran is still reported; a subset on
        purpose is ``--gsm8k-limit``, which every gate and baseline knows of. The problems
        an early stop left (``stopped_early``) are decided by its guarantee.
        ``by``: the options that may have deselected, as the command line spells them."""
        deselected = int(self.subset.get("deselected") or 0)
        missing = 0 if stopped_early else self.expected - self.n
        of = f"of the {self.expected + deselected} problems of its selection"
        said = []
        if deselected:
            said.append(f"{deselected} {of} were deselected ({by})")
        if missing > 0:
            stopped = "; the run was interrupted" if self.interrupted else ""
            said.append(f"{missing} {of} have no result (skipped, or not reached{stopped})")
        if said:
            why = (
                f"{' and '.join(said)}; a gate holds for the whole selection: run the whole "
                "selection (a subset on purpose: --gsm8k-limit)"
            )
            self.gates = [undecided(g, why) for g in self.gates]

    def earlier_answers(self) -> str:
        """How many answers came from earlier runs, as every output of a resumed run says."""
        return f"{self.from_cache()} of {self.n} answers from earlier runs (--gsm8k-resume)"

    def note_resumed(self) -> None:
        """--gsm8k-resume, once the gates are final: each gate (each config's, with its own
        count) says how many of the answers it rests on came from earlier runs, wherever a
        gate is shown (terminal, JSON, page, Markdown, JUnit)."""
        self.resumed = True
        for config in self.configs:
            config.note_resumed()
        if self.configs:
            self.gather_gates()
            return
        self.gates = [
            replace(g, detail=f"{g.detail}; {self.earlier_answers()}") for g in self.gates
        ]

    def gather_gates(self) -> None:
        """--gsm8k-config: the run's gates are every config's (after a config gained one)."""
        self.gates = [g for c in self.configs for g in c.gates]

    def gate_min_acc(self, min_acc: float) -> GateVerdict:
        return self.set_gate(self.gate_min_acc_by(MinAcc(min_acc)))

    def gate_min_acc_by(self, spec: MinAcc | ToleranceFloor, label: str = "") -> GateVerdict:
        """A floor's verdict on the headline's accuracy: every answer counts (repeats too)."""
        return spec.verdict(self.answers_correct, self.n, label or self.label, self.runs)

    def gate_share(self, spec: MaxShare) -> GateVerdict:
        """An answer-format health gate on the run's answers (with repeats: every answer)."""
        count = sum(self.answers(r).count(spec.outcome) for r in self.records)
        return self.set_gate(spec.verdict(count, self.n, self.runs))

    def chat_hint(self) -> str | None:
        """The one line suggesting ``--gsm8k-api chat`` (core/health.py), or None."""
        texts = (s["text"] for r in self.records for s in r["samples"])
        return chat_api_hint(
            str(self.protocol.get("api")),
            [self.model, *self.reported_models()],
            self.counts()["unparsed"],
            self.n,
            texts,
        )

    @property
    def failed(self) -> bool:
        return any(not g.passed for g in self.gates)

    # -- output ----------------------------------------------------------------

    def floor_gate(self) -> GateVerdict | None:
        """A config's vLLM floor gate (``<config>:vllm-threshold``), however it was decided
        (at the end, or by an early stop)."""
        return next((g for g in self.gates if g.name.endswith(":vllm-threshold")), None)

    def stopped_after(self) -> tuple[int, int] | None:
        """(problems, of) when the early stop ended this config before its last problem."""
        early: Any = self.extra.get("early_stop") or {}
        after, total = early.get("decided_after"), early.get("n_total")
        if isinstance(after, int) and isinstance(total, int) and after < total:
            return after, total
        return None

    def matrix_headline(self) -> str:
        passed = sum(1 for c in self.configs if not c.failed)
        only_vllm = all(g is c.floor_gate() for c in self.configs for g in c.gates)
        rule = (
            "accuracy >= accuracy_threshold - tolerance each"
            if only_vllm
            else "every gate of each config"
        )
        # a config deselected whole (-k, -m) gates nothing and is fine, but a CI log must show
        # that it never ran
        skipped = self.extra.get("not_run") or []
        not_run = f"; not run (deselected whole): {', '.join(skipped)}" if skipped else ""
        return f"gsm8k vLLM configs: {passed} of {len(self.configs)} pass ({rule}){not_run}"

    def verdict_table(self) -> list[str]:
        """One row per config: its model, n, accuracy, the floor it needed, its baseline
        gate's word (``none`` without one, ``written`` by --snapshot-update), with
        --gsm8k-early-stop after how many of its problems it stopped (``-``: it ran them
        all), the verdict."""
        early = any("early_stop" in c.extra for c in self.configs)
        head = ("config", "model", "n", "accuracy", "floor", "baseline")
        rows: list[list[str]] = [[*head, *(["stopped"] if early else []), "verdict"]]
        for c in self.configs:
            gate = c.floor_gate()
            floor = gate.threshold if gate is not None else None
            stopped = c.stopped_after()
            row = [
                str(c.extra.get("config", {}).get("name", c.label)),
                c.model,
                str(c.n),
                f"{c.accuracy:.4f}" if c.answered else "-",
                f"{floor:.4f}" if floor is not None else "-",
                c.baseline_word(),
            ]
            if early:
                row.append(f"{stopped[0]}/{stopped[1]}" if stopped else "-")
            rows.append([*row, "FAIL" if c.failed else "PASS"])
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        return [
            "  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]

    def baseline_word(self) -> str:
        """A config's baseline gate in one word, for the verdict table."""
        gate = next((g for g in self.gates if g.name.rpartition(":")[2] == "baseline"), None)
        if gate is not None:
            return gate.word
        base: Any = self.extra.get("baseline") or {}
        return "written" if base.get("written") else "none"

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
        if self.dataset.get("split") != "test":
            line += f"  [{self.dataset.get('split')} split: not a reportable number]"
        return line

    def lines(self) -> list[str]:
        """The terminal block: headline first, then the context a reader needs."""
        return [text for text, _ in self.styled_lines()]

    def styled_lines(self) -> list[tuple[str, str]]:
        """The terminal block with each line's kind: ``headline``, ``info``, ``pass``, ``fail``."""
        if self.configs:
            blocks: list[tuple[str, str]] = []
            for config in self.configs:
                blocks.extend(config.styled_lines())
            blocks.append((self.matrix_headline(), "headline"))
            blocks.extend((printable(line), "info") for line in self.verdict_table())
            return blocks
        counts = self.counts()
        rules = self.rule_accuracy()
        out = [self.headline()]
        out.append(
            "  outcomes: "
            + ", ".join(f"{v} {k}" for k, v in counts.items() if v or k in ("correct", "wrong"))
        )
        gated = self.protocol["extractor"]
        silent = self.silent_rules()
        shown_rules = {r: a for r, a in rules.items() if r == gated or r not in silent}
        if self.answered:  # with no answer every rule would read 0.0000
            out.append(
                "  by extractor: "
                + ", ".join(
                    f"{rule}{'*' if rule == gated else ''} {acc:.4f}"
                    for rule, acc in shown_rules.items()
                )
                + f"  (* gates; format failures: {self.format_failures()}"
                + (
                    f"; no number found by {', '.join(sorted(silent - {gated}))}"
                    if silent - {gated}
                    else ""
                )
                + ")"
            )
        pass_at = self.pass_at()
        if pass_at:
            out.append("  " + ", ".join(f"{k} {v:.4f}" for k, v in pass_at.items()))
        repeats = self.repeats()
        if repeats is not None:
            k = self.runs
            out.append(
                f"  repeats: {k} per problem ({repeats['answers']} answers): the accuracy above "
                f"and the gates are the mean over every answer (interval over problems); "
                f"maj@{k} (each problem's most common answer, what the outcomes count) "
                f"{cast(float, repeats['majority_accuracy']):.4f}"
            )
        reported = self.reported_models()
        shown = (
            f" (server reported: {', '.join(reported)})"
            if reported and reported != [self.model]
            else ""
        )
        out.append(f"  model: {self.model}{shown}  endpoint: {self.endpoint}")
        ds = self.dataset
        described = describe_subset(self.subset)
        subset = f"; {described}" if described else ""
        if self.subset.get("deselected"):
            subset += f"; {self.subset['deselected']} deselected (-k/-m/--lf)"
        out.append(
            f"  dataset: {ds['name']} {ds['config']}/{ds['split']} "
            f"(fingerprint {ds['fingerprint']}){subset}"
        )
        tokens = self.tokens()
        out.append(
            f"  tokens: prompt {tokens.get('prompt_tokens', 0):,}, completion "
            f"{tokens.get('completion_tokens', 0):,}; answers from cache: "
            f"{self.from_cache()} of {self.n}"
            + (" (earlier runs, read with --gsm8k-resume)" if self.resumed else "")
        )
        if self.truncated_share() > 0.01:
            out.append(
                f"  WARNING: {counts['truncated']} of {self.n} answers "
                f"({self.truncated_share():.1%}) were cut by --gsm8k-max-tokens "
                f"{self.protocol['max_tokens']}"
            )
        if self.n < self.expected:
            out.append(
                f"  INCOMPLETE: {self.n} of {self.expected} problems have a result"
                + (" (run interrupted)" if self.interrupted else "")
            )
        out.extend(self.notes)
        hint = self.chat_hint()
        if hint is not None:
            out.append("  " + hint)
        # model names, endpoints and messages come from outside: no escapes reach a terminal
        styled = [(printable(out[0]), "headline")]
        styled += [("  " + printable(line[2:]), "info") for line in out[1:]]
        for gate in self.gates:
            line = f"  gate {gate.name}: {gate.word}: {printable(gate.detail)}"
            styled.append((line, "pass" if gate.passed else "fail"))
        return styled

    def to_json(self) -> Report:
        records = sorted(self.records, key=lambda r: int(r["index"]))
        gates: list[GateRecord] = [g.to_json() for g in self.gates]
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
            "protocol": {**self.protocol, "label": self.label},
            "model": self.model,
            "reported_models": self.reported_models(),
            "endpoint": self.endpoint,
            "dataset": self.dataset,
            "subset": self.subset,
            "tokens": self.tokens(),
            "from_cache": self.from_cache(),
            "resumed": self.resumed,
            "gates": gates,
            **self.extra,
            "problems": records,
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
