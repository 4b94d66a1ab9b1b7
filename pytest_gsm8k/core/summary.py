"""Aggregation of outcome records into the headline, the gates and the JSON report. Pure.

Runs once, on the controller (or the only process), after the test loop,
from the records that arrived in the reports: the same numbers with and
without xdist, because the inputs are the same records.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pytest_gsm8k.core.outcome import OUTCOMES
from pytest_gsm8k.core.scoring import RULES
from pytest_gsm8k.core.scrub import printable
from pytest_gsm8k.core.stats import pass_at_k, wilson_interval

REPORT_SCHEMA = 1


@dataclass
class Gate:
    name: str
    passed: bool
    detail: str


@dataclass
class Summary:
    protocol: dict[str, Any]
    label: str
    dataset: dict[str, Any]
    subset: dict[str, Any]
    model: str
    endpoint: str
    records: list[dict[str, Any]]
    expected: int
    gates: list[Gate] = field(default_factory=list)
    interrupted: bool = False
    #: extra terminal lines (baseline comparison), printed before the gates
    notes: list[str] = field(default_factory=list)
    #: extra top-level JSON report fields (baseline comparison)
    extra: dict[str, Any] = field(default_factory=dict)

    # -- derived numbers -----------------------------------------------------

    @property
    def n(self) -> int:
        return len(self.records)

    @property
    def correct(self) -> int:
        return sum(1 for r in self.records if r["correct"])

    @property
    def accuracy(self) -> float:
        return self.correct / self.n if self.n else 0.0

    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.correct, self.n)

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

    def add_gate(self, name: str, passed: bool, detail: str) -> Gate:
        gate = Gate(name, passed, detail)
        self.gates.append(gate)
        return gate

    def gate_min_acc(self, min_acc: float) -> Gate:
        passed = self.accuracy >= min_acc
        detail = (
            f"accuracy {self.accuracy:.4f} ({self.label}, n={self.n}) "
            f"{'>=' if passed else 'is below'} --gsm8k-min-acc {min_acc:g}"
        )
        gate = Gate("min-acc", passed, detail)
        self.gates.append(gate)
        return gate

    @property
    def failed(self) -> bool:
        return any(not g.passed for g in self.gates)

    # -- output ----------------------------------------------------------------

    def headline(self) -> str:
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
        counts = self.counts()
        rules = self.rule_accuracy()
        out = [self.headline()]
        out.append(
            "  outcomes: "
            + ", ".join(f"{v} {k}" for k, v in counts.items() if v or k in ("correct", "wrong"))
        )
        gated = self.protocol["extractor"]
        out.append(
            "  by extractor: "
            + ", ".join(
                f"{rule}{'*' if rule == gated else ''} {acc:.4f}" for rule, acc in rules.items()
            )
            + f"  (* gates; format failures: {self.format_failures()})"
        )
        pass_at = self.pass_at()
        if pass_at:
            out.append("  " + ", ".join(f"{k} {v:.4f}" for k, v in pass_at.items()))
        reported = self.reported_models()
        shown = (
            f" (server reported: {', '.join(reported)})"
            if reported and reported != [self.model]
            else ""
        )
        out.append(f"  model: {self.model}{shown}  endpoint: {self.endpoint}")
        ds = self.dataset
        subset = ""
        if self.subset.get("limit") is not None:
            subset = (
                f"; seeded subset of {self.subset['of']} (limit {self.subset['limit']}, "
                f"seed {self.subset['seed']})"
            )
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
        for gate in self.gates:
            out.append(f"  gate {gate.name}: {'PASS' if gate.passed else 'FAIL'}: {gate.detail}")
        # model names, endpoints and messages come from outside: no escapes reach a terminal
        return [out[0], *("  " + printable(line[2:]) for line in out[1:])]

    def to_json(self) -> dict[str, Any]:
        records = sorted(self.records, key=lambda r: int(r["index"]))
        return {
            "schema": REPORT_SCHEMA,
            "headline": self.headline(),
            "accuracy": self.accuracy,
            "correct": self.correct,
            "n": self.n,
            "expected": self.expected,
            "complete": self.n == self.expected and not self.interrupted,
            "ci95": list(self.interval()),
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
            "gates": [{"name": g.name, "passed": g.passed, "detail": g.detail} for g in self.gates],
            **self.extra,
            "problems": records,
        }
