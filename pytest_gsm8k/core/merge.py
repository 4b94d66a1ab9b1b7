"""Shards of one run (``--gsm8k-shard I/N``, ``python -m pytest_gsm8k merge``). Pure. A shard
decides no gate; the merge accepts reports only as the shards of ONE run, else one line why."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from pytest_gsm8k.core.jsontext import escape_surrogates
from pytest_gsm8k.core.settings import MAX_SHARDS, Settings
from pytest_gsm8k.core.types import stable_hash

if TYPE_CHECKING:
    from pytest_gsm8k.core.plan import RunPlan, StoredBaseline


_T = TypeVar("_T")


class ShardError(Exception):
    """A bad ``--gsm8k-shard`` value, or reports that are not the shards of one run (one line)."""


def shard_slice(items: Sequence[_T], index: int, count: int) -> tuple[_T, ...]:
    """Every ``count``-th item from the ``index``-th (1-based): a stride, not a block, as
    the split's order is not random and a block of it would not be a representative mix."""
    return tuple(items[index - 1 :: count])


def interleave(slices: Sequence[Sequence[_T]]) -> list[_T] | None:
    """The items whose :func:`shard_slice` are ``slices`` (shard 1 first), or None."""
    merged: list[Any] = [None] * sum(map(len, slices))
    try:
        for number, part in enumerate(slices):
            merged[number :: len(slices)] = part
    except ValueError:  # a slice of another length
        return None
    return merged


def selection_hash(ids: Sequence[str]) -> str:
    """The identity of a selection: its ids in run order."""
    return stable_hash(list(ids))


def _baseline(stored: StoredBaseline | None) -> dict[str, Any] | None:
    """A stored baseline as the plan names it: its path and the hash of what was read (a
    shard compared with another file's content is another run)."""
    if stored is None:
        return None
    return {
        "path": stored.shown,
        "sha256": stable_hash(stored.document) if stored.document is not None else None,
        "error": stored.error,
        # a missing baseline's verdict names the baselines beside it (moved_from)
        "beside": stable_hash([list(b) for b in stored.beside]) if stored.beside else None,
    }


#: the options a verdict depends on (through the plan and its gates): every shard of a run
#: has the same, and the merge plans the whole run again from them. The others are each
#: shard's own (its server, outputs, cache, timing), and the base URL and the serve command
#: may hold secrets: none of them is written.
_PLANNED = (
    "model data dataset dataset_config split limit seed min_acc protocol samples temperature "
    "shots fewshot_file system api stop max_tokens extract answer_regex preset params baseline "
    "baseline_name max_drop alpha require_baseline baseline_partial max_unparsed max_truncated "
    "max_error repeats vllm_config resume"
)
PLANNED = tuple(_PLANNED.split())


def shard_record(
    plan: RunPlan, deselected: Sequence[str] = (), by: str = "", interrupted: bool = False
) -> dict[str, Any]:
    """The report's ``shard`` block: its place, its ids, what of them it did not run, and the
    run's plan (``plan.shard`` set); the run adds its ``clashes`` (core/tally.py)."""
    shard = plan.shard
    assert shard is not None
    configs = [
        {
            "name": g.name,
            "model_name": c.model_name,
            "protocol": g.protocol.identity(),
            "floor": [c.accuracy_threshold, c.tolerance],
            "baseline": _baseline(g.baseline),
        }
        for g in plan.groups
        if (c := g.config)
    ]
    return {
        "index": shard.index,
        "count": shard.count,
        "ids": [p.id for p in plan.problems],
        "deselected": list(deselected),
        "deselected_by": by,
        "interrupted": interrupted,
        "plan": {
            "settings": {key: getattr(plan.settings, key) for key in PLANNED},
            "snapshot_dirname": shard.snapshot_dirname,
            "selection": {"size": shard.size, "ids_hash": shard.ids_hash},
            "protocol": plan.protocol.identity(),
            "dataset": plan.split.identity(),
            "gates": asdict(plan.gates),
            "baseline": None if plan.configs else _baseline(plan.groups[0].baseline),
            "update_baseline": shard.update_baseline,
            "configs": configs,
        },
    }


def planned_settings(block: Mapping[str, Any], defaults: Settings) -> Settings:
    """The settings a shard's plan block states, over ``defaults``; else ShardError."""
    stored = block.get("settings")
    if not isinstance(stored, dict) or set(stored) != set(PLANNED):
        raise ShardError("corrupt shard plan (settings)")

    def plain(value: Any) -> Any:
        if isinstance(value, list):
            return tuple(map(plain, value))
        if value is not None and not isinstance(value, str | int | float):  # bool is an int
            raise ShardError(f"corrupt shard plan (a setting is {type(value).__name__})")
        return value

    return replace(defaults, **{key: plain(value) for key, value in stored.items()})


@dataclass(frozen=True)
class Merged:
    """Shards checked to be one run: its plan, every record."""

    plan: Mapping[str, Any]
    records: tuple[Mapping[str, Any], ...]
    clashes: Mapping[str, tuple[str, str]]  # problem id -> two node ids that disagree (tally)
    #: the problems a shard did not run (-k, -m, --lf), and the options that deselected them
    deselected: frozenset[str] = frozenset()
    deselected_by: str = ""
    #: a shard was interrupted before its end
    interrupted: bool = False


def _shard_of(report: Mapping[str, Any], where: str) -> tuple[int, int, list[str], Any]:
    block = report.get("shard")
    if not isinstance(block, dict):
        raise ShardError(f"{where}: not a shard's report (run with --gsm8k-shard I/N)")
    index, count, ids, plan = (block.get(k) for k in ("index", "count", "ids", "plan"))
    if not isinstance(index, int) or not isinstance(count, int) or not _strings(ids):
        raise ShardError(f"{where}: corrupt shard block (index, count, ids, plan)")
    if not 1 <= index <= count <= MAX_SHARDS or not isinstance(plan, dict):
        raise ShardError(f"{where}: corrupt shard block (index, count, ids, plan)")
    return index, count, ids, plan


def _strings(value: object) -> TypeGuard[list[str]]:
    """Texts UTF-8 can hold (the selection's hash encodes them; a lone surrogate it cannot)."""
    return isinstance(value, list) and all(
        isinstance(i, str) and escape_surrogates(i) == i for i in value
    )


def plan_difference(a: Any, b: Any, at: str = "plan") -> str:
    """Where two plans differ first, as a dotted path (``plan.gates.min_acc``)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if a.get(key) != b.get(key):
                return plan_difference(a.get(key), b.get(key), f"{at}.{key}")
    return at


def check_shards(reports: Sequence[tuple[str, Mapping[str, Any]]]) -> Merged:
    """The ``(where, report)`` pairs as the shards of one run, or :class:`ShardError` naming
    what is wrong (not a shard, other runs, a shard twice or missing, a problem twice)."""
    shards = [(where, *_shard_of(report, where), report) for where, report in reports]
    first, _, count, _, plan, _ = shards[0]
    by_index: dict[int, str] = {}
    for where, index, n, _, other, _ in shards:
        if n != count:
            raise ShardError(
                f"shards of different runs: {first} is a shard of {count}, {where} of {n}"
            )
        if other != plan:
            differ = plan_difference(plan, other)
            raise ShardError(f"shards of different runs: {first} and {where} differ in {differ}")
        if index in by_index:
            raise ShardError(f"shard {index} of {count} given twice: {by_index[index]} and {where}")
        by_index[index] = where
    missing = [str(i) for i in range(1, count + 1) if i not in by_index]
    if missing:
        given = ", ".join(map(str, sorted(by_index)))
        raise ShardError(
            f"shard{'s' * (len(missing) > 1)} {', '.join(missing)} of {count} missing: "
            f"no verdict on part of a run (given: {given})"
        )
    shards.sort(key=lambda shard: shard[1])
    selection = interleave([ids for _, _, _, ids, _, _ in shards])
    wanted = plan.get("selection")
    size = (len(selection), selection_hash(selection)) if selection is not None else None
    if not isinstance(wanted, dict) or size != (wanted.get("size"), wanted.get("ids_hash")):
        raise ShardError(
            f"the shards' problems are not the slices of their plan's selection "
            f"({', '.join(where for where, *_ in shards)}): shards of different runs, or "
            "of different data"
        )
    records: list[Mapping[str, Any]] = []
    seen: dict[object, str] = {}
    clashes: dict[str, tuple[str, str]] = {}
    blocks = [report["shard"] for *_, report in shards]
    for (where, index, _, ids, _, report), block in zip(shards, blocks, strict=True):
        own, left = set(ids), block.get("deselected", [])
        if not _strings(left) or not own.issuperset(left):
            raise ShardError(f"{where}: corrupt shard block (deselected)")
        pairs = block.get("clashes", {})
        if not isinstance(pairs, dict) or any(
            k not in own or not _strings(v) or len(v) != 2 for k, v in pairs.items()
        ):
            raise ShardError(f"{where}: corrupt shard block (clashes)")
        clashes |= {k: (v[0], v[1]) for k, v in pairs.items()}
        for record in report.get("problems") or ():
            pid = record.get("id")
            shown = repr(str(pid)[:80])
            if pid in seen:
                raise ShardError(f"problem {shown} is in two shards: {seen[pid]} and {where}")
            if pid not in own:
                raise ShardError(f"{where}: problem {shown} is not in shard {index}'s slice")
            _check_record(record, where)
            seen[pid] = where
            records.append(record)
    return Merged(
        plan,
        tuple(records),
        clashes,
        frozenset(pid for b in blocks for pid in b.get("deselected", [])),
        next((str(b.get("deselected_by")) for b in blocks if b.get("deselected")), ""),
        any(b.get("interrupted") is True for b in blocks),
    )


#: what each record holds, as the verdict and the outputs read it (report.schema.json's
#: required fields): a shard's report is untrusted input, checked before anything reads it
_NONE = type(None)
RECORD_TYPES: dict[str, tuple[type, ...]] = {"rules": (dict,), "samples": (list,), "usage": (dict,)}
RECORD_TYPES |= dict.fromkeys(("gold", "response"), (str,))
RECORD_TYPES |= dict.fromkeys(("index", "n_samples", "n_correct", "cached"), (int,))
RECORD_TYPES |= dict.fromkeys(("extracted", "model", "error"), (str, _NONE))
SAMPLE_TYPES: dict[str, tuple[type, ...]] = {"text": (str,), "extracted": (dict,)}
SAMPLE_TYPES |= dict.fromkeys(("correct", "truncated"), (bool,))
SAMPLE_TYPES |= dict.fromkeys(("finish_reason", "reasoning"), (str, _NONE))


def _check_record(record: Mapping[str, Any], where: str) -> None:
    """A record's fields beyond what compare's reader checked, by type; else ShardError."""
    at = f"{where}: corrupt record of {str(record.get('id'))[:80]!r}"

    def typed(value: Mapping[str, Any], fields: Mapping[str, tuple[type, ...]]) -> None:
        for field, types in fields.items():
            if not isinstance(value.get(field, ...), types):
                raise ShardError(f"{at} ({field})")

    typed(record, RECORD_TYPES)
    for sample in record["samples"]:
        if not isinstance(sample, dict):
            raise ShardError(f"{at} (samples)")
        typed(sample, SAMPLE_TYPES)
    rules = all(isinstance(v, bool) for v in record["rules"].values())
    if not rules or not all(isinstance(v, int) and v >= 0 for v in record["usage"].values()):
        raise ShardError(f"{at} (rules or usage)")
