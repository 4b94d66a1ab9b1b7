"""Early stopping for the release gates (docs/early-stop.md says what each mode promises). Pure.

One :class:`EarlyStop` per group (:meth:`EarlyStop.for_group`); the problems run in its seeded
``order`` and each outcome goes to :meth:`EarlyStop.observe`, which returns a
:class:`Decision` once the gates are settled. ``certain`` asks each gate spec's own
``certain()`` (core/gates.py); ``sequential`` adds an anytime-valid test on the whole
selection's count (:class:`_WorTest`, whose docstring holds the proof).

The sequential statistics see only the contiguous prefix of the order that has arrived: a
fast wrong answer (an error) may overtake a slow right one, so the arrival order is not
independent of the outcomes. The noise-aware gate has exact bounds only (its p-value falls
with each failure: core/calibrated.py), checked every 1% of the shared problems; with
``--gsm8k-repeats`` on the candidate it is not monotone and waits for the end.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.calibrated import Pair, p_value
from pytest_gsm8k.core.gates import MaxShare, MinAcc, NoiseAware, ToleranceFloor, Verdict

if TYPE_CHECKING:
    from pytest_gsm8k.core.plan import GateSpecs

Mode = Literal["certain", "sequential"]

#: the name a vLLM config's floor (``ToleranceFloor``) has among the gates decided here
FLOOR = "vllm-threshold"

# The betting mixture (see _WorTest): offsets of the alternative mean from the null mean, in
# units of the gate's quantity, with prior weights; _VALUED_MIX for values in {0..K}. Chosen
# by simulation (benchmarks/bench_early_stop.py): weight on small offsets, where the run is
# long; the large ones decide a broken model in a few problems.
_BINARY_MIX = ((0.05, 2.0), (0.08, 3.0), (0.12, 3.0), (0.18, 2.0), (0.3, 1.0), (0.6, 1.0))
_VALUED_OFFSETS = (0.02, 0.03, 0.05, 0.08, 0.12, 0.2, 0.4)
_VALUED_MIX = tuple(zip(_VALUED_OFFSETS, (2.0, 3.0, 3.0, 2.0, 1.0, 1.0, 1.0), strict=True))
#: largest fraction of the capital any one bet may lose (keeps every factor >= 0.02)
_MAX_FRACTION = 0.98


def run_order(ids: Sequence[str], seed: int) -> list[str]:
    """The seeded run order: ids sorted by SHA-256 of ``"<seed>:<id>"`` (ties by id): a
    uniformly random permutation, independent of the outcomes, the same everywhere."""
    if len(set(ids)) != len(ids):
        raise ValueError("problem ids must be unique")
    return sorted(ids, key=lambda pid: (hashlib.sha256(f"{seed}:{pid}".encode()).digest(), pid))


class _WorTest:
    """One-sided anytime-valid test about the total of a finite population drawn without
    replacement (Waudby-Smith & Ramdas 2020, section 3).

    The population: ``size`` values in ``{0..scale}`` (``y = value / scale``), in a uniformly
    random order. Null: the total is ``<= null`` (``up``: we bet on large values) or
    ``>= null``. Before draw t, with ``S`` the total seen, the mean of the unseen values under
    the boundary null is ``mu_t = (null - S) / (scale (size - t + 1))`` = ``E[y_t | past]``.
    Each bet ``K_j = prod_t (1 + lam_jt (y_t - mu_t))`` (``mu_t - y_t`` when not ``up``), with
    ``lam_jt >= 0`` fixed before ``y_t``, is a nonnegative martingale under the null, and so
    is the mixture ``K = sum_j w_j K_j``; Ville's inequality gives ``P(sup_t K_t >= 1/alpha)
    <= alpha``: rejecting the first time ``K_t >= 1/alpha`` errs at most alpha, whenever the
    run stops.

    Bets: ``lam_jt = min(delta_j / v_t, 0.98 / mu_t)`` (``/ (1 - mu_t)`` when not ``up``), so
    every factor is >= 0.02. For 0/1 values ``v_t = mu_t (1 - mu_t)``: the Kelly bet against
    ``mu_t +- delta_j``, K_j the likelihood ratio (GRAPA is exact for binary data). Otherwise
    ``v_t`` is the smoothed empirical variance of the values seen, independent of the null.

    Composite null: each factor is nondecreasing in mu_t for every y (e.g. ``1 - (0.98/(1-mu))
    (y - mu)`` has derivative ``0.98 (1 - y) / (1 - mu)^2 >= 0``), and mu_t increases with the
    null total, so the capital at any total inside the null is pathwise at least the
    boundary's: rejecting the boundary rejects the whole null at level alpha, and the
    rejected totals form an interval (confidence bounds by bisection). When ``mu_t`` leaves
    (0, 1) the bet is skipped (``lam = 0``); a capital underflowing to 0 is only conservative.
    """

    def __init__(
        self, size: int, scale: int, null: int, up: bool, alpha: float, binary: bool
    ) -> None:
        self.size, self.scale, self.null, self.up, self.binary = size, scale, null, up, binary
        self.threshold = 1.0 / alpha
        mix = _BINARY_MIX if binary else _VALUED_MIX
        total_weight = sum(w for _, w in mix)
        # deltas in units of y (an accuracy offset of delta is delta/K in y units at scale K)
        self.mix = [d / scale for d, _ in mix]
        self.caps = [w / total_weight for _, w in mix]
        self.t = self.seen = self.seen_sq = 0
        self.rejected = False

    def update(self, value: int) -> bool:
        """Feed the next value (in the run order); True once the null is rejected."""
        if not self.rejected:
            num = self.null - self.seen
            den = self.scale * (self.size - self.t)
            if 0 < num < den:
                mu = num / den
                y = value / self.scale
                if self.binary:
                    var = mu * (1.0 - mu)
                else:
                    # smoothed variance: prior 1/4 (the largest on [0,1]) with weight 1
                    n = self.t
                    mean = self.seen / (self.scale * n) if n else 0.0
                    ss = self.seen_sq / (self.scale * self.scale) - n * mean * mean
                    var = max((0.25 + ss) / (1 + n), 1e-6)
                up = self.up
                dev = y - mu if up else mu - y
                limit = _MAX_FRACTION / mu if up else _MAX_FRACTION / (1.0 - mu)
                caps = self.caps
                capital = 0.0
                for j, delta in enumerate(self.mix):
                    caps[j] *= 1.0 + min(delta / var, limit) * dev
                    capital += caps[j]
                if capital >= self.threshold:
                    self.rejected = True
        self.t += 1
        self.seen += value
        self.seen_sq += value * value
        return self.rejected


#: the gate specs decided on a count (core/gates.py)
CountSpec = MinAcc | ToleranceFloor | MaxShare


@dataclass
class _CountGate:
    """A count rule: PASS iff the good answers X (correct; for a health gate, not of its
    outcome) of ``size`` problems of ``runs`` answers reach ``spec.need(size * runs)``.

    Sequential: FAIL when the test of "X >= need" rejects, PASS when that of "X <= need - 1"
    does, each at the gate's alpha. Whatever the true X, only one of the two early verdicts
    is wrong (at X = need the full run PASSes, the FAIL test's boundary), so no population
    is misjudged with probability above alpha and no correction for two directions is due.
    """

    spec: CountSpec
    size: int
    alpha: float
    runs: int
    sequential: bool
    good: int = 0
    seen: int = 0
    values: list[int] = field(default_factory=list)
    fail_test: _WorTest | None = None
    pass_test: _WorTest | None = None

    def __post_init__(self) -> None:
        self.need = need = self.spec.need(self.size * self.runs)
        if self.sequential and need > 0:  # a rule no count fails is no verdict, early or not
            size, runs, alpha = self.size, self.runs, self.alpha
            self.fail_test = _WorTest(size, runs, need, False, alpha, runs == 1)
            self.pass_test = _WorTest(size, runs, need - 1, True, alpha, runs == 1)

    def certain(self) -> Verdict | None:
        n, seen = self.size * self.runs, self.seen * self.runs
        if isinstance(self.spec, MaxShare):  # its rule counts the answers of its outcome
            return self.spec.certain(seen - self.good, seen, n)
        return self.spec.certain(self.good, seen, n)

    def add(self, good: int) -> Verdict | None:
        """Count one problem's good answers; the verdict if certain or sequentially decided."""
        self.good += good
        self.seen += 1
        verdict = self.certain()
        if self.fail_test is not None and self.pass_test is not None:
            self.values.append(good)
            failed, passed = self.fail_test.update(good), self.pass_test.update(good)
            verdict = verdict or ("FAIL" if failed else "PASS" if passed else None)
        return verdict

    def count_bounds(self) -> tuple[int, int]:
        """Exact range of the final count X."""
        return self.good, self.good + (self.size - self.seen) * self.runs

    def count_interval(self) -> tuple[int, int]:
        """Anytime-valid bounds on X inside the exact range: the totals the tests of "total
        >= X" and "total <= X" have not rejected, by replay and bisection (see _WorTest)."""
        low, high = self.count_bounds()
        if self.fail_test is None:
            return low, high

        def rejects(k: int, up: bool) -> bool:
            test = _WorTest(self.size, self.runs, k, up, self.alpha, self.runs == 1)
            return any(test.update(value) for value in self.values)

        def first(ok: Callable[[int], bool]) -> int:  # ok: False then True over [low, high]
            return low + bisect.bisect_left(range(low, high + 1), True, key=ok)

        top = max(first(lambda k: rejects(k, False)) - 1, low)
        return min(first(lambda k: not rejects(k, True)), top), top


@dataclass
class _NoiseAwareGate:
    """The noise-aware baseline gate, asked every ``every`` outcomes (and at the last).
    ``baseline``: shared problem id -> the baseline's (correct runs, runs)."""

    rule: NoiseAware
    baseline: dict[str, tuple[int, int]]
    repeats: int = 1
    every: int = 1
    now: dict[str, int] = field(default_factory=dict)
    since: int = 0

    def add(self, pid: str, correct: bool) -> Verdict | None:
        self.now[pid] = int(correct)
        self.since += 1
        if self.since < self.every and len(self.now) < len(self.baseline):
            return None
        self.since = 0
        return self.certain()

    def _split(self) -> tuple[list[Pair], list[tuple[str, int, int]]]:
        seen: list[Pair] = []
        unseen: list[tuple[str, int, int]] = []
        for pid, (correct, runs) in self.baseline.items():
            if pid in self.now:
                seen.append(Pair(pid, correct, runs, self.now[pid], 1))
            else:
                unseen.append((pid, correct, runs))
        return seen, unseen

    def certain(self) -> Verdict | None:
        if self.repeats > 1:
            return None
        seen, unseen = self._split()
        return self.rule.certain(seen, unseen)

    def p_range(self) -> tuple[float, float]:
        """The p-values reachable: every unseen problem failing, every one right."""
        seen, unseen = self._split()
        worst = [*seen, *(Pair(i, c, k, 0, 1) for i, c, k in unseen)]
        best = [*seen, *(Pair(i, c, k, 1, 1) for i, c, k in unseen)]
        return p_value(worst), p_value(best)


@dataclass(frozen=True)
class Decision:
    """The run may stop after ``after`` outcomes: each gate's verdict (None: not settled,
    which happens only beside another gate's FAIL) and per settled gate how ("certain" or
    "sequential")."""

    after: int
    verdicts: dict[str, Verdict | None]
    how: dict[str, str]


class EarlyStop:
    """Decide one group's gates as early as allowed (:meth:`for_group`).

    ``gates``: the group's specs in the order shown; ``NoiseAware`` reads ``baseline``
    (problem id -> the baseline's (correct runs, runs); only ids in ``ids`` count).
    ``order`` replaces the seeded order (simulations). ``alpha``: the sequential mode's
    bound for the group, split evenly over the count gates (Bonferroni). ``repeats``: the
    candidate's answers per problem. The group stops once every verdict is settled or any
    gate FAILs.
    """

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
        order: Sequence[str] | None = None,
    ) -> None:
        if mode not in ("certain", "sequential"):
            raise ValueError(f"mode must be 'certain' or 'sequential', got {mode!r}")
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {alpha}")
        if not ids:
            raise ValueError("no problems")
        if not gates:
            raise ValueError("no gate to decide (need min-acc, a floor, a baseline or health)")
        self.mode: Mode = mode
        self.alpha = alpha
        self.seed = seed
        self.n_total = len(ids)
        if order is None:
            self.order = run_order(ids, seed)
        else:
            self.order = list(order)
            if sorted(self.order) != sorted(ids) or len(set(self.order)) != len(self.order):
                raise ValueError("order must be a permutation of ids")
        self._position = {pid: i for i, pid in enumerate(self.order)}
        self._arrived: dict[int, tuple[bool, str | None, tuple[str, ...]]] = {}
        self.repeats = repeats
        self._next = 0  # next position of the order to feed (sequential)
        self.observed = 0
        self.decision: Decision | None = None
        self._verdicts: dict[str, Verdict | None] = {}
        self._how: dict[str, str] = {}
        self._counts: dict[str, _CountGate] = {}
        self._noise: _NoiseAwareGate | None = None
        self.gate_alpha = alpha / max(sum(not isinstance(g, NoiseAware) for g in gates), 1)
        for spec in gates:
            name = FLOOR if isinstance(spec, ToleranceFloor) else spec.name
            if name in self._verdicts:
                raise ValueError(f"gate {name} given twice")
            self._verdicts[name] = None
            if isinstance(spec, NoiseAware):
                given = baseline or {}
                shared = {pid: given[pid] for pid in self.order if pid in given}
                if not shared:
                    raise ValueError("no problem id in common with the baseline")
                every = max(1, math.ceil(len(shared) / 100))
                self._noise = _NoiseAwareGate(spec, shared, repeats=repeats, every=every)
                continue
            sequential = mode == "sequential"
            self._counts[name] = _CountGate(
                spec, self.n_total, self.gate_alpha, repeats, sequential
            )
        self._health = any(isinstance(g.spec, MaxShare) for g in self._counts.values())
        # Some verdicts are fixed before any outcome (min-acc above 1); a gate that cannot
        # fail is never settled (its spec's certain() never says PASS).
        for name, gate in self._counts.items():
            self._record(name, gate.certain(), "certain")
        if self._noise is not None:
            self._record("baseline", self._noise.certain(), "certain")
        self._check_done()

    @classmethod
    def for_group(
        cls,
        ids: Sequence[str],
        specs: GateSpecs,
        *,
        mode: Mode,
        floor: ToleranceFloor | None = None,
        baseline: Mapping[str, Any] | None = None,
        seed: int = 0,
        alpha: float = 0.05,
        repeats: int = 1,
    ) -> EarlyStop | None:
        """The group's early stop (None: nothing to decide). ``baseline``: the checked
        stored problems; the noise-aware gate takes part when it shares a problem with
        ``ids``, and with ``--gsm8k-require-baseline`` only when it holds them all (the end
        of the run fails it otherwise, whatever the shared ones say)."""
        runs = {str(pid): bl.runs(value) for pid, value in (baseline or {}).items()}
        shared = len(set(runs) & set(ids))
        compared = shared > 0 and not (specs.require_baseline and shared < len(ids))
        gates = [
            *(spec for spec in (specs.min_acc, floor) if spec is not None),
            *((specs.baseline,) if compared else ()),
            *specs.health,
        ]
        if not ids or not gates:
            return None
        return cls(ids, gates, mode=mode, seed=seed, alpha=alpha, baseline=runs, repeats=repeats)

    def _record(self, name: str, verdict: Verdict | None, how: str) -> None:
        if verdict is not None and self._verdicts[name] is None:
            self._verdicts[name] = verdict
            self._how[name] = how

    def _check_done(self) -> None:
        values = self._verdicts.values()
        if "FAIL" in values or all(v is not None for v in values):
            self.decision = Decision(self.observed, dict(self._verdicts), dict(self._how))

    def observe(
        self,
        problem_id: str,
        correct: bool,
        outcome: str | None = None,
        answers: Sequence[str] = (),
    ) -> Decision | None:
        """Record one problem's outcome (any arrival order); the Decision once the run may
        stop. ``outcome`` is needed by the health gates only; ``answers``: with ``repeats``
        above 1, the outcome of each answer (none: ``outcome`` for each, as for an error).
        KeyError for an id not in the run, ValueError for one seen twice."""
        position = self._position[problem_id]
        if position in self._arrived or position < self._next:
            raise ValueError(f"outcome for {problem_id!r} observed twice")
        if self._health and outcome is None:
            raise ValueError(f"outcome for {problem_id!r} needed by the health gates")
        if self.decision is not None:
            return self.decision
        self._arrived[position] = (correct, outcome, tuple(answers))
        if self.mode == "certain":
            self._feed(problem_id, correct, outcome, answers)
            return self.decision
        while self._next in self._arrived and self.decision is None:
            ok, kind, given = self._arrived.pop(self._next)
            pid = self.order[self._next]
            self._next += 1
            self._feed(pid, ok, kind, given)
        return self.decision

    def _feed(
        self, pid: str, correct: bool, outcome: str | None = None, answers: Sequence[str] = ()
    ) -> None:
        self.observed += 1
        how = "certain" if self.mode == "certain" else "sequential"
        runs = self.repeats
        answers = list(answers or ()) or [outcome or ("correct" if correct else "wrong")] * runs
        for name, gate in self._counts.items():
            spec = gate.spec
            if isinstance(spec, MaxShare):  # good: the answers not of its outcome
                good = runs - answers.count(spec.outcome) if runs > 1 else outcome != spec.outcome
            else:
                good = answers.count("correct") if runs > 1 else correct
            verdict = gate.add(int(good))
            self._record(name, verdict, "certain" if gate.certain() else how)
        if self._noise is not None and pid in self._noise.baseline:
            self._record("baseline", self._noise.add(pid, correct), "certain")
        self._check_done()

    def _gate_json(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = {"verdict": self._verdicts[name], "how": self._how.get(name)}
        gate = self._counts.get(name)
        if gate is not None:
            spec = gate.spec
            n = gate.size * gate.runs
            low, high = gate.count_bounds()
            lo, hi = gate.count_interval()
            if isinstance(spec, MaxShare):
                # the gate counts the answers NOT of the outcome: its bounds turned around
                low, high, lo, hi = n - high, n - low, n - hi, n - lo
                out.update(rule=name, threshold=spec.rate, allowed=spec.allowed(n))
                out.update(observed=gate.seen, count=gate.seen * gate.runs - gate.good)
            else:
                threshold = spec.floor if isinstance(spec, ToleranceFloor) else spec.threshold
                out.update(threshold=threshold, observed=gate.seen, correct=gate.good)
            out["bounds"] = [low / n, high / n]
            if gate.fail_test is not None:
                out["interval"] = [lo / n, hi / n]
        elif self._noise is not None:
            noise = self._noise
            out.update(rule="noise-aware", alpha=noise.rule.alpha, observed=len(noise.now))
            if noise.repeats == 1:
                out["p_bounds"] = list(noise.p_range())
        return out

    def to_json(self) -> dict[str, Any]:
        """The early-stopping record for the JSON report (bounds are exact; intervals, CS)."""
        return {
            "mode": self.mode,
            "alpha": self.alpha if self.mode == "sequential" else None,
            "gate_alpha": self.gate_alpha if self.mode == "sequential" else None,
            "seed": self.seed,
            "n_total": self.n_total,
            "observed": self.observed,
            "decided_after": self.decision.after if self.decision else None,
            "verdicts": dict(self._verdicts),
            "gates": {name: self._gate_json(name) for name in self._verdicts},
        }

    def _gate_phrase(self, name: str) -> str:
        verdict = self._verdicts[name]
        info = self._gate_json(name)
        gate = self._counts.get(name)
        if gate is None:  # the noise-aware baseline gate
            if "p_bounds" not in info:
                return "baseline waits for the end of the run (--gsm8k-repeats on the candidate)"
            lo_p, hi_p = info["p_bounds"]
            state = "undecided" if verdict is None else f"verdict {verdict} is certain"
            return f"baseline {state} (noise-aware p reachable {lo_p:.4g}-{hi_p:.4g})"
        spec = gate.spec
        what = f"{spec.outcome} share" if isinstance(spec, MaxShare) else "accuracy"
        low, high = info["bounds"]
        if verdict is None:
            return f"{name} undecided ({what} reachable {low:.4f}-{high:.4f})"
        if info["how"] == "certain":
            reach = f"at most {high:.4f} reachable"
            if isinstance(spec, MaxShare) and verdict == "FAIL":
                reach = f"{info['count']} {spec.outcome} already, {info['allowed']} allowed"
            elif not isinstance(spec, MaxShare) and verdict == "PASS":
                reach = f"at least {low:.4f} already"
            return f"{name} verdict {verdict} is certain ({reach})"
        lo, hi = info["interval"]
        return (
            f"{name} verdict {verdict} at alpha {self.gate_alpha:g} ({what} of the full split "
            f"in [{lo:.4f}, {hi:.4f}])"
        )

    def headline(self) -> str:
        """One line for the terminal, e.g. "stopped after 212 of 1319 problems: ..."."""
        phrases = "; ".join(
            self._gate_phrase(name)
            for name in self._verdicts
            if self.decision is None or self._verdicts[name] is not None
        )
        if self.decision is None:
            return f"not stopped early ({self.observed} of {self.n_total} problems): {phrases}"
        return f"stopped after {self.decision.after} of {self.n_total} problems: {phrases}"
