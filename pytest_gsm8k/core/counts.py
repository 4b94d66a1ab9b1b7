"""A group's numbers, from its records alone (so the same with and without xdist). Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from pytest_gsm8k.core.health import chat_api_hint
from pytest_gsm8k.core.records import OUTCOMES, ProblemRecord
from pytest_gsm8k.core.scoring import RULES
from pytest_gsm8k.core.stats import accuracy_interval, pass_at_k

__all__ = ["Counts"]


class Counts:
    """The numbers of a group of records (``GroupVerdict``'s)."""

    records: tuple[ProblemRecord, ...]

    def protocol(self) -> Mapping[str, Any]:
        raise NotImplementedError

    @property
    def model(self) -> str:
        raise NotImplementedError

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
        """A record's answers' outcomes: its repeats, or its one outcome per answer of the run
        (an error is the whole item's)."""
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
        """Problems the model answered: with none, accuracy is undefined, not 0."""
        return self.n - self.counts()["error"]

    def interval(self) -> tuple[float, float]:
        """Wilson's interval; with repeats, at the effective number of problems."""
        k = self.runs
        rates = [
            int(r.get("repeats_correct") or 0) / k if k > 1 else float(bool(r["correct"]))
            for r in self.records
        ]
        return accuracy_interval(rates, k)

    def repeats(self) -> dict[str, object] | None:
        """With ``--gsm8k-repeats K``: K, the answers, the mean over every answer and maj@K."""
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

    def rule_accuracy(self) -> dict[str, float]:
        """Our rules, then any a preset adds (lm-eval's strict-match, flexible-extract)."""
        names = list(RULES)
        for record in self.records:
            names += [name for name in record["rules"] if name not in names]
        if not self.n:
            return dict.fromkeys(names, 0.0)
        return {
            rule: sum(1 for r in self.records if r["rules"].get(rule)) / self.n for rule in names
        }

    def silent_rules(self) -> set[str]:
        """Our extraction rules that found no number in any sample of the run."""
        found: set[str] = set()
        for record in self.records:
            for sample in record["samples"]:
                found.update(rule for rule, value in sample["extracted"].items() if value)
        return {rule for rule in RULES if rule not in found} if self.records else set()

    def format_failures(self) -> int:
        """Problems the gated extractor missed but another rule got right."""
        gated = self.protocol()["extractor"]
        return sum(
            1
            for r in self.records
            if not r["rules"].get(gated) and any(v for k, v in r["rules"].items() if k != gated)
        )

    def pass_at(self) -> dict[str, float]:
        """Unbiased pass@k (Chen et al. 2021) for k = 1 and the powers of two below N."""
        samples = int(self.protocol()["samples"])
        if not str(self.protocol()["name"]).startswith("pass@") or samples < 2:
            return {}
        scored = [r for r in self.records if r["outcome"] != "error"]
        ks = [1] + [2**i for i in range(1, samples.bit_length()) if 2**i < samples]
        ks.append(samples)
        out: dict[str, float] = {}
        for k in sorted(set(ks)):
            values = [pass_at_k(max(r["n_samples"], k), r["n_correct"], k) for r in scored]
            out[f"pass@{k}"] = sum(values) / len(self.records) if self.records else 0.0
        return out

    def tokens(self) -> dict[str, int]:  # summed over the records
        total: Counter[str] = Counter()
        for r in self.records:
            total.update(r.get("usage") or {})
        return dict(total)

    def from_cache(self) -> int:
        return sum(1 for r in self.records if r.get("cached"))

    def reported_models(self) -> list[str]:
        return sorted({str(r["model"]) for r in self.records if r.get("model")})

    def chat_hint(self) -> str | None:
        """The one line suggesting ``--gsm8k-api chat`` (core/health.py), or None."""
        texts = (s["text"] for r in self.records for s in r["samples"])
        return chat_api_hint(
            str(self.protocol().get("api")),
            [self.model, *self.reported_models()],
            self.counts()["unparsed"],
            self.n,
            texts,
        )

    def earlier_answers(self) -> str:
        """How many answers came from earlier runs, as every output of a resumed run says."""
        return f"{self.from_cache()} of {self.n} answers from earlier runs (--gsm8k-resume)"
