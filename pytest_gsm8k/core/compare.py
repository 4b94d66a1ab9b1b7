"""Two runs compared problem by problem, from their JSON reports. Pure.

``python -m pytest_gsm8k compare A.json B.json`` answers the release gate's question for
two runs that already happened (two models, two releases, two serving stacks): is B worse
than A? The answer is paired, as against a baseline: only the problem ids both reports
hold count, the difference in accuracy comes with Newcombe's interval, and "B is worse"
is the baseline gate's own rule (:class:`~pytest_gsm8k.core.gates.NoiseAware`, at
``--alpha``): the exact one-sided McNemar test on the problems that flipped when each report
ran every problem once, the noise-aware test when a report holds ``--gsm8k-repeats`` runs.

Two reports of different protocols or datasets are refused with the first field that
differs (:func:`pytest_gsm8k.core.baseline.first_difference`, the baseline's own rule).
A problem that ended in an error in either report is no measurement of the model: it is
left out of the pairing and counted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pytest_gsm8k.core import calibrated, jsondepth
from pytest_gsm8k.core.baseline import first_difference
from pytest_gsm8k.core.calibrated import Pair
from pytest_gsm8k.core.gates import GateVerdict, NoiseAware
from pytest_gsm8k.core.markdown import cell_code, gate_table, problem_list
from pytest_gsm8k.core.records import OUTCOMES, REPORT_SCHEMA
from pytest_gsm8k.core.scrub import md_text

__all__ = ["CompareError", "Comparison", "Side", "compare", "load_report", "markdown", "pairing"]


class CompareError(Exception):
    """Two reports that cannot be compared, or a file that is not a report: one line
    naming the file and the reason."""


def load_report(text: str | bytes, where: str) -> dict[str, Any]:
    """A JSON report (``--gsm8k-report``) from its text, checked for what a comparison
    reads: the protocol, the dataset, and each problem's id, outcome and correctness.

    Raises :class:`CompareError` naming ``where``.
    """
    try:
        data = jsondepth.loads(text)
    except json.JSONDecodeError as exc:
        raise CompareError(f"{where}: not JSON (line {exc.lineno}: {exc.msg})") from None
    except (jsondepth.TooDeep, UnicodeDecodeError) as exc:
        raise CompareError(f"{where}: not a JSON report ({exc})") from None
    if not isinstance(data, dict) or "schema" not in data or "problems" not in data:
        raise CompareError(f"{where}: not a pytest-gsm8k JSON report (written by --gsm8k-report)")
    if data["schema"] != REPORT_SCHEMA:
        raise CompareError(
            f"{where}: JSON report schema {data['schema']!r}; this version reads "
            f"schema {REPORT_SCHEMA}"
        )
    for key in ("protocol", "dataset"):
        if not isinstance(data.get(key), dict):
            raise CompareError(f"{where}: corrupt JSON report (no '{key}')")
    problems = data["problems"]
    if not isinstance(problems, list):
        raise CompareError(f"{where}: corrupt JSON report ('problems' is not a list)")
    seen: set[str] = set()
    for number, record in enumerate(problems):
        pid = record.get("id") if isinstance(record, dict) else None
        if not isinstance(pid, str) or not isinstance(record, dict):
            raise CompareError(f"{where}: corrupt JSON report (problem #{number} has no id)")
        if pid in seen:
            raise CompareError(f"{where}: corrupt JSON report (problem {pid} appears twice)")
        seen.add(pid)
        outcome, correct = record.get("outcome"), record.get("correct")
        if outcome not in OUTCOMES or not isinstance(correct, bool):
            raise CompareError(
                f"{where}: corrupt JSON report (problem {pid}: outcome {outcome!r}, "
                f"correct {correct!r})"
            )
    return data


@dataclass(frozen=True)
class Side:
    """One of the two reports, as the comparison names it."""

    #: ``A`` or ``B``
    name: str
    #: the file as given
    where: str
    model: str
    #: problems the report holds
    n: int
    #: accuracy over the paired problems
    accuracy: float
    #: the run finished its whole selection (not interrupted, nothing missing)
    complete: bool


@dataclass(frozen=True)
class Comparison:
    """The paired comparison of B with A and the verdict "B is not worse"."""

    label: str
    a: Side
    b: Side
    #: problem ids both reports hold, errors left out: the pairs
    shared: int
    #: ids only one report holds
    only_a: int
    only_b: int
    #: ids both hold that ended in an error in either (left out of the pairs)
    errors: int
    #: correct in A, not in B; correct in B, not in A (by problem index)
    newly_failing: tuple[str, ...]
    newly_passing: tuple[str, ...]
    #: accuracy of B minus that of A over the pairs, with its 95% interval
    diff: float
    low: float
    high: float
    #: exact one-sided McNemar p-value for "B is worse than A"
    p_value: float
    verdict: GateVerdict

    @property
    def worse(self) -> bool:
        return not self.verdict.passed


def _records(report: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(r["id"]): r for r in report["problems"]}


def _order(record: Mapping[str, Any]) -> tuple[int, str]:
    index = record.get("index")
    return (index if isinstance(index, int) else -1, str(record["id"]))


def compare(
    a: Mapping[str, Any],
    b: Mapping[str, Any],
    *,
    alpha: float = 0.05,
    where: tuple[str, str] = ("A", "B"),
) -> Comparison:
    """Compare report ``b`` with report ``a`` (both from :func:`load_report`) on the
    problem ids both hold; the verdict fails when the baseline gate's test (exact McNemar
    for one run a side, noise-aware for reports with ``--gsm8k-repeats``) says B is worse
    at ``alpha``.

    ``where`` names the two files in messages. Raises :class:`CompareError` for reports
    of different protocols or datasets, or with no problem to pair.
    """
    where_a, where_b = where
    difference = first_difference(a, b, here=f"in B ({where_b})", there=f"in A ({where_a})")
    if difference:
        raise CompareError(f"refused to compare {where_a} with {where_b}: {difference}")
    in_a, in_b = _records(a), _records(b)
    common = sorted((in_a[pid] for pid in in_a.keys() & in_b.keys()), key=_order)
    pairs: list[Pair] = []
    errors = 0
    for record in common:
        pid = str(record["id"])
        then, now = in_a[pid], in_b[pid]
        if "error" in (then["outcome"], now["outcome"]):
            errors += 1
            continue
        pairs.append(Pair(pid, *_runs(then), *_runs(now)))
    shared = len(pairs)
    if shared == 0:
        why = (
            f"all {errors} problems both hold ended in an error in one of them"
            if errors
            else "no problem id in common"
        )
        raise CompareError(f"nothing to compare in {where_a} and {where_b}: {why}")
    # like with like: each side's mean rate over every run it holds (its --gsm8k-repeats
    # outcomes, else its one run), one estimate of their difference; the verdict is the
    # baseline gate's rule (noise-aware, exact McNemar for one run a side)
    rule = NoiseAware(alpha, name="compare", option="--alpha")
    diff, low, high = calibrated.difference(pairs)
    return Comparison(
        label=str(a["protocol"].get("label") or a["protocol"].get("name") or ""),
        a=_side("A", where_a, a, sum(x.base_rate for x in pairs) / shared),
        b=_side("B", where_b, b, sum(x.now_rate for x in pairs) / shared),
        shared=shared,
        only_a=len(in_a.keys() - in_b.keys()),
        only_b=len(in_b.keys() - in_a.keys()),
        errors=errors,
        newly_failing=tuple(x.problem_id for x in pairs if x.failing),
        newly_passing=tuple(
            x.problem_id for x in pairs if x.base_correct < x.base_runs and x.now_correct > 0
        ),
        diff=diff,
        low=low,
        high=high,
        p_value=calibrated.p_value(pairs),
        verdict=rule.verdict(pairs),
    )


def _runs(record: Mapping[str, Any]) -> tuple[int, int]:
    """A record's (correct runs, runs): its ``--gsm8k-repeats`` outcomes, else one run."""
    outcomes = record.get("repeats") or ()
    if isinstance(outcomes, list) and len(outcomes) > 1:
        return sum(1 for o in outcomes if o == "correct"), len(outcomes)
    return int(bool(record["correct"])), 1


def _side(name: str, where: str, report: Mapping[str, Any], accuracy: float) -> Side:
    return Side(
        name=name,
        where=where,
        model=str(report.get("model") or ""),
        n=len(report["problems"]),
        accuracy=accuracy,
        complete=report.get("complete") is not False,
    )


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def pairing(result: Comparison) -> str:
    """Which problems were paired, in words (how many, and what was left out)."""
    a, b = result.a, result.b
    text = (
        f"Paired on the {_plural(result.shared, 'problem', 'problems')} both reports hold "
        f"(A holds {a.n}, B holds {b.n}"
    )
    left = []
    if result.only_a:
        left.append(f"{result.only_a} only in A")
    if result.only_b:
        left.append(f"{result.only_b} only in B")
    if result.errors:
        left.append(f"{result.errors} that ended in an error in either, left out")
    return text + ("; " + ", ".join(left) if left else "") + ")."


def markdown(result: Comparison, questions: Mapping[str, str] | None = None) -> str:
    """The comparison in the Markdown of the run's step summary: a headline, the two
    runs, the paired difference and McNemar, the verdict as a gate table, and the flips
    (with the start of each question when ``questions`` has it)."""
    a, b = result.a, result.b
    texts = questions or {}
    lines = [
        f"### gsm8k compare ({md_text(result.label)}): B {b.accuracy:.4f} vs A "
        f"{a.accuracy:.4f} on {_plural(result.shared, 'problem', 'problems')}",
        "",
        "| run | report | model | accuracy (paired) | problems |",
        "| --- | --- | --- | --- | --- |",
    ]
    for side in (a, b):
        held = f"{side.n}" + ("" if side.complete else " (incomplete run)")
        lines.append(
            f"| {side.name} | {cell_code(side.where)} | {cell_code(side.model)} | "
            f"{side.accuracy:.4f} | {held} |"
        )
    lines += [
        "",
        md_text(pairing(result)),
        "",
        f"Difference B - A: {result.diff:+.4f} [95% CI {result.low:+.4f}, {result.high:+.4f}]; "
        f"{len(result.newly_failing)} newly failing, {len(result.newly_passing)} newly passing; "
        f"one-sided p={result.p_value:.4g} (B worse than A; the gate's test).",
        "",
    ]
    lines += gate_table([result.verdict])
    rest = "see the JSON reports"
    lines += problem_list("Newly failing in B", result.newly_failing, texts, rest)
    lines += problem_list("Newly passing in B", result.newly_passing, texts, rest)
    return "\n".join(lines) + "\n"
