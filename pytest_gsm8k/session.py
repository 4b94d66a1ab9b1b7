"""One pytest process's part of a GSM8K run, as syrupy's ``SnapshotSession`` is for syrupy:
the settings, the plan (built once, then only read), the answer sources (sources.py) and the
tally (core/tally.py), with :meth:`observe` (the early stop). The role plugins (roles.py) start
and finish the run through it; serving.py, writing.py and reporting.py take it.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_gsm8k import ROLE_NAME
from pytest_gsm8k.core.plan import Endpoint, RunPlan
from pytest_gsm8k.core.records import ProblemRecord
from pytest_gsm8k.core.scrub import Scrubber, command_secrets
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.core.tally import Tally
from pytest_gsm8k.sources import SourceContext, Sources

if TYPE_CHECKING:
    from pytest_gsm8k.runtime.outputs import Output

#: descriptors kept free of the concurrency's sockets: pytest's own files, the cache's
#: writes, the imports, the report and the page at the end (plus a few per xdist worker)
DESCRIPTOR_RESERVE = 64
DESCRIPTOR_PER_WORKER = 4


def run_dir_for(run_id: str) -> Path:
    """Where the run with this id keeps its private files (not created here)."""
    return Path(tempfile.gettempdir()) / f"gsm8k-run-{run_id}"


class Gsm8kSession:
    """This process's settings and xdist input, the plan (once), the sources and the tally."""

    def __init__(
        self,
        config: pytest.Config,
        settings: Settings,
        run_id: str,
        started: float,
        workerinput: dict[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.settings = settings
        self.run_id = run_id
        self.workerinput = workerinput
        self.is_worker = workerinput is not None
        self.workers = int((workerinput or {}).get("workercount", 1))
        self._plan: RunPlan | None = None
        self._run_dir: Path | None = None
        self._room: tuple[int, int] | None = None
        self._room_measured = False
        self.run = Tally(started)
        #: the engines' warnings and notes no test issued, said at the end
        self.notes: list[str] = []
        #: the outputs checked at session start, by key; those that failed at the end
        self.outputs: dict[str, Output] = {}
        self.output_errors: dict[str, str] = {}
        self.sources = Sources(
            SourceContext(
                settings=settings,
                config=config,
                run_id=run_id,
                started=started,
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
    def plan(self) -> RunPlan:
        """Built here on first use where nothing built it before (an xdist worker, a run of
        a user's own tests). Raises DatasetError for unusable data."""
        if self._plan is None:
            self.set_plan(self.build_plan(self.default_endpoint()))
        assert self._plan is not None
        return self._plan

    def set_plan(self, plan: RunPlan) -> None:
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
        """The options' endpoint; a worker's comes from the controller, which may have
        started the server and asked it what it serves."""
        settings, given = self.settings, self.workerinput or {}
        return Endpoint(
            base_url=given.get("gsm8k_base_url") or settings.resolved_base_url(),
            model=given.get("gsm8k_model") or settings.model,
            identity=given.get("gsm8k_server_identity"),
        )

    def endpoint(self) -> Endpoint:
        """The plan's endpoint, or the options' before there is a plan (session start)."""
        return self._plan.endpoint if self._plan is not None else self.default_endpoint()

    # what the process may use

    @property
    def run_dir(self) -> Path:
        """The run's private folder, shared by the xdist workers through the run id; made on
        first use only, so a session without GSM8K items leaves no trace."""
        if self._run_dir is None:
            path = run_dir_for(self.run_id)
            path.mkdir(mode=0o700, exist_ok=True)
            self._run_dir = path
        return self._run_dir

    def scrubber(self) -> Scrubber:
        """What removes this run's secrets from outside text: the key, URL credentials,
        ``VLLM_API_KEY``, and the secrets ``--gsm8k-serve`` and each config give a server."""
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
            workers = getattr(self.config.option, "numprocesses", None)  # None on a worker
            spawned = workers if isinstance(workers, int) else 0
            self._room = descriptor_room(DESCRIPTOR_RESERVE + DESCRIPTOR_PER_WORKER * spawned)
        return self._room

    def add_output(self, key: str, output: Output) -> None:
        self.outputs[key] = output

    def output_failed(self, key: str, message: str) -> None:
        self.output_errors[key] = message

    def close(self) -> None:
        for output in self.outputs.values():
            output.close()
        self.sources.close()
        if not self.is_worker:
            shutil.rmtree(run_dir_for(self.run_id), ignore_errors=True)

    # the aggregating process

    def learn_plans(self) -> None:
        """xdist controller: the problems the workers collected, from the plans they offer on
        the answers channel before they run an item."""
        answers = self.sources.answer_server
        if answers is not None and self.run.collected_ids is None:
            self.run.learn_collected_ids(answers.planned_ids() or ())

    def observe(self, record: ProblemRecord) -> str | None:
        """One item's record; with --gsm8k-early-stop fed to its group's early stop. Returns
        the message the whole run stops with once that decides before its last problem; a
        config's early stop skips the rest of that config only."""
        from pytest_gsm8k.runtime.matrix import group_of

        run, problem_id = self.run, str(record["id"])
        fresh = run.add_record(record)
        if self.sources.answer_server is not None:
            self.sources.answer_server.settled(problem_id)
        aborted = record["outcome"] == "error" and record.get("aborted")
        if not fresh or aborted or not self.settings.early_stop:
            return None
        name = group_of(problem_id) if self.settings.vllm_config else ""
        if name not in run.early:
            self.learn_plans()
            # not knowing which problems the workers collected, the stop could not count them
            known = run.collected_ids is not None
            run.start_early_stop(name, run.early_stop(self.plan, name) if known else None)
        early = run.early[name]
        if early is None or name in run.stopped:
            return None
        answers = [str(x) for x in record.get("repeats") or ()]
        try:
            decision = early.observe(
                problem_id, bool(record["correct"]), record["outcome"], answers
            )
        except (KeyError, ValueError):
            return None  # a problem outside the group's plan (a user's own test): not counted
        if decision is None or early.observed >= early.n_total:
            return None
        if name:
            message = (
                f"config {name} stopped early (--gsm8k-early-stop {early.mode}): "
                f"{early.headline()}; its problems not asked yet are skipped"
            )
            run.stop_early(name, message)
            if self.sources.matrix is not None:
                self.sources.matrix.stop_config(name, message)
            return None
        message = f"gsm8k: {early.headline()}"
        run.stop_early(name, message)
        self.sources.stop(message.removeprefix("gsm8k: "))
        return message


def get_session(config: pytest.Config) -> Gsm8kSession:
    """This process's session (made on first use by its role, registered in pytest_configure)."""
    role = config.pluginmanager.get_plugin(ROLE_NAME)
    session = getattr(role, "session", None)
    if not isinstance(session, Gsm8kSession):
        raise pytest.UsageError("gsm8k: pytest-gsm8k is not configured (-p no:gsm8k?)")
    return session
