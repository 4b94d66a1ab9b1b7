"""The run's plan: everything decided before the first request, frozen. Pure.

Built once per process at session start (``pytest_gsm8k.runtime.planning``), read and never
written after that; what changes during a run lives elsewhere, owned by one object each.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gsm8k.core.dataset import Split
from pytest_gsm8k.core.gates import HEALTH_OUTCOMES, MaxShare, MinAcc, NoiseAware, ToleranceFloor
from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.core.types import Problem, Request

if TYPE_CHECKING:  # yaml, which vllm_config reads with, only for a run of configs
    from pytest_gsm8k.core.vllm_config import VllmConfig


@dataclass(frozen=True)
class Endpoint:
    """Where the plugin's own client sends requests: the base URL (None: the OpenAI
    default) and the model id, after any server the run started was asked for them."""

    base_url: str | None
    model: str | None
    #: what the endpoint's GET /v1/models says about the model (None: it said nothing);
    #: stored with each cached answer, which is reused only while it still says that
    identity: dict[str, Any] | None = None


@dataclass(frozen=True)
class GateSpecs:
    """The gates the options ask for, each rule stated once (core/gates.py)."""

    min_acc: MinAcc | None
    #: the rule against a stored baseline: the noise-aware test at --gsm8k-alpha, with
    #: --gsm8k-max-drop allowed on top (exact McNemar against a single-run baseline)
    baseline: NoiseAware
    require_baseline: bool
    #: the answer-format health gates (--gsm8k-max-unparsed, -truncated, -error) asked for
    health: tuple[MaxShare, ...] = ()

    @staticmethod
    def from_settings(settings: Settings) -> GateSpecs:
        rule = NoiseAware(settings.alpha, settings.max_drop)
        return GateSpecs(
            min_acc=MinAcc(settings.min_acc) if settings.min_acc is not None else None,
            baseline=rule,
            require_baseline=settings.require_baseline,
            health=tuple(
                MaxShare(outcome, rate)
                for outcome, rate in zip(
                    HEALTH_OUTCOMES,
                    (settings.max_unparsed, settings.max_truncated, settings.max_error),
                    strict=True,
                )
                if rate is not None
            ),
        )


@dataclass(frozen=True)
class StoredBaseline:
    """The baseline file this run compares with or writes, read once: its ``document``, or
    the one-line ``error`` why it could not be read; without a file, the readable baselines
    ``beside`` it, newest first (a changed protocol may have moved from one)."""

    path: Path
    shown: str
    document: dict[str, Any] | None = None
    error: str | None = None
    beside: tuple[tuple[str, dict[str, Any]], ...] = ()

    @property
    def exists(self) -> bool:
        return self.document is not None or self.error is not None


@dataclass(frozen=True)
class ConfigGroup:
    """One vLLM config of ``--gsm8k-config``: its own server, protocol and problems (whose
    ids carry the config's name), gated on its own."""

    config: VllmConfig
    protocol: Protocol
    #: the first ``num_questions`` problems of the split, as vLLM's script takes them
    problems: tuple[Problem, ...]
    #: this config's own baseline (``<config>_<protocol>.gsm8k``), read once like a run's
    baseline: StoredBaseline | None = None

    @property
    def label(self) -> str:
        """The config's headline label, which also names its baseline file."""
        return f"{self.name}: {self.protocol.label}"

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def floor(self) -> ToleranceFloor:
        """vLLM's gate of this config: accuracy >= accuracy_threshold - tolerance."""
        return ToleranceFloor(self.name, self.config.accuracy_threshold, self.config.tolerance)

    def split_problems(self, split: Split) -> tuple[Problem, ...]:
        """The whole split under this config's ids: what its baseline may hold (a baseline is
        checked against the split, not only the ``num_questions`` the config asks)."""
        return tuple(replace(p, group=self.name) for p in split.problems)


@dataclass(frozen=True)
class Shard:
    """``--gsm8k-shard I/N``: this run is shard ``index`` of ``count`` (core/merge.py), its
    problems the slice of a selection of ``size`` problems whose ids hash to ``ids_hash``.
    ``update_baseline``: --snapshot-update was given, for the merge to write the baseline
    (a shard never writes one: the plan's own ``update_baseline`` is off)."""

    index: int
    count: int
    size: int
    ids_hash: str
    update_baseline: bool = False
    #: where the run's baselines live under the rootdir (syrupy's --snapshot-dirname)
    snapshot_dirname: str = "__snapshots__"


@dataclass(frozen=True)
class RunPlan:
    """What this run will do; the same value in every process of the run."""

    run_id: str
    settings: Settings
    split: Split
    #: the selected problems (after --gsm8k-limit), in selection order
    problems: tuple[Problem, ...]
    #: the same problems in the order the items run (seeded for the sequential early stop)
    run_order: tuple[Problem, ...]
    protocol: Protocol
    endpoint: Endpoint
    gates: GateSpecs
    baseline: StoredBaseline | None
    #: --snapshot-update: write the baseline instead of comparing with it
    update_baseline: bool = False
    #: --gsm8k-config: the configs, run in this order, each on its own server (empty: a
    #: run of one protocol against one endpoint)
    groups: tuple[ConfigGroup, ...] = ()
    #: --gsm8k-shard: ``problems``, ``run_order`` and each group's problems are this shard's
    #: slice of the run's selection; its gates wait for the merge
    shard: Shard | None = None

    @cached_property
    def pattern(self) -> re.Pattern[str] | None:
        """``--gsm8k-answer-regex``, compiled once."""
        regex = self.settings.answer_regex
        return re.compile(regex) if regex else None

    @cached_property
    def by_id(self) -> dict[str, Problem]:
        """The selected problems by id (computed once; the plan never changes)."""
        return {p.id: p for p in self.problems}

    @cached_property
    def group_by_name(self) -> dict[str, ConfigGroup]:
        return {g.name: g for g in self.groups}

    def group_of(self, problem: Problem) -> ConfigGroup | None:
        """The config group ``problem`` is asked for (None outside --gsm8k-config)."""
        return self.group_by_name.get(problem.group) if problem.group else None

    def protocol_of(self, problem: Problem) -> Protocol:
        """The protocol ``problem`` is asked with: its config's, else the run's."""
        group = self.group_of(problem)
        return group.protocol if group is not None else self.protocol

    def request_for(self, problem_id: str) -> Request | None:
        """The plugin protocol's request for a selected problem (None if not selected)."""
        problem = self.by_id.get(problem_id)
        return None if problem is None else self.protocol_of(problem).request(problem)
