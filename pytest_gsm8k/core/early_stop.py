"""Early stopping for the release gates (each mode's promise and the sequential test's proof:
docs/early-stop.md). Pure."""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, cast

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.calibrated import Pair, evidence
from pytest_gsm8k.core.gates import (
    MaxShare,
    MinAcc,
    NoiseAware,
    ToleranceFloor,
    Verdict,
    count_certain,
    extremes,
)

if TYPE_CHECKING:
    from pytest_gsm8k.core.plan import PlanGroup, RunPlan

Mode = Literal["certain", "sequential"]

#: the name a vLLM config's floor (``ToleranceFloor``) has among the gates decided here
FLOOR = "vllm-threshold"

# The betting mixture (_WorTest): (offset of the alternative mean, prior weight), chosen by
# simulation (benchmarks/bench_early_stop.py); _VALUED_MIX for values in {0..K}
_BINARY_MIX = ((0.05, 2.0), (0.08, 3.0), (0.12, 3.0), (0.18, 2.0), (0.3, 1.0), (0.6, 1.0))
_VALUED_MIX = tuple(
    zip((0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.4), (2.0, 3.0, 3.0, 2.0, 1.0, 1.0, 1.0), strict=True)
)
#: largest fraction of the capital any one bet may lose (keeps every factor >= 0.02)
_MAX_FRACTION = 0.98


def run_order(ids: Sequence[str], seed: int) -> list[str]:
    """A seeded permutation, independent of the outcomes, the same in every process."""
    if len(set(ids)) != len(ids):
        raise ValueError("problem ids must be unique")
    return sorted(ids, key=lambda pid: (hashlib.sha256(f"{seed}:{pid}".encode()).digest(), pid))


class _WorTest:
    """One-sided anytime-valid test about the total of ``size`` values in ``{0..scale}``
    drawn without replacement (Waudby-Smith & Ramdas 2020): null "total <= null" (``up``)
    or ">= null". The construction and its proof: docs/early-stop.md#the-sequential-test."""

    def __init__(self, size: int, scale: int, null: int, up: bool, alpha: float) -> None:
        self.size, self.scale, self.null, self.up, self.threshold = size, scale, null, up, 1 / alpha
        mix = _BINARY_MIX if scale == 1 else _VALUED_MIX
        self.mix = [d / scale for d, _ in mix]  # in units of y = value / scale
        self.caps = [w / sum(w for _, w in mix) for _, w in mix]
        self.t = self.seen = self.seen_sq = 0
        self.rejected = False

    def update(self, value: int) -> bool:
        num, den = self.null - self.seen, self.scale * (self.size - self.t)
        if not self.rejected and 0 < num < den:
            mu, y = num / den, value / self.scale
            if self.scale == 1:
                var = mu * (1.0 - mu)
            else:  # smoothed variance: prior 1/4 (the largest on [0,1]) with weight 1
                n = self.t
                mean = self.seen / (self.scale * n) if n else 0.0
                ss = self.seen_sq / (self.scale * self.scale) - n * mean * mean
                var = max((0.25 + ss) / (1 + n), 1e-6)
            dev = y - mu if self.up else mu - y
            limit = _MAX_FRACTION / (mu if self.up else 1.0 - mu)
            for j, delta in enumerate(self.mix):
                self.caps[j] *= 1.0 + min(delta / var, limit) * dev
            self.rejected = sum(self.caps) >= self.threshold
        self.t += 1
        self.seen += value
        self.seen_sq += value * value
        return self.rejected


CountSpec = MinAcc | ToleranceFloor | MaxShare


@dataclass
class _CountGate:
    """A count rule. Sequential: FAIL when the test of "X >= need" rejects, PASS when that of
    "X <= need - 1" does, each at alpha (only one can be wrong: no correction for two)."""

    spec: CountSpec
    size: int
    alpha: float
    runs: int
    sequential: bool
    good: int = 0
    seen: int = 0
    values: list[int] = field(default_factory=list)
    tests: tuple[_WorTest, _WorTest] | None = None

    def __post_init__(self) -> None:
        self.need = self.spec.need(self.size * self.runs)
        if self.sequential and self.need > 0:  # a rule no count fails is no verdict
            self.tests = (self._test(self.need, False), self._test(self.need - 1, True))

    def _test(self, null: int, up: bool) -> _WorTest:
        return _WorTest(self.size, self.runs, null, up, self.alpha)

    def certain(self) -> Verdict | None:
        return count_certain(self.good, self.seen * self.runs, self.size * self.runs, self.need)

    def add(self, good: int) -> tuple[Verdict | None, str]:
        self.good, self.seen = self.good + good, self.seen + 1
        verdict = self.certain()
        if self.tests is not None:
            self.values.append(good)
            failed, passed = (test.update(good) for test in self.tests)
            if verdict is None:
                return ("FAIL" if failed else "PASS" if passed else None), "sequential"
        return verdict, "certain"

    def bounds(self) -> tuple[int, int]:
        return self.good, self.good + (self.size - self.seen) * self.runs

    def interval(self) -> tuple[int, int]:
        """The totals neither test rejects (an interval), by replay and bisection."""
        low, high = self.bounds()
        if self.tests is None:
            return low, high

        def first(up: bool, rejected: bool) -> int:  # the first total whose test says so
            def rejects(k: int) -> bool:
                test = self._test(k, up)
                return any(test.update(value) for value in self.values) is rejected

            return low + bisect.bisect_left(range(low, high + 1), True, key=rejects)

        top = max(first(False, True) - 1, low)
        return min(first(True, False), top), top


@dataclass(frozen=True)
class Decision:
    """The run may stop after ``after`` outcomes: each gate's verdict (None: not settled)."""

    after: int
    verdicts: dict[str, Verdict | None]


class EarlyStop:
    """Decide one group's gates as early as allowed (:meth:`for_group` gives it gates to decide,
    each once, a baseline only where it shares a problem). ``baseline``: id -> (correct runs,
    runs); ``alpha`` is split over the count gates."""

    def __init__(
        self,
        ids: Sequence[str],
        gates: Sequence[CountSpec | NoiseAware],
        *,
        mode: Mode,
        seed: int = 0,
        alpha: float = 0.05,
        baseline: Mapping[str, tuple[int, int]] | None = None,
        repeats: int = 1,
    ) -> None:
        self.order = run_order(ids, seed)
        self.mode, self.alpha, self.seed, self.repeats = mode, alpha, seed, repeats
        self.n_total, self.observed, baseline = len(ids), 0, baseline or {}
        self.decision: Decision | None = None
        self._position = {pid: i for i, pid in enumerate(self.order)}
        self._arrived: dict[int, tuple[str, tuple[str, ...]]] = {}
        self._next = 0  # next position of the order to feed (sequential)
        self._verdicts: dict[str, Verdict | None] = {}
        self._how: dict[str, str] = {}
        self._counts: dict[str, _CountGate] = {}
        self._noise: NoiseAware | None = None
        self._base: dict[str, tuple[int, int]] = {}  # the shared problems' baseline
        self._now: dict[str, int] = {}  # the shared problems' candidate outcomes
        self._every = self._since = 0  # the baseline gate is asked every 1% of its problems
        self.gate_alpha = alpha / max(sum(not isinstance(g, NoiseAware) for g in gates), 1)
        for spec in gates:
            name = FLOOR if isinstance(spec, ToleranceFloor) else spec.name
            self._verdicts[name] = None
            if isinstance(spec, NoiseAware):
                self._base = {pid: baseline[pid] for pid in self.order if pid in baseline}
                self._noise, self._every = spec, max(1, math.ceil(len(self._base) / 100))
            else:
                gate = _CountGate(spec, len(ids), self.gate_alpha, repeats, mode == "sequential")
                self._counts[name] = gate
                self._record(name, gate.certain(), "certain")  # min-acc above 1: fixed already
        self._record("baseline", self._noise_certain(), "certain")
        self._check_done()

    @classmethod
    def for_group(
        cls, ids: Sequence[str], plan: RunPlan, group: PlanGroup, baseline: Mapping[str, Any] | None
    ) -> EarlyStop | None:
        """The early stop of ``group``'s problems ``ids`` (None: nothing to decide). The baseline
        gate takes part when it shares a problem, with --gsm8k-require-baseline only when it
        holds them all."""
        specs, settings = plan.gates, plan.settings
        runs = {str(pid): bl.runs(value) for pid, value in (baseline or {}).items()}
        shared = len(set(runs) & set(ids))
        compared = shared > 0 and not (specs.require_baseline and shared < len(ids))
        wanted = (specs.min_acc, group.floor, specs.baseline if compared else None, *specs.health)
        gates = [gate for gate in wanted if gate is not None]
        if not ids or not gates:
            return None
        mode = cast(Mode, settings.early_stop)  # settings' choices: certain or sequential
        seed = group.subset["seed"] or 0  # a config's: none (the certain bounds decide it)
        alpha, repeats = settings.early_stop_alpha, settings.repeats
        return cls(ids, gates, mode=mode, seed=seed, alpha=alpha, baseline=runs, repeats=repeats)

    def _split(self) -> tuple[list[Pair], list[tuple[str, int, int]]]:
        now, base = self._now, self._base.items()
        seen = [Pair(i, c, k, now[i], 1) for i, (c, k) in base if i in now]
        return seen, [(i, c, k) for i, (c, k) in base if i not in now]

    def _noise_certain(self) -> Verdict | None:
        if self._noise is None or self.repeats > 1:  # with repeats p is not monotone: the end
            return None
        return self._noise.certain(*self._split())

    def _record(self, name: str, verdict: Verdict | None, how: str) -> None:
        if verdict is not None and self._verdicts[name] is None:
            self._verdicts[name] = verdict
            self._how[name] = how

    def _check_done(self) -> None:
        values = self._verdicts.values()
        if "FAIL" in values or all(v is not None for v in values):
            self.decision = Decision(self.observed, dict(self._verdicts))

    @property
    def arrived(self) -> int:
        """Outcomes observed, fed or waiting for the seeded order's earlier ones to arrive."""
        return self._next + len(self._arrived)

    def observe(self, pid: str, outcome: str, answers: Sequence[str] = ()) -> Decision | None:
        """One problem's outcome (with repeats each answer's), in any order; the Decision."""
        position = self._position[pid]
        if self.decision is not None:
            return self.decision
        self._arrived[position] = (outcome, tuple(answers))
        if self.mode == "certain":
            self._feed(pid, outcome, answers)
            return self.decision
        while self._next in self._arrived and self.decision is None:
            self._feed(self.order[self._next], *self._arrived.pop(self._next))
            self._next += 1
        return self.decision

    def _feed(self, pid: str, outcome: str, answers: Sequence[str]) -> None:
        self.observed += 1
        answers = list(answers) or [outcome] * self.repeats  # one run: [outcome]
        for name, gate in self._counts.items():
            spec = gate.spec
            if isinstance(spec, MaxShare):  # good: the answers not of its outcome
                good = self.repeats - answers.count(spec.outcome)
            else:
                good = answers.count("correct")
            self._record(name, *gate.add(good))
        if pid in self._base:
            self._now[pid] = int(outcome == "correct")
            self._since += 1
            if self._since >= self._every or len(self._now) == len(self._base):
                self._since = 0
                self._record("baseline", self._noise_certain(), "certain")
        self._check_done()

    def _gate_json(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {"verdict": self._verdicts[name], "how": self._how.get(name)}
        gate = self._counts.get(name)
        if gate is None:  # the noise-aware baseline gate
            assert self._noise is not None
            out.update(rule="noise-aware", alpha=self._noise.alpha, observed=len(self._now))
            if self.repeats == 1:
                out["p_bounds"] = [evidence(pairs).p for pairs in extremes(*self._split())]
            return out
        spec, n = gate.spec, gate.size * gate.runs
        (low, high), (lo, hi) = gate.bounds(), gate.interval()
        out["observed"] = gate.seen
        if isinstance(spec, MaxShare):  # it counts the answers NOT of the outcome: turned round
            low, high, lo, hi = n - high, n - low, n - hi, n - lo
            out.update(rule=name, threshold=spec.rate, allowed=spec.allowed(n))
            out["count"] = gate.seen * gate.runs - gate.good
        else:
            out.update(threshold=spec.floor, correct=gate.good)
        out["bounds"] = [low / n, high / n]
        if gate.tests is not None:
            out["interval"] = [lo / n, hi / n]
        return out

    def to_json(self) -> dict[str, Any]:
        sequential = self.mode == "sequential"
        return {
            "mode": self.mode,
            "alpha": self.alpha if sequential else None,
            "gate_alpha": self.gate_alpha if sequential else None,
            "seed": self.seed,
            "n_total": self.n_total,
            "observed": self.observed,
            "decided_after": self.decision.after if self.decision else None,
            "verdicts": dict(self._verdicts),
            "gates": {name: self._gate_json(name) for name in self._verdicts},
        }

    def _gate_phrase(self, name: str) -> str:
        verdict, info, gate = self._verdicts[name], self._gate_json(name), self._counts.get(name)
        state = "undecided" if verdict is None else f"verdict {verdict} is certain"
        if gate is None:  # the noise-aware baseline gate
            if "p_bounds" not in info:
                return "baseline waits for the end of the run (--gsm8k-repeats on the candidate)"
            low, high = info["p_bounds"]
            return f"baseline {state} (noise-aware p reachable {low:.4g}-{high:.4g})"
        outcome = gate.spec.outcome if isinstance(gate.spec, MaxShare) else ""
        what, (low, high) = f"{outcome} share" if outcome else "accuracy", info["bounds"]
        why = f"at most {high:.4f} reachable"
        if verdict is None:
            why = f"{what} reachable {low:.4f}-{high:.4f}"
        elif info["how"] == "sequential":
            state = f"verdict {verdict} at alpha {self.gate_alpha:g}"
            why = "{} of the full split in [{:.4f}, {:.4f}]".format(what, *info["interval"])
        elif outcome and verdict == "FAIL":
            why = f"{info['count']} {outcome} already, {info['allowed']} allowed"
        elif not outcome and verdict == "PASS":
            why = f"at least {low:.4f} already"
        return f"{name} {state} ({why})"

    def headline(self, stopped: bool = True) -> str:
        """The stop's line; ``stopped``: the run stopped on the decision (else it was decided)."""
        done = self.decision  # once decided, the gates it settled
        phrases = "; ".join(
            self._gate_phrase(n) for n, v in self._verdicts.items() if not done or v
        )
        if done is None:
            return f"not stopped early ({self.observed} of {self.n_total} problems): {phrases}"
        verb = "stopped" if stopped else "decided"
        return f"{verb} after {done.after} of {self.n_total} problems: {phrases}"
