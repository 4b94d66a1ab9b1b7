"""The run's plan from its options, and the merge's replanning of its shards' run
(runtime/planning.py)."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_gsm8k.core.dataset import DatasetError
from pytest_gsm8k.core.merge import ShardError, selection_hash, shard_record
from pytest_gsm8k.core.plan import Endpoint, Shard
from pytest_gsm8k.core.settings import Settings
from pytest_gsm8k.runtime.planning import build_plan, read_baseline, replan


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


@pytest.mark.parametrize("option", ["data", "fewshot_file"])
@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("missing.jsonl", "no such file or folder"),
        ("x" * 3000, r"cannot read \(File name too long\)"),
    ],
    ids=["missing", "name-too-long"],
)
def test_an_input_file_that_cannot_be_opened_is_one_line_naming_its_option(
    tmp_path: Path, option: str, name: str, why: str
) -> None:
    """A name longer than the file system allows was an INTERNALERROR (pathlib's ``is_dir``
    raises ENAMETOOLONG), and a missing --gsm8k-fewshot-file was said as --gsm8k-data. The
    path is quoted cut at 200 characters."""
    flag = "--gsm8k-" + option.replace("_", "-")
    path = tmp_path / name
    given: dict[str, Any] = {option: str(path)}
    with pytest.raises(
        DatasetError, match=rf"^{flag} {tmp_path}/x*(missing\.jsonl)?: {why}$"
    ) as info:
        build_plan(
            Settings(limit=5, **given),
            run_id="x",
            endpoint=Endpoint(None, "m"),
            rootpath=tmp_path,
            snapshot_dirname="__snapshots__",
            update_baseline=False,
        )
    assert len(str(info.value)) < 300  # the path quoted cut at 200 characters


def test_a_baseline_name_the_file_system_cannot_hold_is_an_error_not_a_traceback(
    tmp_path: Path,
) -> None:
    """pathlib's exists() raised ENAMETOOLONG at the session start (an INTERNALERROR); a path
    under a file is still a missing baseline, as before."""
    too_long = read_baseline(tmp_path / ("b" * 300 + ".gsm8k"), tmp_path)
    assert "File name too long" in (too_long.error or "")
    (tmp_path / "file").write_text("x", encoding="utf-8")
    under_a_file = read_baseline(tmp_path / "file" / "b.gsm8k", tmp_path)
    assert (under_a_file.error, under_a_file.document, under_a_file.exists) == (None, None, False)


def test_a_baseline_path_in_a_symlink_loop_is_an_error_not_a_traceback(tmp_path: Path) -> None:
    """pathlib's resolve() raises RuntimeError on a symlink loop (Python 3.11, 3.12): an
    INTERNALERROR at the session start; the file cannot be read, so it is said so. (3.13's
    resolve() returns the looping path: it is shown from the rootdir, as any other.)"""
    (tmp_path / "a.gsm8k").symlink_to("b.gsm8k")
    (tmp_path / "b.gsm8k").symlink_to("a.gsm8k")
    stored = read_baseline(tmp_path / "a.gsm8k", tmp_path)
    resolves = sys.version_info >= (3, 13)
    shown = "a.gsm8k" if resolves else str(tmp_path / "a.gsm8k")
    assert (stored.shown, stored.document) == (shown, None)
    assert "a.gsm8k: cannot read ([Errno 40] Too many levels of symbolic links" in (
        stored.error or ""
    )
