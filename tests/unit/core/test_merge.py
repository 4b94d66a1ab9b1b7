"""Unit tests for pytest_gsm8k.core.merge: ``--gsm8k-shard I/N``'s slice and the checks that
accept reports only as the shards of one run (#35)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from pytest_gsm8k.core.merge import (
    PLANNED,
    ShardError,
    check_shards,
    interleave,
    planned_settings,
    selection_hash,
    shard_slice,
)
from pytest_gsm8k.core.settings import (
    MAX_SHARDS,
    Settings,
    SettingsError,
    build_settings,
    parse_shard,
)


def settings(**given: Any) -> Settings:
    return build_settings(lambda o: given.get(o.dest[len("gsm8k_") :]), lambda _: None)


@pytest.mark.parametrize(("size", "count"), [(0, 3), (1, 3), (20, 3), (1319, 4), (7, 7), (5, 8)])
def test_the_shards_partition_the_selection_in_balanced_spread_slices(
    size: int, count: int
) -> None:
    items = [f"test-{i:04d}" for i in range(size)]
    slices = [shard_slice(items, i, count) for i in range(1, count + 1)]
    assert sorted(x for part in slices for x in part) == sorted(items)  # each exactly once
    sizes = [len(part) for part in slices]
    assert max(sizes) - min(sizes) <= 1
    assert interleave(slices) == items  # the merge puts them back in run order
    if size >= 2 * count:  # spread over the run order, not a block of it
        assert all(part[0] in items[:count] and part[-1] in items[-count:] for part in slices)


def test_slices_of_another_size_are_no_stride_slicing() -> None:
    assert interleave([["a", "b"], ["c", "d"], []]) is None
    assert interleave([["a"], ["b", "c"]]) is None


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("2", "expected I/N"),
        ("a/b", "expected I/N"),
        ("1/0", "N must be >= 1 and <= 256"),
        (f"1/{MAX_SHARDS + 1}", "N must be >= 1 and <= 256"),
        ("0/3", "I must be >= 1 and <= 3"),
        ("4/3", "I must be >= 1 and <= 3"),
        ("-1/3", "expected I/N"),
    ],
)
def test_a_bad_shard_is_one_line_naming_the_option(text: str, error: str) -> None:
    with pytest.raises(SettingsError) as info:
        settings(shard=text)
    message = str(info.value)
    assert message.startswith("--gsm8k-shard")
    assert error in message
    assert "\n" not in message


def test_a_shard_is_parsed_and_refused_with_the_early_stop() -> None:
    assert parse_shard(" 2 / 4 ") == (2, 4)
    assert settings(shard=" 3 / 3").shard == "3/3"
    assert settings().shard is None
    with pytest.raises(SettingsError, match="cannot see the other shards' answers"):
        settings(shard="1/2", early_stop="certain")


# check_shards: reports as the shards of ONE run


def record(pid: str) -> dict[str, Any]:
    """A record as a shard's report holds it (the fields the merge checks)."""
    sample = {
        "text": "#### 1",
        "finish_reason": "stop",
        "extracted": {"strict": "1"},
        "correct": True,
        "reasoning": None,
        "truncated": False,
    }
    return {
        "id": pid,
        "index": int(pid.rpartition("-")[2]),
        "gold": "1",
        "extracted": "1",
        "rules": {"strict": True},
        "n_samples": 1,
        "n_correct": 1,
        "response": "#### 1",
        "samples": [sample],
        "usage": {"prompt_tokens": 10},
        "cached": 0,
        "model": "m",
        "error": None,
    }


def shards(
    count: int = 3, size: int = 10, ids: list[str] | None = None, **plan: Any
) -> list[tuple[str, dict[str, Any]]]:
    """The reports of a run of ``size`` problems (or ``ids``) cut in ``count`` shards (only
    what the merge's checks read)."""
    ids = ids or [f"test-{i:04d}" for i in range(size)]
    size = len(ids)
    block = {
        "selection": {"size": size, "ids_hash": selection_hash(ids)},
        "gates": {"min_acc": 0.5},
        **plan,
    }
    out = []
    for index in range(1, count + 1):
        mine = list(shard_slice(ids, index, count))
        report = {
            "shard": {"index": index, "count": count, "ids": mine, "plan": copy.deepcopy(block)},
            "problems": [record(pid) for pid in mine],
        }
        out.append((f"s{index}.json", report))
    return out


def test_the_shards_of_one_run_give_its_selection_and_every_record_once() -> None:
    merged = check_shards(list(reversed(shards())))
    # the selection in run order is checked against the plan's hash (interleave: its own test)
    assert sorted(r["id"] for r in merged.records) == [f"test-{i:04d}" for i in range(10)]


def test_a_missing_shard_is_no_verdict_naming_which() -> None:
    with pytest.raises(ShardError) as info:
        check_shards(shards()[:2])
    assert str(info.value) == ("shard 3 of 3 missing: no verdict on part of a run (given: 1, 2)")


def test_a_shard_given_twice_names_both_files() -> None:
    reports = shards()
    with pytest.raises(ShardError, match=r"shard 2 of 3 given twice: s2.json and again.json"):
        check_shards([*reports, ("again.json", reports[1][1])])


def test_shards_of_different_runs_name_the_first_difference() -> None:
    one, other = shards(), shards(gates={"min_acc": 0.6})
    with pytest.raises(ShardError) as info:
        check_shards([one[0], one[1], other[2]])
    assert str(info.value) == (
        "shards of different runs: s1.json and s3.json differ in plan.gates.min_acc"
    )
    with pytest.raises(ShardError, match=r"s1.json is a shard of 3, s4.json of 4"):
        check_shards([*one, shards(count=4)[3]])


def test_a_shard_that_ran_another_slice_is_refused() -> None:
    reports = shards()
    block = reports[1][1]["shard"]
    block["ids"] = [*block["ids"][1:], block["ids"][0]]  # the same problems, another order
    with pytest.raises(ShardError, match="not the slices of their plan's selection"):
        check_shards(reports)
    reports = shards()
    reports[2][1]["shard"]["ids"].pop()  # one problem fewer
    with pytest.raises(ShardError, match="not the slices of their plan's selection"):
        check_shards(reports)


def test_a_record_outside_its_shard_or_in_two_shards_is_refused() -> None:
    reports = shards()
    reports[0][1]["problems"].append(record("test-0001"))  # shard 2's problem
    with pytest.raises(ShardError, match=r"s1.json: problem 'test-0001' is not in shard 1's"):
        check_shards(reports)
    # a forged plan whose selection holds a problem twice, once in each of two shards
    with pytest.raises(ShardError, match=r"problem 'test-0000' is in two shards: s1.json and s2"):
        check_shards(shards(count=2, ids=["test-0000", "test-0000"]))


def test_a_report_that_is_not_a_shards_is_refused() -> None:
    with pytest.raises(ShardError, match=r"r.json: not a shard's report \(run with --gsm8k-shard"):
        check_shards([("r.json", {"problems": []})])
    reports = shards()
    reports[0][1]["shard"]["index"] = 0
    with pytest.raises(ShardError, match=r"s1.json: corrupt shard block"):
        check_shards(reports)
    # two tests' different answers (core/tally.py): of its own problems, two node ids each
    pair = ["gsm8k::t", "a.py::t"]
    for clashes in ({"test-0001": pair}, {"test-0000": pair[:1]}, [pair]):
        reports = shards()
        reports[0][1]["shard"]["clashes"] = clashes
        with pytest.raises(ShardError, match=r"s1.json: corrupt shard block \(clashes\)"):
            check_shards(reports)
    reports[0][1]["shard"]["clashes"] = {"test-0000": pair}
    assert check_shards(reports).clashes == {"test-0000": ("gsm8k::t", "a.py::t")}


def test_a_shard_id_utf8_cannot_hold_is_a_corrupt_block_not_a_traceback() -> None:
    """A lone surrogate (JSON's \\ud800) in a shard's ids: the selection's hash cannot encode
    it; one line naming the block (was a UnicodeEncodeError out of the merge)."""
    reports = shards()
    reports[0][1]["shard"]["ids"][0] = "test-\ud800"
    with pytest.raises(ShardError, match=r"s1.json: corrupt shard block"):
        check_shards(reports)


def test_the_plans_settings_come_back_as_the_options_gave_them() -> None:
    given = settings(limit="30", stop=["Q:", "\n\n"], param=["top_p=0.5"], min_acc="0.8")
    stored = {key: getattr(given, key) for key in PLANNED}
    block = json.loads(json.dumps({"settings": stored}))  # as a report holds it
    again = planned_settings(block, settings())
    assert again == given
    block["settings"]["limit"] = {"not": "an option's value"}
    with pytest.raises(ShardError, match=r"corrupt shard plan \(a setting is dict\)"):
        planned_settings(block, settings())
    del block["settings"]["limit"]
    with pytest.raises(ShardError, match=r"corrupt shard plan \(settings\)"):
        planned_settings(block, settings())


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("rules", ["strict"], "rules"),
        ("samples", "text", "samples"),
        ("samples", [{"text": 1}], "text"),
        ("usage", {"prompt_tokens": -1}, "rules or usage"),
        ("error", 3, "error"),
    ],
)
def test_a_forged_record_is_one_line_naming_its_field(field: str, value: Any, said: str) -> None:
    reports = shards()
    reports[1][1]["problems"][0][field] = value
    with pytest.raises(ShardError) as info:
        check_shards(reports)
    assert str(info.value) == f"s2.json: corrupt record of 'test-0001' ({said})"


def test_a_record_without_its_index_is_one_line_not_a_traceback_at_the_verdict() -> None:
    """compare's reader lets a record leave out its index (0); the merge's verdict sorts the
    problems by it: a shard's record without one is refused by name (was a KeyError)."""
    reports = shards()
    del reports[1][1]["problems"][0]["index"]
    with pytest.raises(ShardError) as info:
        check_shards(reports)
    assert str(info.value) == "s2.json: corrupt record of 'test-0001' (index)"
