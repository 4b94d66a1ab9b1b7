"""The run's plan: everything decided before the first request, built once per process at
session start (runtime/planning.py) and never written after. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gsm8k.core.dataset import Split
from pytest_gsm8k.core.gates import HEALTH_OUTCOMES, MaxShare, MinAcc, NoiseAware, ToleranceFloor
from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.core.types import Problem, Request

if TYPE_CHECKING:  # vllm_config imports yaml: only a run of configs pays for it
    from pytest_gsm8k.core.vllm_config import VllmConfig


@dataclass(frozen=True)
class Endpoint:
    """Where the plugin's own client sends requests (base URL None: the OpenAI default)."""

    base_url: str | None
    model: str | None
    #: the model's /v1/models card: a cached answer is reused only while it says the same
    identity: dict[str, Any] | None = None


@dataclass(frozen=True)
class GateSpecs:
    """The gates the options ask for, each rule stated once (core/gates.py)."""

    min_acc: MinAcc | None
    baseline: NoiseAware  # at --gsm8k-alpha, --gsm8k-max-drop allowed on top
    require_baseline: bool
    health: tuple[MaxShare, ...] = ()  # --gsm8k-max-unparsed, -truncated, -error

    @staticmethod
    def from_settings(s: Settings) -> GateSpecs:
        rates = zip(HEALTH_OUTCOMES, (s.max_unparsed, s.max_truncated, s.max_error), strict=True)
        return GateSpecs(
            min_acc=MinAcc(s.min_acc) if s.min_acc is not None else None,
            baseline=NoiseAware(s.alpha, s.max_drop),
            require_baseline=s.require_baseline,
            health=tuple(MaxShare(outcome, rate) for outcome, rate in rates if rate is not None),
        )


@dataclass(frozen=True)
class StoredBaseline:
    """The baseline file, read once: its ``document`` or one-line ``error``; without a file, the
    readable baselines ``beside`` it, newest first (a changed protocol may have moved from one)."""

    path: Path
    shown: str
    document: dict[str, Any] | None = None
    error: str | None = None
    beside: tuple[tuple[str, dict[str, Any]], ...] = ()

    @property
    def exists(self) -> bool:
        return self.document is not None or self.error is not None


@dataclass(frozen=True)
class PlanGroup:
    """Items gated on their own: a run's own group (``name`` "", no ``config``: the options'
    protocol, selection and baseline) or one vLLM config of ``--gsm8k-config`` (its own server,
    protocol, problems whose ids carry its name, baseline ``<config>_<protocol>.gsm8k``)."""

    name: str
    protocol: Protocol
    problems: tuple[Problem, ...]  # in selection order (a config's: the split's first ones)
    subset: Mapping[str, Any]  # the report's: what cut the split (limit, seed, first)
    baseline: StoredBaseline | None = None
    config: VllmConfig | None = None

    @property
    def label(self) -> str:
        """The headline label, which also names the baseline file."""
        return f"{self.name}: {self.protocol.label}" if self.name else self.protocol.label

    @property
    def floor(self) -> ToleranceFloor | None:
        """vLLM's gate of a config: accuracy >= accuracy_threshold - tolerance."""
        c = self.config
        return None if c is None else ToleranceFloor(c.name, c.accuracy_threshold, c.tolerance)

    def split_problems(self, split: Split) -> tuple[Problem, ...]:
        """The whole split under this group's ids: what its baseline may hold."""
        if not self.name:  # the split's own: 1,319 copies are 3 ms a run
            return split.problems
        return tuple(replace(p, group=self.name) for p in split.problems)


@dataclass(frozen=True)
class Shard:
    """``--gsm8k-shard I/N``: shard ``index`` of ``count`` (core/merge.py) of a selection of
    ``size`` problems whose ids hash to ``ids_hash``; ``update_baseline``: --snapshot-update,
    for the merge to write (a shard never writes one)."""

    index: int
    count: int
    size: int
    ids_hash: str
    update_baseline: bool = False
    snapshot_dirname: str = "__snapshots__"  # syrupy's --snapshot-dirname, for the merge


@dataclass(frozen=True)
class RunPlan:
    """What this run will do; the same value in every process of the run."""

    run_id: str
    settings: Settings
    split: Split
    run_order: tuple[Problem, ...]  # the order the items run (seeded for the sequential stop)
    endpoint: Endpoint
    gates: GateSpecs
    groups: tuple[PlanGroup, ...]  # never empty: the run's own, or --gsm8k-config's in run order
    update_baseline: bool = False  # --snapshot-update: write the baseline, do not compare
    #: --gsm8k-shard: the problems are this shard's slice; its gates wait for the merge
    shard: Shard | None = None

    @cached_property
    def pattern(self) -> re.Pattern[str] | None:  # --gsm8k-answer-regex, compiled once
        return re.compile(regex) if (regex := self.settings.answer_regex) else None

    @cached_property
    def problems(self) -> tuple[Problem, ...]:  # the selection, in selection order
        return tuple(p for g in self.groups for p in g.problems)

    @cached_property
    def by_id(self) -> dict[str, Problem]:
        return {p.id: p for p in self.problems}

    @cached_property
    def group_by_name(self) -> dict[str, PlanGroup]:
        return {g.name: g for g in self.groups}

    @property
    def protocol(self) -> Protocol:  # the run's: its first group's
        return self.groups[0].protocol

    @cached_property
    def configs(self) -> dict[str, VllmConfig]:  # --gsm8k-config's, by name (none: a run's own)
        return {g.name: c for g in self.groups if (c := g.config)}

    def protocol_of(self, problem: Problem) -> Protocol:  # its group's
        return self.group_by_name.get(problem.group, self.groups[0]).protocol

    def request_for(self, problem_id: str) -> Request | None:
        problem = self.by_id.get(problem_id)
        return None if problem is None else self.protocol_of(problem).request(problem)
