"""One pytest process's part of a GSM8K run, as syrupy's ``SnapshotSession`` is for syrupy:
the settings, the plan (built once, then only read), the answer sources (sources.py), the
tally (core/tally.py) and :meth:`observe` (the early stop)."""

from __future__ import annotations

import functools
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from pytest_gsm8k import ROLE_NAME
from pytest_gsm8k.core.plan import Endpoint, RunPlan
from pytest_gsm8k.core.records import ProblemRecord
from pytest_gsm8k.core.scrub import Scrubber, command_secrets
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.core.tally import Tally
from pytest_gsm8k.runtime import files, planning
from pytest_gsm8k.runtime.outputs import Output
from pytest_gsm8k.sources import Sources

#: descriptors kept free of the concurrency's sockets: pytest's own files, the cache's
#: writes, the imports, the report and the page at the end (plus a few per xdist worker)
DESCRIPTOR_RESERVE, DESCRIPTOR_PER_WORKER = 64, 4


class Gsm8kSession:
    """This process's settings and xdist input, the plan (once), the sources and the tally."""

    def __init__(self, config: pytest.Config, settings: Settings, run_id: str, started: float):
        self.config, self.settings, self.run_id = config, settings, run_id
        self.is_worker = hasattr(config, "workerinput")
        self.workerinput: dict[str, Any] = getattr(config, "workerinput", {})  # {}: no worker
        self.dry = bool(config.option.collectonly or getattr(config.option, "setupplan", False))
        self._plan: RunPlan | None = None
        #: the run's private folder, shared by the xdist workers through the run id
        self._run_dir = Path(tempfile.gettempdir()) / f"gsm8k-run-{run_id}"
        self.run = Tally(started)
        #: the outputs checked at session start, by key; those that failed at the end
        self.outputs: dict[str, Output] = {}
        self.output_errors: dict[str, str] = {}
        self.sources = Sources(self)

    @property
    def plan(self) -> RunPlan:
        """Built on first use where the session start did not build it (an xdist worker, a
        run of a user's own tests). Raises DatasetError for unusable data."""
        if self._plan is None:
            self._plan = self.build_plan()
        return self._plan

    def set_plan(self, plan: RunPlan) -> None:
        self._plan = plan

    def build_plan(self) -> RunPlan:
        option = self.config.option
        return planning.build_plan(
            self.settings,
            run_id=self.run_id,
            endpoint=self.endpoint(),
            rootpath=self.config.rootpath,
            snapshot_dirname=str(getattr(option, "snapshot_dirname", None) or "__snapshots__"),
            update_baseline=bool(getattr(option, "update_snapshots", False)),
        )

    def endpoint(self) -> Endpoint:
        """The plan's; before there is one, the options' (a worker's is the controller's,
        which may have started the server and asked it what it serves)."""
        if self._plan is not None:
            return self._plan.endpoint
        return Endpoint(
            base_url=self.workerinput.get("gsm8k_base_url") or self.settings.resolved_base_url(),
            model=self.workerinput.get("gsm8k_model") or self.settings.model,
            identity=self.workerinput.get("gsm8k_server_identity"),
        )

    def run_dir(self) -> Path:
        """Made on first use only, so a session without GSM8K items leaves no trace."""
        self._run_dir.mkdir(mode=0o700, exist_ok=True)
        return self._run_dir

    def scrubber(self) -> Scrubber:
        """The key, URL credentials, ``VLLM_API_KEY``, and the secrets ``--gsm8k-serve`` and
        each config give a server, out of outside text."""
        others = [os.environ.get("VLLM_API_KEY", ""), *command_secrets(self.settings.serve or "")]
        for group in self._plan.groups if self._plan is not None else ():
            others += group.config.secrets()
        return Scrubber(self.settings.api_key(), self.endpoint().base_url, others)

    def concurrency(self) -> int:
        """The run's limit; split over the xdist workers only where each fetches itself,
        and never more sockets than the open-file limit leaves room for."""
        workers = max(1, int(self.workerinput.get("workercount", 1)))
        wanted = max(1, math.ceil(self.settings.concurrency / workers))
        room = self.descriptor_room
        return wanted if room is None else max(1, min(wanted, room[0]))

    @functools.cached_property
    def descriptor_room(self) -> tuple[int, int] | None:
        """(sockets this process may open for requests, the open-file limit), or None."""
        workers = getattr(self.config.option, "numprocesses", None)  # None on a worker
        spawned = workers if isinstance(workers, int) else 0
        return files.descriptor_room(DESCRIPTOR_RESERVE + DESCRIPTOR_PER_WORKER * spawned)

    def close(self) -> None:
        for output in self.outputs.values():
            output.close()
        self.sources.close()
        if not self.is_worker:
            shutil.rmtree(self._run_dir, ignore_errors=True)

    def learn_plans(self) -> None:
        """xdist controller: the problems the workers collected, from the plans they offer."""
        answers = self.sources.answer_server
        if answers is not None and self.run.collected_ids is None:
            self.run.learn_collected_ids(answers.planned_ids() or ())

    def observe(self, record: ProblemRecord) -> str | None:
        """One item's record, fed to its group's early stop (--gsm8k-early-stop). Returns the
        message the whole run stops with once that decides before its last problem; a
        config's early stop skips the rest of that config only."""
        run, problem_id, sources = self.run, str(record["id"]), self.sources
        fresh = run.add_record(record)
        if sources.answer_server is not None:
            sources.answer_server.settled(problem_id)
        if not fresh or record.get("aborted") or not self.settings.early_stop:
            return None
        from pytest_gsm8k.runtime.matrix import group_of

        name = group_of(problem_id) if self.settings.vllm_config else ""
        if name not in run.early:
            self.learn_plans()
            # not knowing which problems the workers collected, the stop could not count them
            known = run.collected_ids is not None
            run.start_early_stop(name, run.early_stop(self.plan, name) if known else None)
        if (early := run.early[name]) is None or name in run.stopped:
            return None
        answers = [str(x) for x in record.get("repeats") or ()]
        try:
            decided = early.observe(problem_id, bool(record["correct"]), record["outcome"], answers)
        except (KeyError, ValueError):
            return None  # a problem outside the group's plan (a user's own test): not counted
        if decided is None or early.observed >= early.n_total:
            return None
        if not name:
            run.stop_early(name, message := f"gsm8k: {early.headline()}")
            sources.stop(early.headline())
            return message
        how = f"(--gsm8k-early-stop {early.mode}): {early.headline()}"
        run.stop_early(
            name, f"config {name} stopped early {how}; its problems not asked yet are skipped"
        )
        if sources.matrix is not None:
            sources.matrix.stop_config(name, run.stopped[name])
        return None


def get_session(config: pytest.Config) -> Gsm8kSession:
    """This process's session, made on first use by its role (registered in pytest_configure)."""
    role = config.pluginmanager.get_plugin(ROLE_NAME)
    if role is None:
        raise pytest.UsageError("gsm8k: pytest-gsm8k is not configured (-p no:gsm8k?)")
    session: Gsm8kSession = role.session
    return session
