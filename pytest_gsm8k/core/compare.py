"""``python -m pytest_gsm8k compare A.json B.json``: is B worse than A? The baseline gate's
question, so ``decide`` answers it with A as B's baseline, per config of a matrix
(docs/baselines.md#compare-two-runs). A report is untrusted input. Pure."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from pytest_gsm8k.core import jsontext
from pytest_gsm8k.core.baseline import SAME_SPLIT, entry, first_difference
from pytest_gsm8k.core.calibrated import MAX_REPEATS
from pytest_gsm8k.core.gates import GateVerdict, NoiseAware
from pytest_gsm8k.core.plan import GateSpecs, StoredBaseline
from pytest_gsm8k.core.records import OUTCOMES, REPORT_SCHEMA, ProblemRecord
from pytest_gsm8k.core.scrub import clip
from pytest_gsm8k.core.verdict import BaselineInput, Group, GroupInput, Selection, decide

#: the most problems a report may hold: a matrix of many configs, each a whole split
MAX_PROBLEMS = 100_000
MAX_CONFIGS = 1_000
#: the longest problem id (a config's name, a file's stem, ``test-0042``) and config name
MAX_ID = 1_000

Report = Mapping[str, Any]  # a JSON report (load_report), or one config's of a matrix
Files = tuple[str, str]  # the two reports' file names, A's then B's


class CompareError(Exception):
    """Two reports that cannot be compared, or a file that is not a report (one line)."""


def _shown(value: object) -> str:
    return clip(repr(value), 40)


def _need(ok: object, where: str, field: str, why: str) -> None:
    if not ok:
        raise CompareError(f"{where}: corrupt JSON report ({field}: {why})")


def load_report(text: str | bytes, where: str) -> dict[str, Any]:
    """A JSON report from its text, checked for what a comparison reads within the bounds
    of ``report.schema.json``; :class:`CompareError` names ``where`` and the wrong field."""
    try:
        data = jsontext.loads(text)
    except json.JSONDecodeError as exc:
        raise CompareError(f"{where}: not JSON (line {exc.lineno}: {exc.msg})") from None
    except (jsontext.TooDeep, UnicodeDecodeError) as exc:
        raise CompareError(f"{where}: not a JSON report ({exc})") from None
    if not isinstance(data, dict) or "schema" not in data or "problems" not in data:
        raise CompareError(f"{where}: not a pytest-gsm8k JSON report (written by --gsm8k-report)")
    if data["schema"] != REPORT_SCHEMA:
        raise CompareError(
            f"{where}: JSON report schema {_shown(data['schema'])}; this version reads "
            f"schema {REPORT_SCHEMA}"
        )
    _check_run(data, where, "")
    ids: set[str] = set()
    for number, record in enumerate(_check_list(data, "problems", MAX_PROBLEMS, where)):
        _check_problem(record, where, f"problems[{number}]", ids)
    if "configs" in data:
        names: set[str] = set()
        for number, entry in enumerate(_check_list(data, "configs", MAX_CONFIGS, where)):
            _check_run(entry, where, f"configs[{number}].")
            name = entry["config"].get("name") if isinstance(entry.get("config"), dict) else None
            _unique(name, names, where, f"configs[{number}].config.name")
        for number, record in enumerate(data["problems"]):
            ok = record["id"].rpartition(":")[0] in names
            _need(ok, where, f"problems[{number}].id", f"{_shown(record['id'])} names no config")
    return data


def _unique(value: object, seen: set[str], where: str, field: str) -> None:
    ok = isinstance(value, str) and 0 < len(value) <= MAX_ID
    _need(ok, where, field, f"{_shown(value)} is not a string of 1 to {MAX_ID} characters")
    _need(value not in seen, where, field, f"{_shown(value)} appears twice")
    seen.add(cast(str, value))


def _check_list(data: dict[str, Any], key: str, most: int, where: str) -> list[Any]:
    items = data[key]
    _need(isinstance(items, list), where, key, "not a list")
    _need(len(items) <= most, where, key, f"{len(items)} entries, at most {most}")
    return cast(list[Any], items)


def _check_run(run: Any, where: str, at: str) -> None:
    _need(isinstance(run, dict), where, at.rstrip(".") or "report", "not an object")
    for key in ("protocol", "dataset"):
        _need(isinstance(run.get(key), dict), where, at + key, "missing or not an object")
    _need(isinstance(run.get("model", ""), str), where, at + "model", "not a string")
    for key in SAME_SPLIT:  # what the pairing compares: strings (report.schema.json)
        value = run["dataset"].get(key, "")
        _need(isinstance(value, str), where, f"{at}dataset.{key}", "not a string")


def _check_problem(record: Any, where: str, at: str, seen: set[str]) -> None:
    _need(isinstance(record, dict), where, at, "not an object")
    _unique(record.get("id"), seen, where, f"{at}.id")
    index = record.get("index", 0)
    ok = isinstance(index, int) and not isinstance(index, bool) and index >= 0
    _need(ok, where, f"{at}.index", f"{_shown(index)} is not a count")
    outcome, names = record.get("outcome"), ", ".join(OUTCOMES)
    _need(outcome in OUTCOMES, where, f"{at}.outcome", f"{_shown(outcome)} is not one of {names}")
    correct = record.get("correct")
    ok = correct is (outcome == "correct")
    _need(ok, where, f"{at}.correct", f"{_shown(correct)} with outcome {outcome}")
    if "repeats" in record:
        runs = record["repeats"]
        count = f"{len(runs)} entries" if isinstance(runs, list) else "not a list"
        ok = isinstance(runs, list) and 2 <= len(runs) <= MAX_REPEATS
        _need(ok, where, f"{at}.repeats", f"{count}, not 2 to {MAX_REPEATS} outcomes")
        for number, run in enumerate(runs):
            why = f"{_shown(run)} is not one of {names}"
            _need(run in OUTCOMES, where, f"{at}.repeats[{number}]", why)


@dataclass(frozen=True)
class Side:
    """One of the two reports: its accuracy over the pairs, whether it ran its whole selection."""

    name: str
    where: str
    model: str
    n: int
    accuracy: float
    complete: bool


@dataclass(frozen=True)
class Comparison:
    """B against A: the ids left out of the pairs (errors among them), the gate's verdict and
    why it is no verdict (else None); ``block``: the verdict's baseline block, which holds the
    pairs (``shared``), the flips and B - A with its 95% interval."""

    label: str
    a: Side
    b: Side
    only_a: int
    only_b: int
    errors: int
    verdict: GateVerdict
    block: Mapping[str, Any]
    undecided: str | None = None
    config: str = ""  # the --gsm8k-config config compared


def compare(a: Report, b: Report, *, alpha: float = 0.05, where: Files = ("A", "B")) -> Comparison:
    """Report ``b`` against report ``a`` (both from :func:`load_report`, files ``where``);
    :class:`CompareError` for other protocols or datasets, or no problem to pair."""
    where_a, where_b = where
    difference = first_difference(a, b, here=f"in B ({where_b})", there=f"in A ({where_a})")
    if difference:
        raise CompareError(f"refused to compare {where_a} with {where_b}: {difference}")
    in_a, in_b = ({str(r["id"]): r for r in report["problems"]} for report in (a, b))
    common = in_a.keys() & in_b.keys()
    # an error is no measurement of the model: left out of the pairs, and counted
    bad = {pid for pid in common if _errored(in_a[pid]) or _errored(in_b[pid])}
    if len(bad) == len(common):
        why = f"all {len(bad)} problems both hold ended in an error in one of them"
        why = why if bad else "no problem id in common"
        raise CompareError(f"nothing to compare in {where_a} and {where_b}: {why}")
    # never a verdict on part: an unanswered problem (an error: "any error" needs no
    # monotonicity and cannot be gamed) or one a report left out may be a failure
    errors_a, errors_b = (sum(_errored(side[pid]) for pid in bad) for side in (in_a, in_b))
    gaps = [
        f"{len(bad)} of the {len(common)} problems both reports hold ended in an error "
        f"({errors_a} in A, {errors_b} in B), and unanswered they could hide a drop"
    ] * bool(bad)
    gaps += [gap for gap in (_not_whole("A", a), _not_whole("B", b)) if gap]
    not_whole = "; ".join(gaps) + ": rerun until every problem has an answer" if gaps else None
    records = tuple(_record(r) for r in in_b.values() if r["id"] not in bad)
    document = {
        "problems": {p: entry(r, bool(r.get("repeats"))) for p, r in in_a.items() if p not in bad}
    }
    group = Group(
        name="",
        label=str(a["protocol"].get("label") or a["protocol"].get("name") or ""),
        # what the numbers read of a protocol (the reports' were compared above)
        protocol={"name": "compare", "samples": 1, "extractor": ""},
        protocol_label="",
        dataset={},
        subset={},
        model=str(b.get("model") or ""),
        endpoint="",
        specs=GateSpecs(None, NoiseAware(alpha, name="compare", option="--alpha"), False),
    )
    stored = StoredBaseline(Path(where_a), where_a, document)
    selection = Selection(tuple(r["id"] for r in records), not_whole=not_whole)
    v = decide(GroupInput(group, records, selection, BaselineInput(stored, (), from_report=True)))
    (verdict,) = v.gates
    seen = v.extra["baseline"]
    config = a.get("config")
    return Comparison(
        label=group.label,
        a=_side("A", where_a, a, seen["baseline_accuracy"]),
        b=_side("B", where_b, b, seen["current_accuracy"]),
        only_a=len(in_a.keys() - in_b.keys()),
        only_b=len(in_b.keys() - in_a.keys()),
        errors=len(bad),
        verdict=verdict,
        block=seen,
        undecided=not_whole if verdict.undecided else None,
        config=str(config.get("name") or "") if isinstance(config, Mapping) else "",
    )


def compare_all(
    a: Report, b: Report, *, alpha: float = 0.05, where: Files = ("A", "B")
) -> list[Comparison | CompareError]:
    """:func:`compare`, or for two ``--gsm8k-config`` reports one entry per config, each
    compared or refused on its own (a matrix against a single run is refused)."""
    where_a, where_b = where
    if ("configs" in a) != ("configs" in b):
        matrix, other = (where_a, where_b) if "configs" in a else (where_b, where_a)
        raise CompareError(
            f"refused to compare {where_a} with {where_b}: {matrix} is a --gsm8k-config "
            f"report (one comparison per config), {other} is not"
        )
    if "configs" not in a:
        return [compare(a, b, alpha=alpha, where=where)]
    runs_a, runs_b = _configs(a), _configs(b)
    results: list[Comparison | CompareError] = []
    for name in {**runs_a, **runs_b}:  # A's order, then B's new ones
        try:
            if name not in runs_a or name not in runs_b:
                holder = where_a if name in runs_a else where_b
                raise CompareError(
                    f"refused to compare {where_a} with {where_b}: only {holder} has it"
                )
            results.append(compare(runs_a[name], runs_b[name], alpha=alpha, where=where))
        except CompareError as exc:
            results.append(CompareError(f"config {clip(name)}: {exc}"))
    return results


def _configs(report: Report) -> dict[str, dict[str, Any]]:
    """A matrix report's configs by name, each with the problems whose ids carry its name."""
    problems: dict[str, list[Any]] = {}
    for record in report["problems"]:
        problems.setdefault(record["id"].rpartition(":")[0], []).append(record)
    return {  # with the report's shard block (held at its top): each config is its slice
        (n := c["config"]["name"]): dict(c, shard=report.get("shard"), problems=problems.get(n, []))
        for c in report["configs"]
    }


def _errored(record: Mapping[str, Any]) -> bool:
    return record["outcome"] == "error" or "error" in (record.get("repeats") or ())


def _record(record: Mapping[str, Any]) -> ProblemRecord:
    """What the verdict reads of a problem, and nothing else a report could forge (its
    repeats' correct count is counted again)."""
    out = {key: record[key] for key in ("id", "outcome", "correct")}
    out.update(index=record.get("index", 0), rules={}, samples=[])
    if outcomes := record.get("repeats"):
        out.update(repeats=list(outcomes), repeats_correct=outcomes.count("correct"))
    return cast(ProblemRecord, out)


def _not_whole(name: str, report: Report) -> str | None:
    """Why ``report`` does not hold its whole selection (a report hiding its failures would
    leave them out), or None."""
    subset = report.get("subset")
    deselected = subset.get("deselected") if isinstance(subset, Mapping) else None
    if isinstance(deselected, int) and deselected > 0:
        return f"{name} left {deselected} problems of its selection out (deselected)"
    if isinstance(shard := report.get("shard"), Mapping):  # its slice; the run's: the merge
        at = f"{shard.get('index')} of {shard.get('count')}"
        return f"{name} is shard {at} of a run (merge the shards: python -m pytest_gsm8k merge)"
    if report.get("complete") is False:
        n, expected = report.get("n"), report.get("expected")
        return f"{name} is an incomplete run ({n} of {expected} problems have a result)"
    return None


def _side(name: str, where: str, report: Report, accuracy: float) -> Side:
    model, complete = str(report.get("model") or ""), report.get("complete") is not False
    return Side(name, where, model, len(report["problems"]), accuracy, complete)
