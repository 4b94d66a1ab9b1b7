"""The run's plan, built once per process from the options: data, protocol, baselines, gates
(:func:`build_plan`), and again at a merge of shards (:func:`replan`). Data problems raise
:class:`DatasetError`, which the plugin turns into one usage-error line."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.dataset import DatasetError, Split, select
from pytest_gsm8k.core.merge import selection_hash, shard_slice
from pytest_gsm8k.core.plan import Endpoint, GateSpecs, PlanGroup, RunPlan, Shard, StoredBaseline
from pytest_gsm8k.core.presets import PRESETS, preset_settings, takes_first
from pytest_gsm8k.core.prompts import Protocol, draw_exemplars
from pytest_gsm8k.core.scrub import clip
from pytest_gsm8k.core.settings import Settings, parse_shard
from pytest_gsm8k.runtime.data import load_split, train_source

if TYPE_CHECKING:  # --gsm8k-config's (yaml): imported by the run that reads configs
    from pytest_gsm8k.core.vllm_config import VllmConfig


def build_protocol(s: Settings, split: Split) -> Protocol:
    """The protocol the options describe, its exemplars drawn (never from the evaluated split)."""
    exemplars: tuple[tuple[str, str], ...] = ()
    train: tuple[tuple[str, str], ...] = ()
    source = "none"

    def train_split() -> Split:
        return load_split(train_source(s.data), "train", s.dataset_config, s.dataset)

    if s.preset:
        spec = PRESETS[s.preset]
        # SGLang: the first rows of the file under test
        rows = split.problems if spec.fewshot_split == "evaluated" else train_split().problems
        train = tuple((p.question, p.answer) for p in rows)
        if s.shots > len(train):
            raise DatasetError(
                f"--gsm8k-shots {s.shots}: the preset's example pool has only {len(train)} rows"
            )
        source = spec.fewshot_source
    elif s.shots or s.fewshot_file:
        if s.fewshot_file:
            pool_split = load_split(s.fewshot_file, "fewshot", s.dataset_config)
            source = f"file {Path(s.fewshot_file).name}"
        else:
            pool_split = train_split()
            source = f"train (seed {s.seed})"
        evaluated = {p.question for p in split.problems}  # never show a test problem as a shot
        pool = [(p.question, p.answer) for p in pool_split.problems if p.question not in evaluated]
        try:
            exemplars = draw_exemplars(pool, s.shots or len(pool), s.seed)
        except ValueError as exc:
            raise DatasetError(str(exc)) from None
    return Protocol(
        name=s.protocol,
        shots=s.shots if s.preset else len(exemplars),
        fewshot_source=source,
        exemplars=exemplars,
        train=train,
        extractor=s.extract,
        **{key: getattr(s, key) for key in _AS_GIVEN.split()},
    )


_AS_GIVEN = "samples temperature api preset system max_tokens stop answer_regex params"
#: a config field --gsm8k-preset vllm cannot send as vLLM's test would (the value it sends,
#: and why): the config would need another body than the preset's, so it is refused
_PRESET_SENDS = {
    "max_tokens": (256, "the preset sends gsm8k_eval.py's 256"),
    "temperature": (0.0, "the preset sends gsm8k_eval.py's 0.0"),
    "seed": (42, "the preset sends gsm8k_eval.py's 42"),
    "use_chat_completions": (False, "vLLM's test then names the model, the preset does not"),
    "gen_prefix": ("", "vLLM's script appends it after 'Answer:'"),
}


def protocol_for(config: VllmConfig, settings: Settings, split: Split) -> Protocol:
    """A vLLM config's protocol: exactly ``--gsm8k-preset vllm --gsm8k-shots <num_fewshot>``
    (vLLM's gsm8k_eval.py's requests, byte for byte), or DatasetError naming the file and
    field the preset cannot send as vLLM's test would."""
    for key, (sent, why) in _PRESET_SENDS.items():
        if (value := getattr(config, key)) != sent:
            raise DatasetError(
                f"{config.source}: {key}: {value!r} is not supported yet ({why}); remove it or "
                "run this config with vLLM's own test"
            )
    values = preset_settings("vllm", api="completions", shots=config.num_fewshot)
    preset = dataclasses.replace(
        settings, **values, samples=1, answer_regex=None, system=None, params=(), fewshot_file=None
    )
    return build_protocol(preset, split)


def config_groups(
    settings: Settings, split: Split, folder: Path, rootpath: Path
) -> tuple[PlanGroup, ...]:
    """Each config with its protocol, the first ``num_questions`` problems of the split (as
    vLLM's script takes them, not a seeded subset) and its own baseline, named by its label:
    configs whose names differ only where a file name cannot (``a b``, ``a_b``; case) are
    refused before any server starts."""
    from pytest_gsm8k.core.vllm_config import ConfigError
    from pytest_gsm8k.runtime.configs import load as load_configs

    assert settings.vllm_config is not None
    try:
        configs = load_configs(settings.vllm_config)
    except ConfigError as exc:
        raise DatasetError(str(exc)) from None
    groups, named = [], dict[str, str]()  # a baseline's file name, case folded -> its config's
    for config in configs:
        problems = split.problems[: config.num_questions]
        problems = tuple(dataclasses.replace(p, group=config.name) for p in problems)
        limit = config.num_questions if config.num_questions < len(split.problems) else None
        subset = {"limit": limit, "first": True, "seed": None}
        protocol = protocol_for(config, settings, split)
        group = PlanGroup(config.name, protocol, problems, subset, config=config)
        file = f"{bl.default_name(group.label)}.gsm8k"
        if (other := named.setdefault(file.casefold(), group.name)) != group.name:
            raise DatasetError(
                f"--gsm8k-config: configs {other!r} and {group.name!r} would share one baseline "
                f"file ({file}): rename one"
            )
        groups.append(dataclasses.replace(group, baseline=read_baseline(folder / file, rootpath)))
    return tuple(groups)


def read_baseline(path: Path, rootpath: Path, beside: bool = True) -> StoredBaseline:
    """The baseline file, read and checked once; when missing, with ``beside``, the
    baselines in its folder (for the gate to name)."""
    try:
        shown = str(path.resolve().relative_to(rootpath.resolve()))
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop (3.11, 3.12)
        shown = str(path)
    try:
        # without blocking: a FIFO at the path would wait for a writer before the first request
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return StoredBaseline(path, shown, error=f"{shown}: not a regular file")
            document = bl.loads(file.read().decode("utf-8"), shown)
    except (FileNotFoundError, NotADirectoryError):
        return StoredBaseline(path, shown, beside=_beside(path, rootpath) if beside else ())
    except (OSError, UnicodeDecodeError) as exc:
        return StoredBaseline(path, shown, error=f"{shown}: cannot read ({exc})")
    except bl.BaselineError as exc:
        return StoredBaseline(path, shown, error=str(exc))
    return StoredBaseline(path, shown, document=document)


def _beside(path: Path, rootpath: Path) -> tuple[tuple[str, dict[str, Any]], ...]:
    try:
        found = sorted(path.parent.glob("*.gsm8k"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return ()
    read = (read_baseline(p, rootpath, beside=False) for p in found)
    return tuple((b.shown, b.document) for b in read if b.document is not None)


def build_plan(
    settings: Settings,
    *,
    run_id: str,
    endpoint: Endpoint,
    rootpath: Path,
    snapshot_dirname: str,
    update_baseline: bool,
) -> RunPlan:
    """The frozen plan of this run (raises DatasetError for unusable data or exemplars)."""
    split = load_split(settings.data, settings.split, settings.dataset_config, settings.dataset)
    folder = rootpath / snapshot_dirname / "gsm8k"
    index, count = parse_shard(settings.shard) if settings.shard else (1, 1)
    if settings.vllm_config:
        groups = config_groups(settings, split, folder, rootpath)
    else:  # the run's own group: the options' protocol, selection and baseline
        first = takes_first(settings.preset)
        selected = select(split.problems, settings.limit, settings.seed, first=first)
        protocol = build_protocol(settings, split)
        name = settings.baseline_name or bl.default_name(protocol.label)
        path = Path(settings.baseline or folder / f"{name}.gsm8k").expanduser()
        # the limit is said where the run has fewer problems than the split (a shard too)
        cut = len(shard_slice(selected, index, count)) < len(split.problems)
        limit = settings.limit if cut else None
        subset: dict[str, Any] = {"limit": limit, "seed": settings.seed}
        subset |= {"first": True} if first and limit is not None else {}
        groups = (PlanGroup("", protocol, selected, subset, read_baseline(path, rootpath)),)
    selected = tuple(p for g in groups for p in g.problems)
    shard = None
    if settings.shard is not None:
        # every config's questions are striped over the shards: each shard runs every config
        ids_hash = selection_hash([p.id for p in selected])
        shard = Shard(index, count, len(selected), ids_hash, update_baseline, snapshot_dirname)
        update_baseline = False  # the merge writes it, from every shard's answers
        if count > len(selected):  # an empty shard would report nothing to merge
            raise DatasetError(
                f"--gsm8k-shard {index}/{count}: the selection has {len(selected)} problems; "
                f"cut it into at most {len(selected)} shards"
            )
        selected = shard_slice(selected, index, count)
        mine = {p.id for p in selected}
        groups = tuple(
            dataclasses.replace(g, problems=tuple(p for p in g.problems if p.id in mine))
            for g in groups
        )
    # the split's order, or a seeded random one for the sequential early stop (its guarantee
    # needs a sample drawn without replacement)
    order = selected
    if settings.early_stop == "sequential":
        from pytest_gsm8k.core.early_stop import run_order

        by_id = {p.id: p for p in selected}
        order = tuple(by_id[pid] for pid in run_order(list(by_id), settings.seed))
    return RunPlan(
        run_id=run_id,
        settings=settings,
        split=split,
        run_order=order,
        endpoint=endpoint,
        gates=GateSpecs.from_settings(settings),
        groups=groups,
        update_baseline=update_baseline,
        shard=shard,
    )


def replan(
    block: Mapping[str, Any], rootpath: Path, model: str | None, outputs: Mapping[str, Any]
) -> RunPlan:
    """The whole run's plan again at the merge of its shards (``block``: their plan), as one
    machine running every shard would have planned it here with ``outputs`` (the merge's own
    paths); :class:`ShardError` naming the first field that differs from the shards' plan."""
    from pytest_gsm8k.core.merge import ShardError, plan_difference, planned_settings, shard_record

    settings = planned_settings(block, Settings())
    snapshots = str(block.get("snapshot_dirname") or "__snapshots__")
    try:
        plan = build_plan(
            dataclasses.replace(settings, **outputs),
            run_id="merge",
            endpoint=Endpoint(None, model),
            rootpath=rootpath,
            snapshot_dirname=snapshots,
            update_baseline=block.get("update_baseline") is True,
        )
    except (KeyError, TypeError, ValueError) as exc:  # a value no option would have let through
        raise ShardError(f"corrupt shard plan ({type(exc).__name__}: {clip(str(exc))})") from None
    ids = [p.id for p in plan.problems]
    whole = Shard(1, 1, len(ids), selection_hash(ids), plan.update_baseline, snapshots)
    record = shard_record(dataclasses.replace(plan, shard=whole))
    again = json.loads(json.dumps(record["plan"]))  # as the shards' report holds it
    if again != block:
        raise ShardError(
            f"the merge here does not plan what the shards planned: "
            f"{plan_difference(block, again)} differs (run it at the root of the "
            "checkout the shards ran in, with the same data and baseline)"
        )
    return plan
