"""Baselines: a stored run, read, checked and compared with a new run (comparisons pair the
ids both hold). Pure. docs/design.md#which-problems-a-baseline-holds."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_gsm8k.core import jsontext
from pytest_gsm8k.core.calibrated import MAX_REPEATS, POWER, Evidence, Pair, difference, reach
from pytest_gsm8k.core.dataset import select
from pytest_gsm8k.core.jsontext import to_json
from pytest_gsm8k.core.records import OUTCOMES
from pytest_gsm8k.core.stats import accuracy_interval, mcnemar_one_sided
from pytest_gsm8k.core.types import Problem

if TYPE_CHECKING:
    from pytest_gsm8k.core.plan import StoredBaseline

SCHEMA = 1
KIND = "pytest-gsm8k baseline"
#: dataset fields that must match (the name/path differs between machines, the content must not)
DATASET_KEYS = ("config", "split", "fingerprint", "rows")
#: those a subset of the same split shares (it is compared on its ids)
SAME_SPLIT = DATASET_KEYS[:3]
#: the longest default name (ASCII): with ``.gsm8k``, far below a file name's 255 bytes
NAME_LIMIT = 200
#: what names a vLLM config in its baseline: one config's baseline never gates another's
CONFIG_KEYS = ("name", "model_name")
#: protocol fields that follow from others (the shots and their seed or file): named only
#: when nothing a user sets differs
DERIVED = ("fewshot_hash", "fewshot_source")
_Obj = Mapping[str, Any]  # a JSON object: a report, a record, a baseline document


class BaselineError(Exception):
    """A baseline that cannot be used; one line naming the file and the reason."""


def _corrupt(where: str, why: str, edited: bool = False) -> BaselineError:
    return BaselineError(f"{where}: corrupt baseline ({why}{': edited by hand?' * edited})")


def default_name(label: str) -> str:
    """A file-system-safe name from the label; a long one ends with the label's hash."""
    name = re.sub(r"[^A-Za-z0-9@.+-]+", "_", label).strip("_")
    if len(name) <= NAME_LIMIT:
        return name
    digest = hashlib.sha256(label.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return f"{name[: NAME_LIMIT - len(digest) - 1].rstrip('_')}_{digest}"


def record_runs(record: _Obj) -> tuple[int, int]:
    """A run's record as (correct runs, runs): its ``--gsm8k-repeats``, else one run."""
    outcomes = record.get("repeats") or ()
    if len(outcomes) > 1:
        return outcomes.count("correct"), len(outcomes)
    return int(bool(record["correct"])), 1


def entry(record: _Obj, calibrated: bool, sampled: bool = False) -> Any:
    """A run's record as a baseline's problem: its outcome, its runs or its samples' counts."""
    if calibrated:
        correct, runs = record_runs(record)
        return {"correct": correct, "outcome": record["outcome"], "repeats": runs}
    if sampled:
        return {key: record[key] for key in ("outcome", "n_correct", "n_samples")}
    return record["outcome"]


def build(summary_json: _Obj, partial: str | None = None) -> dict[str, Any]:
    """The baseline document from a run's JSON report; ``partial``: why it holds only part."""
    records = summary_json["problems"]
    repeats = max((len(r.get("repeats") or ()) for r in records), default=0)
    sampled = int(summary_json["protocol"]["samples"]) > 1
    problems = {record["id"]: entry(record, repeats > 1, sampled) for record in records}
    subset = summary_json.get("subset", {})
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": KIND,
        "protocol": dict(summary_json["protocol"]),
        "dataset": {k: summary_json["dataset"][k] for k in DATASET_KEYS},
        "model": summary_json["model"],
        "reported_models": summary_json.get("reported_models", []),
        "accuracy": round(float(summary_json["accuracy"]), 6),
        "n": summary_json["n"],
        "subset": subset,
        "problems": dict(sorted(problems.items())),
    }
    config = summary_json.get("config")
    if isinstance(config, Mapping):
        document["config"] = {key: config.get(key) for key in CONFIG_KEYS}
    if repeats > 1:
        document["calibration"] = calibration(document["problems"])
    if partial is not None:
        of = int(summary_json["expected"]) + int(subset.get("deselected") or 0)
        document["partial"] = {"reason": partial, "of": of, "ids": sorted(problems)}
    return document


def runs(entry: Any) -> tuple[int, int]:
    if isinstance(entry, dict) and "repeats" in entry:
        return int(entry["correct"]), int(entry["repeats"])
    return int(_correct(entry)), 1


def _correct(entry: Any) -> bool:
    return (entry.get("outcome") if isinstance(entry, dict) else entry) == "correct"


def calibration(problems: _Obj) -> dict[str, int]:
    """The ``calibration`` entry: K, and the stable-correct, stable-wrong, noisy counts."""
    sides = [runs(entry) for entry in problems.values()]
    return {"repeats": max([1, *(k for _, k in sides)]), **_stabilities(sides)}


def _stabilities(sides: Iterable[tuple[int, int]]) -> dict[str, int]:
    counts = Counter(
        "stable_correct" if c == k else "stable_wrong" if c == 0 else "noisy" for c, k in sides
    )
    return {key: counts[key] for key in ("stable_correct", "stable_wrong", "noisy")}


def pairs(baseline: _Obj, records: Sequence[_Obj]) -> list[Pair]:
    base = baseline["problems"]
    return [
        Pair(str(r["id"]), *runs(base[str(r["id"])]), *record_runs(r))
        for r in sorted(records, key=lambda r: str(r["id"]))
        if str(r["id"]) in base
    ]


#: stands in for a calibrated baseline's problems while the rest is dumped (see dumps)
_PROBLEMS_SLOT = "\u0000problems\u0000"


def dumps(baseline: dict[str, Any]) -> str:
    """Stable text, one problem per line, so a baseline diff reads well in a PR."""
    problems = baseline.get("problems") or {}
    if not any(isinstance(v, dict) and "repeats" in v for v in problems.values()):
        return to_json(baseline, indent=1, sort_keys=True) + "\n"
    text = to_json({**baseline, "problems": _PROBLEMS_SLOT}, indent=1, sort_keys=True)
    rows = ",\n".join(
        f"  {to_json(pid)}: {to_json(entry, sort_keys=True)}"
        for pid, entry in sorted(problems.items())
    )
    return text.replace(to_json(_PROBLEMS_SLOT), "{\n" + rows + "\n }", 1) + "\n"


def loads(text: str, where: str) -> dict[str, Any]:
    """A baseline file's document; a hand edit that gates on numbers nobody measured is refused."""
    try:
        data = jsontext.loads(text)
    except json.JSONDecodeError as exc:
        raise _corrupt(where, f"line {exc.lineno}: {exc.msg}") from None
    except jsontext.TooDeep as exc:
        raise _corrupt(where, str(exc)) from None
    _refuse_duplicates(text, where)
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise BaselineError(f"{where}: not a pytest-gsm8k baseline")
    if data.get("schema") != SCHEMA:
        raise BaselineError(f"{where}: baseline schema {data.get('schema')} (expected {SCHEMA})")
    for key in ("protocol", "dataset", "problems"):
        if not isinstance(data.get(key), dict):
            raise _corrupt(where, f"no '{key}'")
    problems = data["problems"]
    for pid, entry in problems.items():
        _check_entry(pid, entry, where)
    stored, made, size = data.get("calibration"), calibration(problems), len(problems)
    if stored is not None and stored != made:
        why = f"its calibration {stored!r} is not that of its {size} problems, {made!r}"
        raise _corrupt(where, why, edited=True)
    accuracy: Any = data.get("accuracy")
    if not _is_int(accuracy, int | float):
        raise _corrupt(where, "no accuracy")
    if problems:
        measured = sum(1 for entry in problems.values() if _correct(entry)) / size
        # a calibrated baseline's accuracy is the mean over every run (test@1); one written
        # before that holds its outcomes' (the most common answer's): both are consistent
        mean = sum(c / k for c, k in map(runs, problems.values())) / size
        if min(abs(measured - accuracy), abs(mean - accuracy)) > 1e-6:
            why = f"its accuracy {float(accuracy):.6f} is not that of its {size} outcomes"
            raise _corrupt(where, f"{why}, {measured:.6f}", edited=True)
    n, partial = data.get("n"), data.get("partial")
    if n is not None and (not _is_int(n) or n != size):
        raise _corrupt(where, f"its n {n!r} is not the {size} problems it holds", edited=True)
    if partial is not None:
        ids, of = (partial.get(k) if isinstance(partial, dict) else None for k in ("ids", "of"))
        if not isinstance(ids, list) or not _is_int(of):
            raise _corrupt(where, "'partial' has no ids or no 'of'")
        if sorted(str(i) for i in ids) != sorted(problems) or len(ids) != size:
            why = f"its partial ids are not the {size} problems it holds"
            raise _corrupt(where, why, edited=True)
    return data


def _is_int(value: object, kind: Any = int) -> bool:
    """``value`` is of ``kind`` and not a bool (JSON's true is no count)."""
    return isinstance(value, kind) and not isinstance(value, bool)


#: what delimits JSON's objects and keys: strings (escapes included), brackets, colons
_JSON_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]:]')


def _refuse_duplicates(text: str, where: str) -> None:
    """A key given twice in one object (``json`` keeps the later silently), with its line."""
    keys: list[set[str]] = []  # per open object or array the keys read (text that parsed)
    last: re.Match[str] | None = None  # the string just read: a key when a colon follows
    for token in _JSON_TOKEN.finditer(text):
        mark = token[0]
        if mark == ":" and last is not None:
            key = json.loads(last[0])
            if key in keys[-1]:
                line = text.count("\n", 0, last.start()) + 1
                why = f"{key[:80]!r} given twice in one object; only one copy may stay"
                raise _corrupt(f"{where}:{line}", why)
            keys[-1].add(key)
        elif mark in ("{", "["):
            keys.append(set())
        elif mark in ("}", "]"):
            keys.pop()
        last = token if mark.startswith('"') else None


def _check_entry(pid: str, entry: Any, where: str) -> None:
    """An outcome; a calibrated entry's counts, and an outcome that can be their most common."""
    outcome = entry.get("outcome") if isinstance(entry, dict) else entry
    if not isinstance(outcome, str) or outcome not in OUTCOMES:
        raise _corrupt(
            where, f"problem {pid}: outcome {outcome!r} is not one of {', '.join(OUTCOMES)}"
        )
    if not isinstance(entry, dict) or "repeats" not in entry:
        return
    k: Any = entry.get("repeats")
    c: Any = entry.get("correct")
    if not _is_int(k) or not _is_int(c):
        raise _corrupt(where, f"problem {pid}: correct {c!r} of repeats {k!r} are not counts")
    if not (1 <= k <= MAX_REPEATS and 0 <= c <= k):
        raise _corrupt(where, f"problem {pid}: correct {c} of {k} repeats")
    # "correct" needs a correct run, any other outcome at least as many runs as the correct
    # ones (a tie goes to the one seen first)
    if (c == 0) if outcome == "correct" else (2 * c > k):
        why = f"problem {pid}: outcome {outcome!r} with {c} of {k} repeats correct"
        raise _corrupt(where, why, edited=True)


def check(stored: StoredBaseline, here: _Obj, split: Sequence[Problem]) -> dict[str, Any]:
    """The stored document of the protocol and dataset of ``here``, holding problems of
    ``split`` and, unless it says it is partial, exactly its selection."""
    baseline, where = stored.document, stored.shown
    if baseline is None:
        raise BaselineError(stored.error or f"no baseline at {where}")
    difference = first_difference(baseline, here, here="here", there="in the baseline")
    if difference:
        raise BaselineError(f"refused to compare with {where}: {difference}")
    ids = set(baseline["problems"])
    unknown = sorted(ids - {p.id for p in split})
    if unknown:
        name = baseline.get("dataset", {}).get("split", "")
        more = f", ... ({len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise BaselineError(
            f"{where}: {len(unknown)} problem ids are not in the {name} split: "
            f"{', '.join(unknown[:5])}{more} (edited by hand?)"
        )
    if baseline.get("partial") is not None:
        return baseline
    subset = baseline.get("subset")
    subset = subset if isinstance(subset, dict) else {}
    limit, seed, first = subset.get("limit"), subset.get("seed", 0), subset.get("first") is True
    seed = 0 if first and seed is None else seed  # no seed chose a vLLM config's first N
    if not (limit is None or (isinstance(limit, int) and limit > 0)) or not isinstance(seed, int):
        raise _corrupt(where, "its subset limit or seed is not a number")
    selection = {p.id for p in select(tuple(split), limit, seed, first=first)}
    if ids != selection:
        described = f"the first {limit}" if first else f"limit {limit}, seed {seed}"
        described = "the whole split" if limit is None else described
        raise BaselineError(
            f"{where}: its {len(ids)} problems are not the {len(selection)} of its selection "
            f"({described}: {len(selection - ids)} missing, {len(ids - selection)} outside it) "
            "and it does not say it is partial; record it again with --snapshot-update"
        )
    return baseline


def first_difference(baseline: _Obj, summary_json: _Obj, *, here: str, there: str) -> str | None:
    """The first protocol, config or dataset field that differs, as a phrase; None when
    comparable. Every comparison of runs asks this."""
    now, base = summary_json["protocol"], baseline["protocol"]
    # the options a user sets before what follows from them: "shots is 5", not a hash
    order = sorted({*now, *base} - {"label"}, key=lambda k: (k in DERIVED, k))
    now_c, base_c = (
        c if isinstance(c, Mapping) else {}
        for c in (summary_json.get("config"), baseline.get("config"))
    )
    for what, ours, theirs, keys in (
        ("protocol", now, base, order),
        ("config", now_c, base_c, CONFIG_KEYS),
        ("dataset", summary_json["dataset"], baseline["dataset"], SAME_SPLIT),
    ):
        for key in keys:
            if ours.get(key) != theirs.get(key):
                return f"{what} {key} is {ours.get(key)!r} {here} but {theirs.get(key)!r} {there}"
    return None


def moved_from(beside: Iterable[tuple[str, _Obj]], here: _Obj) -> str | None:
    """``<file> (<field>)``: a baseline beside it of the same data but another protocol, or
    None (found by its label, a changed protocol would pass as "no baseline yet")."""

    def config(document: _Obj) -> object:
        value = document.get("config")
        return value.get("name") if isinstance(value, Mapping) else None

    for shown, document in beside:
        if config(document) != config(here) or any(
            document["dataset"].get(key) != here["dataset"].get(key) for key in SAME_SPLIT
        ):
            continue
        difference = first_difference(document, here, here="here", there="there")
        if difference:
            return f"{shown} ({difference})"
    return None


def noise_block(
    baseline: _Obj, records: Sequence[_Obj], run_ids: Collection[str], alpha: float, seen: Evidence
) -> dict[str, Any]:
    """The report's baseline block: the pairs' counts, McNemar's p on the most common outcomes,
    and what the noise-aware gate sees (``seen``: the pairs' evidence)."""
    base, paired = baseline["problems"], pairs(baseline, records)
    flips = Counter(
        (_correct(base[str(r["id"])]), bool(r["correct"])) for r in records if str(r["id"]) in base
    )
    counts = _stabilities((p.base_correct, p.base_runs) for p in paired)
    can, (diff, low, high) = reach(paired, alpha), difference(paired)
    shared = len(paired) or 1  # the means of no pair are 0
    runs = max((p.base_runs for p in paired), default=1)
    now_runs = max((p.now_runs for p in paired), default=1)
    return {
        "shared": len(paired),
        "mcnemar_p": mcnemar_one_sided(flips[True, False], flips[False, True]),
        "subset": len(paired) < len(base),
        "baseline_n": len(base),
        "not_in_baseline": len(set(run_ids) - set(base)),
        # like with like: the mean rates over every run of each side, one estimate
        "baseline_accuracy": sum(p.base_rate for p in paired) / shared,
        "current_accuracy": sum(p.now_rate for p in paired) / shared,
        # each side's interval by the headline's rule (one run: Wilson; repeats: clustered)
        "baseline_ci95": list(accuracy_interval([p.base_rate for p in paired], runs)),
        "current_ci95": list(accuracy_interval([p.now_rate for p in paired], now_runs)),
        "difference": diff,
        "difference_ci95": [low, high],
        "p_value": seen.p,
        "p_values": {"flips": seen.flip, "drop": seen.drop, "rise": seen.rise},
        "alpha": alpha,
        "repeats": {"baseline": runs, "run": now_runs},
        "detectable_drop": {
            "problems": round(can.problems, 1),
            "points": round(can.points, 2) if paired else None,
            "power": POWER,
            "repeats_for_one_point": can.repeats_for_one_point,
        },
        "newly_failing": [p.problem_id for p in paired if p.failing],
        "newly_passing": [
            p.problem_id for p in paired if p.base_correct < p.base_runs and p.now_correct > 0
        ],
        "stable_flips": [p.problem_id for p in paired if p.stable_flip],
        "noisy_failing": [
            p.problem_id for p in paired if p.failing and p.base_correct < p.base_runs
        ],
        "stability": counts,
        "flip_rate": counts["noisy"] / shared,
    }


def noise_sentence(seen: _Obj) -> str:
    """The terminal's line on what the gate can see (from :func:`noise_block`)."""
    counts, drop, alpha = seen["stability"], seen["detectable_drop"], f"alpha={seen['alpha']:g}"
    shared, more = sum(counts.values()), drop["repeats_for_one_point"]
    can_see = (
        f"detects a drop of {drop['points']:.1f} points or more spread over the noisy "
        f"problems ({drop['problems']:g} problems; 80% power, n={shared}, {alpha})"
        if drop["problems"] <= shared  # past that no drop the run can show is detectable
        else f"detects no drop at this size ({shared} problems; {alpha})"
    )
    can_see += (
        f"; {more} candidate run{'s' * (more != 1)} per problem (--gsm8k-repeats) would reach "
        "1 point"
        if more is not None
        else "; no number of candidate repeats reaches 1 point with this baseline"
    )
    if drop["points"] > 5:
        can_see += "; it cannot reach 80% power against a 5-point drop at this size"
    if (runs := seen["repeats"]["baseline"]) == 1:
        return (
            "noise: a single-run baseline cannot tell noisy problems from stable ones "
            f"(record it with --gsm8k-repeats K); the gate {can_see}"
        )
    return (
        f"noise: baseline of {runs} runs per problem: {counts['stable_correct']} stable-correct, "
        f"{counts['stable_wrong']} stable-wrong, {counts['noisy']} noisy (flip rate "
        f"{seen['flip_rate']:.1%}); the gate {can_see}"
    )


def fewer_repeats(document: _Obj | None, repeats: int) -> str | None:
    """Why a run of fewer repeats may not replace ``document`` (it would silently cost the gate
    its power: a 1-point drop caught 13% of the time instead of 99%), or None."""
    stored_k = ((document or {}).get("calibration") or {}).get("repeats")  # checked by loads
    if not isinstance(stored_k, int) or stored_k <= repeats:
        return None
    made = f"{repeats} runs" if repeats > 1 else "1 run"
    return (
        f"it is calibrated over {stored_k} runs per problem and this run made {made}; "
        f"record it with --gsm8k-repeats {stored_k} (or delete the file to record a "
        "baseline of fewer runs)"
    )


def dropped(stored: StoredBaseline, report: _Obj, split: Sequence[Problem]) -> int:
    """The problems a usable stored baseline holds that the run does not."""
    try:
        held = set(check(stored, report, split)["problems"])
    except BaselineError:
        return 0
    return len(held - {record["id"] for record in report["problems"]})
