"""Baseline files on their own: hand-edited or inconsistent files are refused naming the file,
and default names are readable, stable and distinct."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pytest_gsm8k.core import baseline as bl


def _baseline(problems: dict[str, Any], accuracy: float) -> str:
    return json.dumps(
        {
            "schema": bl.SCHEMA,
            "kind": bl.KIND,
            "protocol": {},
            "dataset": {},
            "accuracy": accuracy,
            "problems": problems,
        }
    )


@pytest.mark.parametrize(
    ("problems", "accuracy", "needle"),
    [
        ({"test-0000": "correct", "test-0001": None}, 0.5, "outcome None"),
        ({"test-0000": "corect"}, 1.0, "outcome 'corect'"),
        ({"test-0000": {"outcome": "right"}}, 1.0, "outcome 'right'"),
        ({"test-0000": "correct", "test-0001": "wrong"}, 1.0, "edited by hand"),
    ],
)
def test_hand_edited_baselines_are_refused_naming_the_file(
    problems: dict[str, Any], accuracy: float, needle: str
) -> None:
    with pytest.raises(bl.BaselineError) as info:
        bl.loads(_baseline(problems, accuracy), "snap/b.gsm8k")
    message = str(info.value)
    assert message.startswith("snap/b.gsm8k: ")
    assert needle in message
    assert "\n" not in message
    assert bl.loads(_baseline({"test-0000": "correct", "test-0001": "wrong"}, 0.5), "x")


def _document(**fields: Any) -> str:
    base = {
        "schema": bl.SCHEMA,
        "kind": bl.KIND,
        "protocol": {},
        "dataset": {},
        "accuracy": 0.5,
        "problems": {"test-0000": "correct", "test-0001": "wrong"},
    }
    return json.dumps(base | fields)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"n": 5}, "its n 5 is not the 2 problems it holds"),
        ({"partial": {"reason": "-k", "of": 9, "ids": ["test-0000"]}}, "its partial ids"),
        ({"partial": {"reason": "-k", "ids": ["test-0000", "test-0001"]}}, "no ids or no 'of'"),
    ],
)
def test_a_stored_problem_set_that_is_not_its_outcomes_is_refused(
    fields: dict[str, Any], needle: str
) -> None:
    with pytest.raises(bl.BaselineError) as info:
        bl.loads(_document(**fields), "snap/b.gsm8k")
    assert str(info.value).startswith("snap/b.gsm8k: corrupt baseline (")
    assert needle in str(info.value)
    partial = {"reason": "-k", "of": 9, "ids": ["test-0001", "test-0000"]}
    assert bl.loads(_document(n=2, partial=partial), "x")["partial"] == partial


def test_default_name_is_readable_stable_and_distinct() -> None:
    short = "test@1, 0-shot CoT"
    assert bl.default_name(short) == "test@1_0-shot_CoT"
    one, two = ("test@1, 0-shot CoT, params " + "x" * 400 + end for end in ("a", "b"))
    assert bl.default_name(one) == bl.default_name(one)
    assert bl.default_name(one) != bl.default_name(two)
    assert len(bl.default_name(one)) == bl.NAME_LIMIT
    assert bl.default_name(one).startswith("test@1_0-shot_CoT_params_xxx")


# -- calibrated baselines (--gsm8k-repeats) ----------------------------------------------------


def _report(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The fields of a JSON report bl.build reads."""
    return {
        "protocol": {"name": "test@1", "samples": 1, "label": "test@1, 0-shot CoT"},
        "dataset": {"config": "main", "split": "test", "fingerprint": "f", "rows": 1319},
        "model": "m",
        "accuracy": sum(r["correct"] for r in records) / len(records),
        "n": len(records),
        "expected": len(records),
        "problems": records,
    }


def _record(pid: str, outcomes: list[str]) -> dict[str, Any]:
    record: dict[str, Any] = {"id": pid, "outcome": outcomes[0], "correct": False}
    if len(outcomes) > 1:
        top = max(outcomes, key=outcomes.count)  # first of the most common, as combine_repeats
        record.update(outcome=top, repeats=outcomes)
        record["repeats_correct"] = outcomes.count("correct")
    record["correct"] = record["outcome"] == "correct"
    return record


def test_a_calibrated_baseline_stores_counts_and_its_calibration_on_one_line_each() -> None:
    records = [
        _record("test-0000", ["correct"] * 5),
        _record("test-0001", ["wrong", "correct", "correct", "wrong", "correct"]),
        _record("test-0002", ["wrong"] * 4 + ["unparsed"]),
    ]
    document = bl.build(_report(records))
    assert document["problems"] == {
        "test-0000": {"correct": 5, "outcome": "correct", "repeats": 5},
        "test-0001": {"correct": 3, "outcome": "correct", "repeats": 5},
        "test-0002": {"correct": 0, "outcome": "wrong", "repeats": 5},
    }
    assert document["calibration"] == {
        "repeats": 5,
        "stable_correct": 1,
        "stable_wrong": 1,
        "noisy": 1,
    }
    text = bl.dumps(document)
    assert '  "test-0001": {"correct": 3, "outcome": "correct", "repeats": 5},' in text.splitlines()
    loaded = bl.loads(text, "b.gsm8k")
    assert loaded == document
    assert [bl.runs(e) for e in loaded["problems"].values()] == [(5, 5), (3, 5), (0, 5)]


@pytest.mark.parametrize(
    "problems",
    [
        {"test-0000": "correct", "test-0001": "wrong"},  # single run (the first format)
        {  # pass@N / maj@N: sample counts are not runs
            "test-0000": {"outcome": "correct", "n_correct": 2, "n_samples": 4},
            "test-0001": {"outcome": "wrong", "n_correct": 0, "n_samples": 4},
        },
    ],
)
def test_every_older_format_reads_as_one_run_per_problem(problems: dict[str, Any]) -> None:
    loaded = bl.loads(_baseline(problems, 0.5), "old.gsm8k")
    assert [bl.runs(e) for e in loaded["problems"].values()] == [(1, 1), (0, 1)]
    pairs = bl.pairs(loaded, [{"id": "test-0000", "correct": False}, {"id": "x", "correct": 1}])
    assert [(p.base_correct, p.base_runs, p.now_correct, p.now_runs) for p in pairs] == [
        (1, 1, 0, 1)
    ]
    assert bl.calibration(loaded["problems"]) == {
        "repeats": 1,
        "stable_correct": 1,
        "stable_wrong": 1,
        "noisy": 0,
    }


@pytest.mark.parametrize(
    ("entry", "needle"),
    [
        ({"correct": 6, "outcome": "correct", "repeats": 5}, "correct 6 of 5 repeats"),
        ({"correct": 2, "outcome": "correct", "repeats": 0}, "correct 2 of 0 repeats"),
        ({"correct": "5", "outcome": "correct", "repeats": 5}, "are not counts"),
        ({"correct": True, "outcome": "correct", "repeats": 5}, "are not counts"),
        ({"correct": 0, "outcome": "correct", "repeats": 5}, "edited by hand"),
        ({"correct": 4, "outcome": "wrong", "repeats": 5}, "edited by hand"),
    ],
)
def test_hand_edited_calibrated_entries_are_refused(entry: dict[str, Any], needle: str) -> None:
    accuracy = 1.0 if entry["outcome"] == "correct" else 0.0
    with pytest.raises(bl.BaselineError) as info:
        bl.loads(_baseline({"test-0000": entry}, accuracy), "snap/b.gsm8k")
    message = str(info.value)
    assert message.startswith("snap/b.gsm8k: corrupt baseline (problem test-0000:")
    assert needle in message
    assert "\n" not in message


def test_a_calibration_that_is_not_its_problems_is_refused() -> None:
    document = bl.build(_report([_record("test-0000", ["correct", "wrong", "correct"])]))
    document["calibration"]["noisy"] = 0
    with pytest.raises(bl.BaselineError, match=r"its calibration .* edited by hand"):
        bl.loads(bl.dumps(document), "b.gsm8k")


def test_pairs_read_the_candidates_repeats_as_a_mean() -> None:
    document = bl.build(_report([_record("test-0000", ["correct"] * 5)]))
    pairs = bl.pairs(document, [_record("test-0000", ["correct", "wrong", "correct"])])
    assert [(p.base_correct, p.base_runs, p.now_correct, p.now_runs) for p in pairs] == [
        (5, 5, 2, 3)
    ]
    assert pairs[0].stable_flip


# -- a vLLM config's baseline (--gsm8k-config) --------------------------------------------------


def _config_report(name: str, model: str) -> dict[str, Any]:
    report = _report([_record(f"{name}:test-0000", ["correct"])])
    report["config"] = {"name": name, "model_name": model, "accuracy_threshold": 0.5}
    return report


def _in_the_baseline(document: dict[str, Any], report: dict[str, Any]) -> str | None:
    return bl.first_difference(document, report, here="here", there="in the baseline")


def test_a_configs_baseline_holds_its_name_and_model_and_gates_no_other_config() -> None:
    document = bl.build(_config_report("Alpha", "org/Alpha"))
    assert document["config"] == {"name": "Alpha", "model_name": "org/Alpha"}
    assert _in_the_baseline(document, _config_report("Alpha", "org/Alpha")) is None
    assert _in_the_baseline(document, _config_report("Delta", "org/Alpha")) == (
        "config name is 'Delta' here but 'Alpha' in the baseline"
    )
    assert _in_the_baseline(document, _config_report("Alpha", "org/Other")) == (
        "config model_name is 'org/Other' here but 'org/Alpha' in the baseline"
    )
    # a single run's baseline never gates a config, nor a config's a single run
    single = bl.build(_report([_record("test-0000", ["correct"])]))
    assert _in_the_baseline(single, _config_report("Alpha", "org/Alpha")) == (
        "config name is 'Alpha' here but None in the baseline"
    )
    assert _in_the_baseline(document, _report([_record("test-0000", ["correct"])])) == (
        "config name is None here but 'Alpha' in the baseline"
    )


# -- a protocol that has no baseline, beside one of another protocol ----------------------------


def _shots(report: dict[str, Any], shots: int, **dataset: Any) -> dict[str, Any]:
    """``report`` asked with ``shots`` exemplars (and another dataset's fields, if given)."""
    fewshot = {"fewshot_hash": "ab12" if shots else None, "fewshot_source": "train (seed 1)"}
    return report | {
        "protocol": report["protocol"] | {"shots": shots, **fewshot},
        "dataset": report["dataset"] | dataset,
    }


def test_the_first_difference_is_an_option_a_user_sets_not_what_follows_from_it() -> None:
    """Rule: "shots is 5 here but 0 there", never the exemplars' hash (issue 34.2)."""
    base = bl.build(_shots(_report([_record("test-0000", ["correct"])]), 0))
    now = _shots(_report([_record("test-0000", ["correct"])]), 5)
    assert (
        bl.first_difference(base, now, here="here", there="there")
        == "protocol shots is 5 here but 0 there"
    )


def test_a_protocol_moved_from_the_baseline_of_the_same_data_and_config_only() -> None:
    """Rule: a missing baseline's protocol moved from a baseline beside it of the same dataset
    and config but another protocol; another dataset's or config's is no move (issue 34.2)."""
    run = _shots(_report([_record("test-0000", ["correct"])]), 5)
    old = bl.build(_shots(_report([_record("test-0000", ["correct"])]), 0))
    other_data = bl.build(_shots(_report([_record("test-0000", ["correct"])]), 0, fingerprint="g"))
    configs = bl.build(_shots(_config_report("Alpha", "org/Alpha"), 0))
    smaller = old | {"dataset": old["dataset"] | {"rows": 50}}  # a subset of the same split
    assert bl.moved_from([], run) is None
    assert bl.moved_from([("o.gsm8k", other_data), ("c.gsm8k", configs)], run) is None
    assert bl.moved_from([("o.gsm8k", other_data), ("b.gsm8k", smaller)], run) == (
        "b.gsm8k (protocol shots is 5 here but 0 there)"
    )
    # a config's protocol moves within the config's own name (its model may change too)
    alpha = _shots(_config_report("Alpha", "org/Alpha-2"), 5)
    assert bl.moved_from([("d.gsm8k", old), ("c.gsm8k", configs)], alpha) == (
        "c.gsm8k (protocol shots is 5 here but 0 there)"
    )
    # the same protocol under another name (--gsm8k-baseline-name) is not another protocol
    assert bl.moved_from([("named.gsm8k", bl.build(run))], run) is None


def test_a_key_given_twice_is_refused_naming_the_file_the_key_and_its_line() -> None:
    """Rule: a duplicate key in a baseline is refused (json keeps the later copy silently:
    a problem id pasted twice would gate against whichever outcome came last)."""
    text = bl.dumps(json.loads(_document()))
    # the later copy agrees with the stored accuracy: nothing else would refuse the file
    doubled = text.replace('"test-0001": "wrong"', '"test-0001": "wrong",\n  "test-0000": "wrong"')
    doubled = doubled.replace('"accuracy": 0.5', '"accuracy": 0.0')
    assert doubled.count('"test-0000"') == 2
    line = doubled.splitlines().index('  "test-0000": "wrong"') + 1
    with pytest.raises(bl.BaselineError) as info:
        bl.loads(doubled, "snap/b.gsm8k")
    message = str(info.value)
    assert message.startswith(f"snap/b.gsm8k:{line}: ")
    assert "'test-0000' given twice" in message
    assert "\n" not in message
    # the same key in two different objects is no duplicate
    calibrated = _document(
        problems={"test-0000": {"correct": 1, "outcome": "correct", "repeats": 1}}, accuracy=1.0
    )
    assert bl.loads(calibrated, "x")
    with pytest.raises(bl.BaselineError, match=r"x:1: .*'accuracy' given twice"):
        bl.loads(_document()[:-1] + ', "accuracy": 1.0}', "x")


def test_the_noise_line_never_claims_a_drop_larger_than_the_run() -> None:
    """Issue 32 #4, a claim that is true: four problems against a single-run baseline need
    more problems failing than ran (the test cannot fail); the line said "detects a drop of
    175.0 points or more ... (7 problems ...)". It says no drop is detectable instead."""
    from pytest_gsm8k.core.baseline import noise_block, noise_sentence
    from pytest_gsm8k.core.calibrated import Pair, evidence

    pairs = [Pair(f"p{i}", 1, 1, 1, 1) for i in range(4)]
    document = {"problems": {p.problem_id: "correct" for p in pairs}}
    records = [{"id": p.problem_id, "correct": True} for p in pairs]
    line = noise_sentence(noise_block(document, records, [], 0.01, evidence(pairs)))
    assert "points or more" not in line, line
    assert "detects no drop at this size (4 problems; alpha=0.01)" in line, line
    assert "it cannot reach 80% power against a 5-point drop at this size" in line
