"""What the aggregating process learns as a run goes, and the verdict step's inputs gathered
from it. Pure: the pytest layer feeds it, ``python -m pytest_gsm8k merge`` too."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.early_stop import EarlyStop
from pytest_gsm8k.core.plan import PlanGroup, RunPlan
from pytest_gsm8k.core.records import ProblemRecord
from pytest_gsm8k.core.scrub import Scrubber, clip, shown_url
from pytest_gsm8k.core.settings import DEFAULT_BASE_URL
from pytest_gsm8k.core.types import Problem, stable_hash

if TYPE_CHECKING:
    from pytest_gsm8k.core.verdict import EarlyOutcome, Group, GroupInput, RunVerdict


#: an item's place, as pytest's ``item.location`` (file, line, name)
Location = tuple[str, int | None, str]


class Tally:
    """What the aggregating process learns; a worker uses only :attr:`collected`."""

    def __init__(self, started: float | None = None) -> None:
        self.started = time.time() if started is None else started  # what --gsm8k-resume reads
        self.collected: tuple[Problem, ...] | None = None  # in run order, once collected
        self.collected_ids: frozenset[str] | None = None  # an xdist controller: the workers'
        self.records: dict[str, ProblemRecord] = {}
        self.answered_by: dict[str, str] = {}  # problem id -> the node id of its kept record
        self.clashes: dict[str, tuple[str, str]] = {}  # problem id -> two node ids that disagree
        #: every collected item's location by node id (the workers' under xdist)
        self.items: dict[str, Location] = {}
        #: node id -> its problem's id, from the reports and workers (never parsed out of it)
        self.problem_of: dict[str, str] = {}
        self.reported: set[str] = set()  # node ids that sent a report: the others never ran
        self.interrupted = self.doubled = False  # doubled: two items ask one problem (no stop)
        self.aborted: str | None = None  # the endpoint failure that stopped the run
        self.data_error: str | None = None  # found while parametrizing: one line after it
        self.early: dict[str, EarlyStop | None] = {}  # by group ("" the run's, else a config's)
        self.stopped: dict[str, str] = {}  # groups stopped early ("" the run) -> the message
        self.verdict: RunVerdict | None = None

    def collect(self, problems: Sequence[Problem]) -> None:
        self.collected = tuple(problems)
        self.collected_ids = frozenset(p.id for p in problems)

    def learn_collected_ids(self, ids: Iterable[str]) -> None:  # an xdist controller's
        if self.collected_ids is None:
            self.collected_ids = frozenset(ids) or None

    def collect_items(self, items: Mapping[str, Location], problems: Mapping[str, str]) -> None:
        """The collected items (once: every xdist worker collects the same ones)."""
        if not self.items:
            self.items = dict(items)
        self.problem_of.update(problems)
        self.doubled = self.doubled or len(set(problems.values())) < len(problems)

    def note_report(self, nodeid: str, problem_id: str | None) -> None:
        self.reported.add(nodeid)
        if problem_id:
            self.problem_of[nodeid] = problem_id

    def unreported(self) -> list[tuple[str, Location]]:
        return [(nodeid, at) for nodeid, at in self.items.items() if nodeid not in self.reported]

    def add_record(self, record: ProblemRecord, nodeid: str = "") -> bool:
        """Keep one record per problem, the lowest node id's (not the first to arrive: timing
        under xdist), whether new. Two tests' that disagree (a user's test beside the built-in
        one) are a clash: no gate rests on either. A rerun (the same node id) keeps its first."""
        pid, fresh = record["id"], record["id"] not in self.records
        kept, by = self.records.get(pid, record), self.answered_by.get(pid, nodeid)
        if by != nodeid and [kept.get(k) for k in _ANSWER] != [record.get(k) for k in _ANSWER]:
            self.clashes.setdefault(pid, (min(by, nodeid), max(by, nodeid)))
        if fresh or nodeid < by:
            self.records[pid], self.answered_by[pid] = record, nodeid
        if record["outcome"] == "error" and record.get("aborted"):
            self.aborted = str(record["error"])
        return fresh

    def interrupt(self) -> None:
        self.interrupted = True

    def fail_data(self, message: str) -> None:
        self.data_error = message

    def stop_early(self, name: str, message: str) -> None:
        self.stopped[name] = message

    def finish(self, verdict: RunVerdict) -> None:
        self.verdict = verdict

    def wanted(self, plan: RunPlan) -> list[Problem]:
        """The selected problems collected (after -k/-m/--lf; all until collection ends)."""
        ids = self.collected_ids
        return [p for p in plan.problems if ids is None or p.id in ids]

    def gather(
        self,
        plan: RunPlan,
        *,
        late: dict[str, ProblemRecord],
        servers: Mapping[str, dict[str, Any] | None],
        scrub: Scrubber,
        deselected_by: str,
    ) -> tuple[list[GroupInput], Group | None]:
        """Each group's facts, records (``late``: answers that arrived for items an aborted
        run no longer reached, scored), selection, baseline and early stop for the verdict
        step (``servers``: the one each group ran on, by name); with ``--gsm8k-config`` the
        matrix's top, which names the configs deselected whole."""
        from pytest_gsm8k.core.merge import shard_record
        from pytest_gsm8k.core.outcome import error_record
        from pytest_gsm8k.core.verdict import BaselineInput, Group, GroupInput, Selection

        settings, split, aborted = plan.settings, plan.split, self.aborted
        ids, of = {p.id for p in self.wanted(plan)}, len(split.problems)
        shard: dict[str, Any] = {}  # the node ids of clashes are user text: cut, scrubbed
        cut = {n: clip(scrub.text(n)) for pair in self.clashes.values() for n in pair}
        clashes = {k: (cut[a], cut[b]) for k, (a, b) in self.clashes.items()}
        if plan.shard is not None:  # what the merge needs beside the records (core/merge.py)
            left = [p.id for p in plan.problems if p.id not in ids]
            shard["shard"] = shard_record(plan, left, deselected_by, self.interrupted)
            shard["shard"]["clashes"] = clashes

        def group(planned: PlanGroup, **facts: Any) -> Group:
            problems = planned.problems
            deselected = sum(p.id not in ids for p in problems)
            ids_hash = stable_hash([p.id for p in problems])[:16]
            return Group(
                name=planned.name,
                label=facts.pop("label", planned.label),
                protocol=planned.protocol.identity(),
                protocol_label=planned.protocol.label,
                dataset=split.identity(),
                subset={**planned.subset, "of": of, "ids_hash": ids_hash, "deselected": deselected},
                specs=plan.gates,
                floor=planned.floor,
                report=settings.report or "",
                **facts,
            )

        inputs: list[GroupInput] = []
        for planned in plan.groups:
            config, served = planned.config, servers.get(planned.name)
            ran = [p for p in planned.problems if p.id in ids]
            if config is not None and not ran:
                continue  # deselected whole (-k, -m): its server never started, nothing to gate
            found = {p.id: self.records[p.id] for p in ran if p.id in self.records}
            if config is None:  # the run's own: its endpoint, the model it asked or was told
                model = plan.endpoint.model or _most_common(found, "model")
                where = "served" if settings.serve else "local_server"
                extra = ({where: served} if served is not None else {}) | shard
                endpoint = _most_common(found, "endpoint")
                endpoint = endpoint or shown_url(plan.endpoint.base_url or DEFAULT_BASE_URL)
            else:
                block = {key: getattr(config, key) for key in _CONFIG_FIELDS.split()}
                block["server_args"] = scrub.words(config.server_args)
                block |= {"env": sorted(key for key, _ in config.env), "fields": list(config.given)}
                extra = {"config": scrub.obj(block)}
                extra |= {"served": served} if served is not None else {}
                model = config.model_name
                endpoint = str((served or {}).get("base_url") or "(its server did not start)")
            model = model or "(gsm8k_model fixture)"
            g = group(planned, model=model, endpoint=endpoint, extra=extra)
            unreached = 0
            for problem in ran if aborted else ():
                # the run stopped at the first item the failure reached; answers that had
                # come in for later items (out of order) are scored, not thrown away
                if aborted and problem.id not in found:
                    unreached += problem.id not in late
                    found[problem.id] = late.get(problem.id) or error_record(problem, aborted)
            selection = Selection(
                tuple(p.id for p in ran),
                deselected=len(planned.problems) - len(ran),
                deselected_by=deselected_by,
                interrupted=self.interrupted,
                unreached=0 if config else unreached,
                resumed=settings.resume,
                shard=(plan.shard.index, plan.shard.count) if plan.shard else None,
                clashes=tuple((p.id, *clashes[p.id]) for p in ran if p.id in clashes),
            )
            named = bool(settings.baseline or settings.baseline_name)
            rules = (plan.update_baseline, settings.baseline_partial, named, settings.repeats)
            stored, whole = planned.baseline, planned.split_problems(split)
            baseline = None if stored is None else BaselineInput(stored, whole, *rules)
            early = _early(self.early.get(g.name), g.name in self.stopped, self.doubled)
            inputs.append(GroupInput(g, tuple(found.values()), selection, baseline, early))
        if not plan.configs:
            return inputs, None
        shown = {i.group.name for i in inputs}
        not_run = [name for name in plan.configs if name not in shown]
        top = group(
            PlanGroup("", plan.protocol, plan.problems, {"limit": None, "seed": None}),
            label=f"{len(plan.groups)} vLLM configs",
            model=", ".join(c.model_name for c in plan.configs.values()),
            endpoint="(one server per config)",
            extra=shard | {"not_run": not_run},
        )
        return inputs, top

    def early_stop(self, plan: RunPlan, name: str) -> EarlyStop | None:
        """Group ``name``'s early stop ("" the run's), made on first ask over the problems it
        set out to do; its noise-aware gate uses the stored baseline only where the end of
        the run may compare with it (not with --snapshot-update, not a refused one)."""
        group = plan.group_by_name.get(name)
        if group is None or name in self.early or self.collected_ids is None:
            # not knowing which problems the workers collected (an xdist controller learns
            # them from each worker's first report), the stop could not count them
            return self.early.setdefault(name, None)
        here = {"dataset": plan.split.identity(), "protocol": group.protocol.identity()}
        if group.config is not None:
            here["config"] = {"name": group.name, "model_name": group.config.model_name}
        document, stored, split = None, group.baseline, group.split_problems(plan.split)
        if stored is not None and stored.exists and not plan.update_baseline:
            with contextlib.suppress(bl.BaselineError):
                document = bl.check(stored, here, split)["problems"]
        wanted = {p.id for p in self.wanted(plan)}
        ids = [p.id for p in group.problems if p.id in wanted]
        self.early[name] = EarlyStop.for_group(ids, plan, group, document)
        return self.early[name]


def _early(early: EarlyStop | None, stopped: bool, doubled: bool) -> EarlyOutcome | None:
    """The early stop as the verdict step takes it: frozen, its decision and its lines."""
    from pytest_gsm8k.core.verdict import EarlyOutcome

    if early is None:
        return None
    stopped = stopped and early.decision is not None
    why = "two tests ask a problem" if doubled else "every answer had arrived"
    return EarlyOutcome(early.to_json(), early.headline(stopped), stopped, why)


#: what two records of one problem must share to be one answer (the fields a verdict reads)
_ANSWER = ("outcome", "correct", "extracted", "model", "n_samples", "n_correct", "repeats")
_CONFIG_FIELDS = "name source model_name accuracy_threshold tolerance num_questions num_fewshot"


def _most_common(records: dict[str, ProblemRecord], key: str) -> str | None:
    counts = Counter(str(r.get(key)) for r in records.values() if r.get(key))
    return counts.most_common(1)[0][0] if counts else None
