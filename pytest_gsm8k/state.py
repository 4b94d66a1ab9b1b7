"""What one pytest process holds of a GSM8K run, each part owned by one object.

* :class:`~pytest_gsm8k.core.plan.RunPlan`: what the run will do, frozen, built once
  (:mod:`pytest_gsm8k.runtime.planning`) and only read after that;
* :class:`~pytest_gsm8k.sources.Sources`: where answers come from (engines, the xdist
  controller's channel, the server this run started); the only one that closes them;
* :class:`Run`: what the run learns as it goes: which problems were collected, the
  records, the early-stop decision, the summary, the outputs' fate.

:class:`State` ties the three to the process (its config, settings and xdist role).
Nothing outside these classes assigns their attributes: they change through methods.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gsm8k import STATE_NAME
from pytest_gsm8k.core.dataset import subset_record
from pytest_gsm8k.core.plan import Endpoint, RunPlan, StoredBaseline
from pytest_gsm8k.core.presets import takes_first
from pytest_gsm8k.core.records import ProblemRecord
from pytest_gsm8k.core.scrub import Scrubber, command_secrets, shown_url
from pytest_gsm8k.core.settings import DEFAULT_BASE_URL, Settings
from pytest_gsm8k.core.types import Problem, stable_hash
from pytest_gsm8k.sources import SourceContext, Sources

if TYPE_CHECKING:
    from pytest_gsm8k.core.early_stop import EarlyStop
    from pytest_gsm8k.core.verdict import EarlyOutcome, Group, GroupInput, RunVerdict, Selection
    from pytest_gsm8k.runtime.outputs import Output

RECORD_KEY = pytest.StashKey[ProblemRecord]()

#: descriptors kept free of the concurrency's sockets: pytest's own files, the cache's
#: writes, the imports, the report and the page at the end (plus a few per xdist worker)
DESCRIPTOR_RESERVE = 64
DESCRIPTOR_PER_WORKER = 4


@dataclass(frozen=True)
class ItemRef:
    """One collected item as the aggregating process knows it: its node id, the GSM8K
    problem it runs (None: a test without one) and its location for reports."""

    nodeid: str
    problem_id: str | None
    location: tuple[str, int | None, str]


def run_dir_for(run_id: str) -> Path:
    """Where the run with this id keeps its private files (not created here)."""
    return Path(tempfile.gettempdir()) / f"gsm8k-run-{run_id}"


class Run:
    """What the run learns as it goes, on the process that aggregates (the controller, or
    the only process); a worker uses only :attr:`collected`."""

    def __init__(self, started: float | None = None) -> None:
        #: when the run started (an xdist worker: when its controller did)
        self.started = time.time() if started is None else started
        #: the problems this process collected, in run order (None until collection ends)
        self.collected: tuple[Problem, ...] | None = None
        #: xdist controller: the problem ids the workers collected
        self.collected_ids: frozenset[str] | None = None
        self.records: dict[str, ProblemRecord] = {}
        #: every collected item, in run order (the workers' under xdist)
        self.items: tuple[ItemRef, ...] = ()
        #: node ids of the items that sent a report: the others were never run
        self.reported: set[str] = set()
        self.interrupted = False
        #: the endpoint failure that stopped the run (every unfinished item shares it)
        self.aborted: str | None = None
        #: a data problem found while parametrizing, raised as one line after collection
        self.data_error: str | None = None
        #: --gsm8k-early-stop: each group's (the run's "", or each config's by name; None:
        #: nothing to decide), made at its first outcome
        self.early: dict[str, EarlyStop | None] = {}
        #: the groups stopped early: name -> the message their items not run end with
        self.stopped: dict[str, str] = {}
        #: the run's verdict, once decided (every output renders from it)
        self.verdict: RunVerdict | None = None
        #: the run's outputs checked at session start, by key (report, html, markdown, step_summary)
        self.outputs: dict[str, Output] = {}
        #: outputs that could not be written at the end: key -> the one line saying why
        self.output_errors: dict[str, str] = {}

    # what collection found

    def collect(self, problems: Sequence[Problem]) -> None:
        self.collected = tuple(problems)
        self.collected_ids = frozenset(p.id for p in problems)

    def learn_collected_ids(self, ids: set[str]) -> None:
        """xdist controller: the workers' collected problems (it collects nothing itself)."""
        if self.collected_ids is None and ids:
            self.collected_ids = frozenset(ids)

    def collect_items(self, items: Sequence[ItemRef]) -> None:
        """The collected items (once: every xdist worker collects the same ones)."""
        if not self.items:
            self.items = tuple(items)

    # what the items report

    def note_report(self, nodeid: str) -> None:
        self.reported.add(nodeid)

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

    def add_output(self, key: str, output: Output) -> None:
        self.outputs[key] = output

    def output_failed(self, key: str, message: str) -> None:
        self.output_errors[key] = message

    def close(self) -> None:
        for output in self.outputs.values():
            output.close()
        self.outputs.clear()

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


class State:
    """One pytest process's part of the run: its settings and role, the plan (once), the
    answer sources and the run."""

    def __init__(self, config: pytest.Config, settings: Settings) -> None:
        self.config = config
        self.settings = settings
        self.workerinput: dict[str, Any] | None = getattr(config, "workerinput", None)
        self.is_worker = self.workerinput is not None
        if self.workerinput is not None:
            self.run_id = str(self.workerinput["gsm8k_run_id"])
            self.workers = int(self.workerinput.get("workercount", 1))
        else:
            self.run_id = uuid.uuid4().hex
            self.workers = 1
        self._plan: RunPlan | None = None
        self._run_dir: Path | None = None
        self._room: tuple[int, int] | None = None
        self._room_measured = False
        # an xdist worker's run started when its controller did (what --gsm8k-resume reads)
        started = (self.workerinput or {}).get("gsm8k_run_started")
        self.run = Run(None if started is None else float(started))
        self.sources = Sources(
            SourceContext(
                settings=settings,
                config=config,
                run_id=self.run_id,
                started=self.run.started,
                is_worker=self.is_worker,
                plan=lambda: self.plan,
                endpoint=self.endpoint,
                collected=lambda: self.run.collected,
                run_dir=lambda: self.run_dir,
                concurrency=self.concurrency,
                scrubber=self.scrubber,
            )
        )

    # the plan

    @property
    def planned(self) -> bool:
        return self._plan is not None

    @property
    def plan(self) -> RunPlan:
        """The run's plan; built here on first use where nothing built it before (an xdist
        worker, a run of a user's own tests). Raises DatasetError for unusable data."""
        if self._plan is None:
            self.set_plan(self.build_plan(self.default_endpoint()))
        assert self._plan is not None
        return self._plan

    def set_plan(self, plan: RunPlan) -> None:
        """Publish the plan, once: after this it is only read."""
        if self._plan is not None:
            raise RuntimeError("the run's plan is built once")
        self._plan = plan

    def build_plan(self, endpoint: Endpoint) -> RunPlan:
        from pytest_gsm8k.runtime.planning import build_plan

        option = self.config.option
        return build_plan(
            self.settings,
            run_id=self.run_id,
            endpoint=endpoint,
            rootpath=self.config.rootpath,
            snapshot_dirname=str(getattr(option, "snapshot_dirname", None) or "__snapshots__"),
            update_baseline=bool(getattr(option, "update_snapshots", False)),
        )

    def default_endpoint(self) -> Endpoint:
        """The endpoint the options name; a worker's comes from the controller, which may
        have started the server and asked it what it serves."""
        settings = self.settings
        if self.workerinput is not None:
            return Endpoint(
                base_url=self.workerinput.get("gsm8k_base_url") or settings.resolved_base_url(),
                model=self.workerinput.get("gsm8k_model") or settings.model,
                identity=self.workerinput.get("gsm8k_server_identity"),
            )
        return Endpoint(base_url=settings.resolved_base_url(), model=settings.model)

    def endpoint(self) -> Endpoint:
        """The plan's endpoint, or the options' before there is a plan (session start)."""
        return self._plan.endpoint if self._plan is not None else self.default_endpoint()

    # what the process may use

    @property
    def run_dir(self) -> Path:
        """The run's private folder (the per-run cache), shared by the xdist workers
        through the run id; made on first use only, so a session without GSM8K items
        leaves no trace."""
        if self._run_dir is None:
            path = run_dir_for(self.run_id)
            path.mkdir(mode=0o700, exist_ok=True)
            self._run_dir = path
        return self._run_dir

    def scrubber(self) -> Scrubber:
        """What removes this run's secrets from outside text: the key, URL credentials,
        ``VLLM_API_KEY``, and what ``--gsm8k-serve`` and each config give a server as a
        secret (``--api-key X``, an ``env`` token), which the server prints."""
        settings = self.settings
        others = [os.environ.get("VLLM_API_KEY", ""), *command_secrets(settings.serve or "")]
        for group in self._plan.groups if self._plan is not None else ():
            others += group.config.secrets()
        return Scrubber(settings.api_key(), self.endpoint().base_url, others)

    def concurrency(self) -> int:
        """The run's limit; split over the xdist workers only where each fetches itself,
        and never more sockets than the open-file limit leaves room for."""
        wanted = max(1, math.ceil(self.settings.concurrency / max(1, self.workers)))
        room = self.descriptor_room()
        return wanted if room is None else max(1, min(wanted, room[0]))

    def descriptor_room(self) -> tuple[int, int] | None:
        """(sockets this process may open for requests, the open-file limit), measured
        once; None when the limit is unlimited or unknown."""
        if not self._room_measured:
            from pytest_gsm8k.runtime.files import descriptor_room

            self._room_measured = True
            workers = getattr(self.config.option, "numprocesses", None)
            spawned = workers if isinstance(workers, int) and not self.is_worker else 0
            self._room = descriptor_room(DESCRIPTOR_RESERVE + DESCRIPTOR_PER_WORKER * spawned)
        return self._room

    def close(self) -> None:
        self.run.close()
        self.sources.close()
        if not self.is_worker:
            shutil.rmtree(run_dir_for(self.run_id), ignore_errors=True)


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


def get_state(config: pytest.Config) -> State:
    """This process's State (registered by the plugin in pytest_configure)."""
    plugin = config.pluginmanager.get_plugin(STATE_NAME)
    state = getattr(plugin, "state", None)
    if not isinstance(state, State):
        raise pytest.UsageError("gsm8k: pytest-gsm8k is not configured (-p no:gsm8k?)")
    return state


def deselected_by(config: pytest.Config) -> str:
    """The options that may have deselected problems, as the command line spells them."""
    option = config.option
    named = [
        flag
        for flag, given in (
            ("-k", getattr(option, "keyword", "")),
            ("-m", getattr(option, "markexpr", "")),
            ("--lf", getattr(option, "lf", False)),
            ("--deselect", getattr(option, "deselect", None)),
        )
        if given
    ]
    return ", ".join(named) or "the test ids or paths given"


def early_stop_for(state: State, name: str = "") -> EarlyStop | None:
    """The :class:`EarlyStop` of one group (``--gsm8k-early-stop``): the run's (``name``
    ""), or ``--gsm8k-config`` config ``name``'s; None with nothing to decide.

    Its problems are those the group set out to do (after deselection); every gate of the
    group takes part as the end of the run decides it, the noise-aware gate against the
    group's stored baseline when there is one it may be compared with: none with
    ``--snapshot-update`` (the run writes it), none that is refused (the baseline gate at
    the end says why).
    """
    from pytest_gsm8k.core import baseline as bl
    from pytest_gsm8k.core.early_stop import EarlyStop

    plan = state.plan
    settings = plan.settings
    wanted = {p.id for p in state.run.wanted(plan)}
    group = plan.group_by_name[name] if name else None
    here: dict[str, Any] = {"dataset": plan.split.identity()}
    if group is None:
        problems, stored, split = plan.problems, plan.baseline, plan.split.problems
        here["protocol"] = {**plan.protocol.identity(), "label": plan.protocol.label}
        floor, seed = None, settings.seed
    else:
        # a config is decided by the certain bounds only (no order counts there)
        problems, stored, split = group.problems, group.baseline, group.split_problems(plan.split)
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


def limit_note(state: State, plan: RunPlan) -> None:
    """A --gsm8k-limit above the split's size runs the whole split: said once."""
    limit, size = plan.settings.limit, len(plan.split.problems)
    if limit is not None and limit > size:
        state.config.issue_config_time_warning(
            pytest.PytestWarning(
                f"gsm8k: --gsm8k-limit {limit} is above the {size} problems of the split: "
                f"all {size} run"
            ),
            stacklevel=2,
        )
