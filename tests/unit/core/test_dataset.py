"""Pure parts of the dataset: the fingerprint, seeded subsets and their order."""

from __future__ import annotations

from decimal import Decimal

import pytest
from gsm8k_copy import data_dir

from pytest_gsm8k.core.dataset import (
    Split,
    fingerprint,
    select,
)
from pytest_gsm8k.core.render import subset_words
from pytest_gsm8k.core.types import Problem
from pytest_gsm8k.runtime.data import load_split

DATA = data_dir()


@pytest.fixture(scope="module")
def loaded_split() -> Split:
    return load_split(str(DATA), "test", "main")


#: Pinned: --gsm8k-limit 5 (seed 1234) must pick the same problems in every release.
LIMIT5_SEED1234 = [719, 780, 910, 959, 1060]


def test_fingerprint_sees_content_and_order() -> None:
    pairs = [("q1", "a #### 1"), ("q2", "a #### 2")]
    base = fingerprint(pairs)
    assert base == fingerprint(list(pairs))
    assert len(base) == 16
    assert fingerprint(pairs[::-1]) != base
    assert fingerprint([("q1", "a #### 1"), ("q2", "a #### 3")]) != base
    assert fingerprint([("q1a", " #### 1"), ("q2", "a #### 2")]) != base  # field boundary


def test_select_all_when_no_limit_or_limit_too_big(loaded_split: Split) -> None:
    problems = loaded_split.problems
    assert select(problems, None, 1234) == problems
    assert select(problems, 5000, 1234) == problems
    assert select(problems, 1319, 1234) == problems


def test_select_is_seeded_stable_nested_and_in_split_order(loaded_split: Split) -> None:
    problems = loaded_split.problems
    fifty = select(problems, 50, 1234)
    assert len(fifty) == 50
    assert [p.index for p in fifty] == sorted(p.index for p in fifty)  # split order
    assert select(problems, 50, 1234) == fifty
    assert [p.index for p in fifty] != list(range(50))  # not simply the first N
    twenty = select(problems, 20, 1234)
    assert set(twenty) < set(fifty)
    assert set(select(problems, 50, 7)) != set(fifty)
    assert [p.index for p in select(problems, 5, 1234)] == LIMIT5_SEED1234


def test_the_seeded_order_is_a_permutation_that_depends_on_the_id_only(
    loaded_split: Split,
) -> None:
    problems = loaded_split.problems
    assert len(set(select(problems, 1318, 1234))) == 1318  # no problem drawn twice
    assert select(problems, 1318, 1234) == select(problems, 1318, 1234)
    assert select(problems, 1318, 99) != select(problems, 1318, 1234)
    # The order of a problem depends on its id only, not on what else is in the list.
    part = tuple(p for p in problems if p.index % 2 == 0)
    evens = tuple(p for p in select(problems, 50, 1234) if p.index % 2 == 0)
    assert select(part, len(evens), 1234) == evens


def test_select_first_takes_the_head_and_describes_it() -> None:
    problems = tuple(
        Problem(index=i, split="test", question=f"q{i}", answer=f"#### {i}", gold=Decimal(i))
        for i in range(10)
    )
    assert [p.index for p in select(problems, 3, 1234, first=True)] == [0, 1, 2]
    assert select(problems, 30, 1234, first=True) == problems
    # the report's subset as core/tally.py builds it (its shape: the acceptance goldens,
    # and test_engine_presets.py for "first")
    seeded = {"limit": 3, "seed": 1, "of": 10, "ids_hash": "h", "deselected": 0}
    head = {**seeded, "first": True}
    whole = {**seeded, "limit": None}
    assert subset_words(head) == "the first 3 of 10"
    assert subset_words(seeded) == "seeded subset of 10 (limit 3, seed 1)"
    assert subset_words(whole) == ""
