"""What the aggregating process learns as a run goes (the records, the collected items, the
early stops, the verdict), and the verdict step's inputs gathered from it. Pure: the
pytest layer feeds it, ``python -m pytest_gsm8k merge`` too."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.dataset import subset_record
from pytest_gsm8k.core.early_stop import EarlyStop
from pytest_gsm8k.core.plan import RunPlan, StoredBaseline
from pytest_gsm8k.core.presets import takes_first
from pytest_gsm8k.core.records import ProblemRecord
from pytest_gsm8k.core.scrub import Scrubber, shown_url
from pytest_gsm8k.core.settings import DEFAULT_BASE_URL
from pytest_gsm8k.core.types import Problem, stable_hash

if TYPE_CHECKING:
    from pytest_gsm8k.core.verdict import EarlyOutcome, Group, GroupInput, RunVerdict


@dataclass(frozen=True)
class ItemRef:
    """One collected item: its node id and its location for reports."""

    nodeid: str
    location: tuple[str, int | None, str]

    @classmethod
    def of(cls, nodeid: str) -> ItemRef:
        """An item known by its node id only (an xdist controller collects nothing)."""
        path, _, domain = nodeid.partition("::")
        return cls(nodeid, (path, None, domain))


class Tally:
    """What the run learns as it goes, on the process that aggregates (the controller, or
    the only process); a worker uses only :attr:`collected`. Changed through its methods."""

    def __init__(self, started: float | None = None) -> None:
        #: when the run started (what --gsm8k-resume reads)
        self.started = time.time() if started is None else started
        #: the problems this process collected, in run order (None until collection ends)
        self.collected: tuple[Problem, ...] | None = None
        #: the problem ids collected (an xdist controller: the workers')
        self.collected_ids: frozenset[str] | None = None
        self.records: dict[str, ProblemRecord] = {}
        #: every collected item, in run order (the workers' under xdist)
        self.items: tuple[ItemRef, ...] = ()
        #: node id -> its GSM8K problem's id (under xdist from the reports and the workers'
        #: output, never parsed out of the node id)
        self.problem_of: dict[str, str] = {}
        #: node ids of the items that sent a report: the others were never run
        self.reported: set[str] = set()
        self.interrupted = False
        #: the endpoint failure that stopped the run (every unfinished item shares it)
        self.aborted: str | None = None
        #: a data problem found while parametrizing, raised as one line after collection
        self.data_error: str | None = None
        #: --gsm8k-early-stop, by group ("" the run's, else a config's); None: nothing to decide
        self.early: dict[str, EarlyStop | None] = {}
        #: the groups stopped early: name -> the message their items not run end with
        self.stopped: dict[str, str] = {}
        self.verdict: RunVerdict | None = None

    def collect(self, problems: Sequence[Problem]) -> None:
        self.collected = tuple(problems)
        self.collected_ids = frozenset(p.id for p in problems)

    def learn_collected_ids(self, ids: Iterable[str]) -> None:
        """xdist controller: the workers' collected problems (it collects nothing itself)."""
        ids = frozenset(ids)
        if self.collected_ids is None and ids:
            self.collected_ids = ids

    def collect_items(self, items: Sequence[ItemRef], problems: Mapping[str, str] = {}) -> None:
        """The collected items (once: every xdist worker collects the same ones) and the
        problem of each GSM8K item."""
        if not self.items:
            self.items = tuple(items)
        self.problem_of.update(problems)

    def note_report(self, nodeid: str, problem_id: str | None) -> None:
        self.reported.add(nodeid)
        if problem_id:
            self.problem_of[nodeid] = problem_id

    def unreported(self) -> list[ItemRef]:
        """The collected items no report came for (the run stopped before them)."""
        return [item for item in self.items if item.nodeid not in self.reported]

    def add_record(self, record: ProblemRecord) -> bool:
        """Keep ``record`` (the first one per problem wins); whether it was new."""
        fresh = record["id"] not in self.records
        self.records.setdefault(record["id"], record)
        if record["outcome"] == "error" and record.get("aborted"):
            self.aborted = str(record["error"])
        return fresh

    def interrupt(self) -> None:
        self.interrupted = True

    def fail_data(self, message: str) -> None:
        self.data_error = message

    def start_early_stop(self, name: str, early: EarlyStop | None) -> None:
        self.early[name] = early

    def stop_early(self, name: str, message: str) -> None:
        self.stopped[name] = message

    @property
    def early_stopped(self) -> str | None:
        """The message the early stop ended the whole run with (a run of one group)."""
        return self.stopped.get("")

    def finish(self, verdict: RunVerdict) -> None:
        self.verdict = verdict

    # the verdict's inputs

    def wanted(self, plan: RunPlan) -> list[Problem]:
        """What this run set out to do: the selected problems it collected, after -k/-m/--lf
        deselection (all of the selection until collection says otherwise)."""
        ids = self.collected_ids
        return [p for p in plan.problems if ids is None or p.id in ids]

    def gather(
        self,
        plan: RunPlan,
        *,
        late: dict[str, ProblemRecord],
        servers: dict[str, dict[str, Any]],
        server: dict[str, Any] | None,
        scrub: Scrubber,
        deselected_by: str,
    ) -> tuple[list[GroupInput], Group | None, list[str]]:
        """What the verdict step decides on (core/verdict.py), as plain data: each group's
        facts, records (``late``: answers that arrived for items the run no longer
        reached, scored), selection, baseline and early stop; with ``--gsm8k-config`` the
        matrix's top and the configs deselected whole."""
        from pytest_gsm8k.core.outcome import error_record
        from pytest_gsm8k.core.verdict import BaselineInput, Group, GroupInput, Selection

        settings = plan.settings
        split = plan.split
        wanted = self.wanted(plan)

        def baseline(stored: StoredBaseline | None, problems: Sequence[Problem]) -> Any:
            if stored is None:
                return None
            return BaselineInput(
                stored,
                tuple(problems),
                update=plan.update_baseline,
                partial_ok=settings.baseline_partial,
                named=bool(settings.baseline or settings.baseline_name),
                repeats=settings.repeats,
            )

        def selection(ran: Sequence[Problem], of: int, unreached: int = 0) -> Selection:
            return Selection(
                tuple(p.id for p in ran),
                deselected=of - len(ran),
                deselected_by=deselected_by,
                interrupted=self.interrupted,
                unreached=unreached,
                resumed=settings.resume,
                shard=(plan.shard.index, plan.shard.count) if plan.shard else None,
            )

        # --gsm8k-shard: what the merge needs beside the records (core/merge.py)
        shard: dict[str, Any] = {}
        if plan.shard is not None:
            from pytest_gsm8k.core.merge import shard_record

            ids = {p.id for p in wanted}
            shard["shard"] = shard_record(
                plan,
                deselected=[p.id for p in plan.problems if p.id not in ids],
                deselected_by=deselected_by,
                interrupted=self.interrupted,
            )

        if not plan.groups:
            records = dict(self.records)
            unreached = 0
            if self.aborted:
                # The run stopped at the first item the failure reached; answers that had
                # come in for later items (out of order) are scored, not thrown away.
                for problem in wanted:
                    if problem.id not in records:
                        arrived = late.get(problem.id)
                        unreached += arrived is None
                        records[problem.id] = arrived or error_record(problem, self.aborted)
            selected = plan.problems
            where = "served" if settings.serve else "local_server"
            extra = {where: server} if server is not None else {}
            extra |= shard
            group = Group(
                name="",
                label=plan.protocol.label,
                protocol=plan.protocol.identity(),
                protocol_label=plan.protocol.label,
                dataset=split.identity(),
                subset=subset_record(
                    limit=settings.limit if len(selected) < len(split.problems) else None,
                    seed=settings.seed,
                    of=len(split.problems),
                    ids_hash=_ids_hash(selected),
                    deselected=len(selected) - len(wanted),
                    first=takes_first(settings.preset),
                ),
                model=plan.endpoint.model
                or _most_common(records, "model")
                or "(gsm8k_model fixture)",
                endpoint=_most_common(records, "endpoint")
                or shown_url(plan.endpoint.base_url or DEFAULT_BASE_URL),
                specs=plan.gates,
                extra=extra,
                report=settings.report or "",
            )
            run = GroupInput(
                group,
                tuple(records.values()),
                selection(wanted, len(selected), unreached),
                baseline(plan.baseline, split.problems),
                _early(self.early.get(""), "" in self.stopped),
            )
            return [run], None, []
        ids = {p.id for p in wanted}
        inputs: list[GroupInput] = []
        for planned in plan.groups:
            config = planned.config
            ran = [p for p in planned.problems if p.id in ids]
            if not ran:
                continue  # deselected whole (-k, -m): its server never started, nothing to gate
            found: dict[str, ProblemRecord] = {}
            for problem in ran:
                record = self.records.get(problem.id) or late.get(problem.id)
                if record is None and self.aborted:
                    record = error_record(problem, self.aborted)
                if record is not None:
                    found[problem.id] = record
            served = servers.get(planned.name)
            block = {
                "name": config.name,
                "source": config.source,
                "model_name": config.model_name,
                "accuracy_threshold": config.accuracy_threshold,
                "tolerance": config.tolerance,
                "num_questions": config.num_questions,
                "num_fewshot": config.num_fewshot,
                "server_args": scrub.words(config.server_args),
                "env": sorted(key for key, _ in config.env),
                "fields": list(config.given),
            }
            group = Group(
                name=config.name,
                label=planned.label,
                protocol=planned.protocol.identity(),
                protocol_label=planned.protocol.label,
                dataset=split.identity(),
                subset={
                    "limit": config.num_questions
                    if config.num_questions < len(split.problems)
                    else None,
                    "first": True,
                    "seed": None,
                    "of": len(split.problems),
                    "ids_hash": _ids_hash(planned.problems),
                    "deselected": len(planned.problems) - len(ran),
                },
                model=config.model_name,
                endpoint=str((served or {}).get("base_url") or "(its server did not start)"),
                specs=plan.gates,
                floor=planned.floor,
                extra={"config": scrub.obj(block)}
                | ({"served": served} if served is not None else {}),
                report=settings.report or "",
            )
            inputs.append(
                GroupInput(
                    group,
                    tuple(found.values()),
                    selection(ran, len(planned.problems)),
                    baseline(planned.baseline, planned.split_problems(split)),
                    _early(self.early.get(planned.name), planned.name in self.stopped),
                )
            )
        first = plan.groups[0].protocol
        top = Group(
            name="",
            label=f"{len(plan.groups)} vLLM configs",
            protocol=first.identity(),
            protocol_label=first.label,
            dataset=split.identity(),
            subset={
                "limit": None,
                "seed": None,
                "of": len(split.problems),
                "ids_hash": _ids_hash(plan.problems),
                "deselected": len(plan.problems) - len(wanted),
            },
            model=", ".join(g.config.model_name for g in plan.groups),
            endpoint="(one server per config)",
            specs=plan.gates,
            extra=shard,
        )
        shown = {i.group.name for i in inputs}
        return inputs, top, [g.name for g in plan.groups if g.name not in shown]

    def early_stop(self, plan: RunPlan, name: str = "") -> EarlyStop | None:
        """Group ``name``'s early stop ("" the run's), over the problems it set out to do;
        its noise-aware gate uses the stored baseline only where the end of the run may
        compare with it (not with --snapshot-update, not a refused one)."""
        settings = plan.settings
        wanted = {p.id for p in self.wanted(plan)}
        group = plan.group_by_name[name] if name else None
        here: dict[str, Any] = {"dataset": plan.split.identity()}
        if group is None:
            problems, stored, split = plan.problems, plan.baseline, plan.split.problems
            here["protocol"] = {**plan.protocol.identity(), "label": plan.protocol.label}
            floor, seed = None, settings.seed
        else:
            # a config is decided by the certain bounds only (no order counts there)
            problems, stored, split = (
                group.problems,
                group.baseline,
                group.split_problems(plan.split),
            )
            here["protocol"] = {**group.protocol.identity(), "label": group.label}
            here["config"] = {"name": group.name, "model_name": group.config.model_name}
            floor, seed = group.floor, 0
        document = None
        if stored is not None and stored.exists and not plan.update_baseline:
            with contextlib.suppress(bl.BaselineError):
                document = bl.check(stored, here, split)["problems"]
        return EarlyStop.for_group(
            [p.id for p in problems if p.id in wanted],
            plan.gates,
            mode=settings.early_stop,  # type: ignore[arg-type]
            floor=floor,
            baseline=document,
            seed=seed,
            alpha=settings.early_stop_alpha,
            repeats=settings.repeats,
        )


def _early(early: EarlyStop | None, stopped: bool) -> EarlyOutcome | None:
    """The early stop as the verdict step takes it: frozen, its decision and its lines."""
    from pytest_gsm8k.core.verdict import EarlyOutcome

    if early is None:
        return None
    decision = early.decision
    return EarlyOutcome(
        mode=early.mode,
        decided=decision is not None,
        stopped=decision is not None and stopped,
        verdicts=dict(decision.verdicts) if decision is not None else {},
        headline=early.headline(),
        n_total=early.n_total,
        record=early.to_json(),
    )


def _most_common(records: dict[str, ProblemRecord], key: str) -> str | None:
    counts = Counter(str(r.get(key)) for r in records.values() if r.get(key))
    return counts.most_common(1)[0][0] if counts else None


def _ids_hash(problems: Sequence[Problem]) -> str:
    return stable_hash([p.id for p in problems])[:16]
