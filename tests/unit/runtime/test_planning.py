"""The merge's replanning of its shards' run (runtime/planning.py ``replan``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from pytest_gsm8k.core.merge import ShardError, selection_hash, shard_record
from pytest_gsm8k.core.plan import Endpoint, Shard
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.runtime.planning import build_plan, replan


def test_a_shard_plan_no_option_could_give_is_refused_in_one_line(tmp_path: Path) -> None:
    """Rule: bad input is one line naming what was wrong. A shard report from a newer version
    (or edited) naming an unknown preset crashed the merge with a KeyError traceback."""
    plan = build_plan(
        Settings(limit=5),
        run_id="x",
        endpoint=Endpoint(None, "m"),
        rootpath=tmp_path,
        snapshot_dirname="__snapshots__",
        update_baseline=False,
    )
    ids = [p.id for p in plan.problems]
    whole = Shard(1, 1, len(ids), selection_hash(ids), False, "__snapshots__")
    block = json.loads(json.dumps(shard_record(dataclasses.replace(plan, shard=whole))["plan"]))
    assert replan(block, tmp_path, None, {}).problems == plan.problems  # as planned: merged
    block["settings"]["preset"] = "from-a-newer-version"
    with pytest.raises(
        ShardError, match=r"^corrupt shard plan \(KeyError: 'from-a-newer-version'\)$"
    ):
        replan(block, tmp_path, None, {})
