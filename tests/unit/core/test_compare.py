"""Two JSON reports compared on their own (core/compare.py): pairing by id, the exact
statistics on small cases, refusals in one line naming the files, and the Markdown."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from typing import Any

import pytest

from pytest_gsm8k.core.compare import (
    MAX_CONFIGS,
    MAX_PROBLEMS,
    CompareError,
    Comparison,
    compare,
    compare_all,
    load_report,
)
from pytest_gsm8k.core.records import REPORT_SCHEMA
from pytest_gsm8k.core.render import LISTED, compare_markdown, problem_list
from pytest_gsm8k.core.stats import mcnemar_one_sided, paired_difference_interval

PROTOCOL = {"name": "test@1", "samples": 1, "max_tokens": 1024, "label": "test@1, 0-shot CoT"}
DATASET = {
    "name": "embedded openai/gsm8k",
    "config": "main",
    "split": "test",
    "fingerprint": "7573bc2082847ca0",
    "rows": 1319,
}


def pid(index: int) -> str:
    return f"test-{index:04d}"


def report(
    outcomes: dict[int, str],
    *,
    model: str = "m",
    protocol: dict[str, Any] | None = None,
    dataset: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A JSON report holding ``outcomes`` (index -> outcome), with what compare reads."""
    problems = [
        {"index": i, "id": pid(i), "outcome": o, "correct": o == "correct"}
        for i, o in sorted(outcomes.items())
    ]
    return {
        "schema": REPORT_SCHEMA,
        "model": model,
        "complete": True,
        "protocol": dict(protocol or PROTOCOL),
        "dataset": dict(dataset or DATASET),
        "problems": problems,
    }


def every(indices: Iterable[int], outcome: str) -> dict[int, str]:
    return dict.fromkeys(indices, outcome)


def test_identical_runs_pass_with_nothing_flipped() -> None:
    a = report(every(range(8), "correct") | every(range(8, 10), "wrong"))
    result = compare(a, a)
    assert (result.block["shared"], result.only_a, result.only_b, result.errors) == (10, 0, 0, 0)
    assert result.block["newly_failing"] == result.block["newly_passing"] == []
    assert result.block["p_value"] == 1.0
    assert result.block["difference"] == 0.0
    assert (
        result.block["difference"],
        *result.block["difference_ci95"],
    ) == paired_difference_interval(8, 0, 0, 2)
    assert result.a.accuracy == result.b.accuracy == 0.8
    assert result.verdict.passed


def test_six_newly_failing_of_ten_is_worse_at_5_percent_not_at_1() -> None:
    a = report(every(range(10), "correct"))
    b = report(every(range(4), "correct") | every(range(4, 10), "wrong"))
    result = compare(a, b)
    assert result.block["newly_failing"] == [pid(i) for i in range(4, 10)]
    assert result.block["newly_passing"] == []
    # exact one-sided McNemar: P(X >= 6 | Bin(6, 1/2)) = 1/64
    assert result.block["p_value"] == 1 / 64
    assert (
        result.block["difference"],
        *result.block["difference_ci95"],
    ) == paired_difference_interval(4, 6, 0, 0)
    assert result.block["difference"] == pytest.approx(-0.6)
    assert not result.verdict.passed
    assert result.verdict.rule == "noise-aware"
    assert result.verdict.detail == (
        # two single runs: no "always-right" (issue 32, point 5), and the diff is the one
        # estimate every line shows, with its one interval (point 2)
        "p=0.0156 < --alpha 0.05 (exact McNemar): 6 newly failing, 0 newly passing; "
        "diff -60.00 points [95% CI -83.18, -20.05]"
    )
    assert compare(a, b, alpha=0.01).verdict.passed


def test_flips_both_ways_are_listed_in_problem_order() -> None:
    a = report({12: "correct", 3: "correct", 5: "wrong", 7: "wrong", 9: "wrong", 1: "correct"})
    b = report({12: "wrong", 3: "wrong", 5: "correct", 7: "correct", 9: "correct", 1: "correct"})
    # alpha 0.2: three right in A reach p = 1/8 at best, a test at 0.05 could not fail
    result = compare(a, b, alpha=0.2)
    assert result.block["newly_failing"] == [pid(3), pid(12)]
    assert result.block["newly_passing"] == [pid(5), pid(7), pid(9)]
    assert result.block["p_value"] == mcnemar_one_sided(2, 3)
    assert result.block["difference"] == pytest.approx(1 / 6)
    # at 0.05, three right in A: even all failing gives p = 1/8, a test that cannot fail
    # decides nothing (it is undecided, never a PASS)
    at_05 = compare(a, b).verdict
    assert not at_05.passed
    assert at_05.detail.startswith("not a verdict: the smallest p 6 problems can give")


def test_only_the_ids_both_hold_are_paired_and_counted() -> None:
    a = report(every(range(10), "correct"))
    b = report(every(range(5, 15), "wrong"))
    result = compare(a, b)
    assert (result.block["shared"], result.only_a, result.only_b) == (5, 5, 5)
    assert result.block["newly_failing"] == [pid(i) for i in range(5, 10)]
    assert result.a.n == result.b.n == 10
    assert (
        "\nPaired on the 5 problems both reports hold (A holds 10, B holds 10; 5 only in A, "
        "5 only in B).\n" in compare_markdown(result)
    )


def test_a_problem_that_ended_in_an_error_is_left_out_and_counted() -> None:
    a = report(every(range(4), "correct"))
    b = report({0: "error", 1: "correct", 2: "correct", 3: "wrong"})
    result = compare(a, b)
    assert (result.block["shared"], result.errors) == (3, 1)
    assert result.block["newly_failing"] == [pid(3)]
    assert "1 that ended in an error in either, left out" in compare_markdown(result)


@pytest.mark.parametrize("side", ["A", "B"])
def test_errors_leave_a_passing_comparison_undecided(side: str) -> None:
    """Rule: a gate that was not decided never passes. Six unanswered problems in B (or in
    A) could be six failures of B: left out, the rest passed."""
    good = report(every(range(20), "correct"))
    errored = report(every(range(6), "error") | every(range(6, 20), "correct"))
    a, b = (errored, good) if side == "A" else (good, errored)
    result = compare(a, b)
    assert not result.verdict.passed
    counts = "(6 in A, 0 in B)" if side == "A" else "(0 in A, 6 in B)"
    assert result.undecided == (
        f"6 of the 20 problems both reports hold ended in an error {counts}, and unanswered "
        "they could hide a drop: rerun until every problem has an answer"
    )
    assert result.verdict.rule == "noise-aware"
    assert result.verdict.detail.startswith(f"not a verdict: {result.undecided}; on what ran: p=1")


@pytest.mark.parametrize(
    ("side", "hidden", "said"),
    [
        ("A", {"subset": {"deselected": 3}}, "A left 3 problems of its selection out (deselected)"),
        ("B", {"complete": False, "n": 20, "expected": 23}, "B is an incomplete run (20 of 23"),
        # a shard holds its slice of the selection: its run's verdict is the merge's
        ("B", {"shard": {"index": 1, "count": 3}}, "B is shard 1 of 3 of a run (merge the"),
    ],
)
def test_a_report_that_left_problems_out_never_passes(
    side: str, hidden: dict[str, Any], said: str
) -> None:
    """Rule: a gate that was not decided never passes. A report whose run deselected problems
    (``-k``, ``--deselect``), did not finish or is one shard of a run (which passed at 0 on
    its slice) could have left its failures out: the comparison of what both hold is not a
    verdict."""
    a, b = report(every(range(20), "correct")), report(every(range(20), "correct"))
    (a if side == "A" else b).update(hidden)
    result = compare(a, b)
    assert not result.verdict.passed
    assert result.undecided is not None
    assert said in result.undecided
    assert result.undecided.endswith("rerun until every problem has an answer")
    assert result.verdict.detail.startswith(f"not a verdict: {result.undecided}")


def test_an_error_in_one_of_a_problems_repeats_counts_as_an_error() -> None:
    a = report(every(range(20), "correct"))
    b = report(every(range(20), "correct"))
    b["problems"][0]["repeats"] = ["correct", "error", "correct"]
    result = compare(a, b)
    assert (result.errors, result.verdict.passed) == (1, False)
    assert "(0 in A, 1 in B)" in str(result.undecided)


def test_a_failing_comparison_with_errors_stays_a_fail_of_its_rule() -> None:
    a = report(every(range(20), "correct"))
    b = report({0: "error"} | every(range(1, 10), "wrong") | every(range(10, 20), "correct"))
    result = compare(a, b)
    assert not result.verdict.passed
    assert result.undecided is None
    assert result.verdict.detail.startswith("p=0.00195 < --alpha 0.05")


def matrix(configs: dict[str, dict[int, str]], **protocols: dict[str, Any]) -> dict[str, Any]:
    """A --gsm8k-config report: per config its entry and its problems, ids carrying its name."""
    top = report({})
    top["configs"] = []
    for name, outcomes in configs.items():
        entry = report(outcomes, model=f"org/{name}", protocol=protocols.get(name))
        entry["config"] = {"name": name, "model_name": f"org/{name}"}
        for record in entry.pop("problems"):
            top["problems"].append(record | {"id": f"{name}:{record['id']}"})
        top["configs"].append(entry)
    return top


def test_a_matrix_is_compared_config_by_config() -> None:
    """Rule: a matrix's configs are gated each on its own; pooled, alpha's drop hid behind
    beta's rise (17 flips each way, p=0.57)."""
    high = every(range(45), "correct") | every(range(45, 50), "wrong")
    low = every(range(28), "correct") | every(range(28, 50), "wrong")
    a = matrix({"alpha": high, "beta": low})
    b = matrix({"alpha": low, "beta": high})
    results = compare_all(load_report(json.dumps(a), "a"), load_report(json.dumps(b), "b"))
    assert all(isinstance(r, Comparison) for r in results)
    alpha, beta = (r for r in results if isinstance(r, Comparison))
    assert (
        alpha.config,
        alpha.block["shared"],
        len(alpha.block["newly_failing"]),
        alpha.verdict.passed,
    ) == (
        "alpha",
        50,
        17,
        False,
    )
    assert alpha.block["newly_failing"][0] == "alpha:test-0028"
    assert (beta.config, len(beta.block["newly_passing"]), beta.verdict.passed) == (
        "beta",
        17,
        True,
    )
    assert alpha.a.model == "org/alpha"
    # two plain reports: one comparison
    (single,) = compare_all(report(high), report(low))
    assert isinstance(single, Comparison)
    assert single.config == ""


@pytest.mark.parametrize("side", ["A", "B"])
def test_a_shard_of_a_matrix_leaves_every_configs_comparison_undecided(side: str) -> None:
    """Rule: a gate that was not decided never passes. A --gsm8k-config report of one shard
    holds the run's shard block at its top only; each config's comparison paired the slice
    and passed (exit 0), as a single run's shard no longer does."""
    whole = matrix({"alpha": every(range(10), "correct")})
    shard = matrix({"alpha": every(range(0, 10, 2), "correct")})
    shard["shard"] = {"index": 1, "count": 2}
    a, b = (shard, whole) if side == "A" else (whole, shard)
    [result] = compare_all(load_report(json.dumps(a), "a"), load_report(json.dumps(b), "b"))
    assert isinstance(result, Comparison)
    assert not result.verdict.passed
    assert result.undecided == (
        f"{side} is shard 1 of 2 of a run (merge the shards: python -m pytest_gsm8k merge): "
        "rerun until every problem has an answer"
    )


def test_a_config_of_another_protocol_or_in_one_report_only_is_refused_on_its_own() -> None:
    a = matrix({"alpha": every(range(5), "correct"), "beta": every(range(5), "correct")})
    b = matrix(
        {"beta": every(range(5), "correct"), "gamma": every(range(5), "correct")},
        beta=PROTOCOL | {"shots": 5},
    )
    results = compare_all(a, b, where=("a.json", "b.json"))
    assert [str(r) for r in results if isinstance(r, CompareError)] == [
        "config alpha: refused to compare a.json with b.json: only a.json has it",
        "config beta: refused to compare a.json with b.json: protocol shots is 5 in B (b.json) "
        "but None in A (a.json)",
        "config gamma: refused to compare a.json with b.json: only b.json has it",
    ]
    with pytest.raises(CompareError, match=r"b\.json is a --gsm8k-config report \(one compar"):
        compare_all(report(every(range(5), "correct")), b, where=("a.json", "b.json"))


def test_the_bounds_of_a_report_are_checked_before_anything_is_compared() -> None:
    """Rule: a report is untrusted input (a forged list of 1,000,000 repeats hung)."""
    many = report(every(range(MAX_PROBLEMS + 1), "correct"))
    with pytest.raises(CompareError, match=rf"\(problems: {MAX_PROBLEMS + 1} entries, at most"):
        load_report(json.dumps(many), "a")
    configs = matrix({f"c{i}": {} for i in range(MAX_CONFIGS + 1)})
    with pytest.raises(CompareError, match=rf"\(configs: {MAX_CONFIGS + 1} entries, at most"):
        load_report(json.dumps(configs), "a")


def test_reports_of_different_protocols_are_refused_naming_the_first_difference() -> None:
    a = report(every(range(3), "correct"))
    b = report(every(range(3), "correct"), protocol=PROTOCOL | {"max_tokens": 512})
    with pytest.raises(CompareError) as info:
        compare(a, b, where=("a.json", "b.json"))
    assert str(info.value) == (
        "refused to compare a.json with b.json: protocol max_tokens is 512 in B (b.json) but "
        "1024 in A (a.json)"
    )


def test_reports_of_different_datasets_are_refused() -> None:
    a = report(every(range(3), "correct"))
    b = report(every(range(3), "correct"), dataset=DATASET | {"fingerprint": "0" * 16})
    with pytest.raises(CompareError, match=r"^refused to compare A with B: dataset fingerprint"):
        compare(a, b)


def test_other_models_and_labels_compare_but_no_common_id_does_not() -> None:
    a = report(every(range(3), "correct"), model="one")
    b = report(every(range(3), "correct"), model="two", protocol=PROTOCOL | {"label": "x"})
    assert compare(a, b).block["shared"] == 3
    with pytest.raises(CompareError, match="no problem id in common"):
        compare(a, report(every(range(3, 6), "correct")))
    with pytest.raises(CompareError, match="all 3 problems both hold ended in an error"):
        compare(a, report(every(range(3), "error")))


def _text(**fields: Any) -> str:
    return json.dumps(report(every(range(2), "correct")) | fields)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("{not json", "not JSON (line 1"),
        ("[]", "not a pytest-gsm8k JSON report (written by --gsm8k-report)"),
        ('{"kind": "pytest-gsm8k baseline"}', "not a pytest-gsm8k JSON report"),
        (_text(schema=1), f"JSON report schema 1; this version reads schema {REPORT_SCHEMA}"),
        (_text(protocol=None), "corrupt JSON report (protocol: missing or not an object)"),
        (_text(problems={}), "(problems: not a list)"),
        (
            _text(problems=[{"outcome": "correct"}]),
            "(problems[0].id: None is not a string of 1 to 1000 characters)",
        ),
        (
            _text(problems=[{"id": "t", "outcome": "correct", "correct": True}] * 2),
            "(problems[1].id: 't' appears twice)",
        ),
        (
            _text(problems=[{"id": "t", "outcome": "right", "correct": True}]),
            "(problems[0].outcome: 'right' is not one of correct, wrong, unparsed, truncated, "
            "error)",
        ),
        (
            _text(problems=[{"id": "t", "outcome": "correct", "correct": True, "index": -1}]),
            "(problems[0].index: -1 is not a count)",
        ),
        (_text(model={"a": 1}), "(model: not a string)"),
        (
            _text(problems=[{"id": "t", "outcome": "wrong", "correct": True, "repeats": []}]),
            "(problems[0].correct: True with outcome wrong)",
        ),
        (
            _text(problems=[{"id": "t", "outcome": "wrong", "correct": False, "repeats": ["x"]}]),
            "(problems[0].repeats: 1 entries, not 2 to 100 outcomes)",
        ),
        (
            _text(problems=[{"id": "t", "outcome": "wrong", "correct": False, "repeats": "ab"}]),
            "(problems[0].repeats: not a list, not 2 to 100 outcomes)",
        ),
        (
            _text(
                problems=[
                    {"id": "t", "outcome": "wrong", "correct": False, "repeats": ["wrong", 7]}
                ]
            ),
            "(problems[0].repeats[1]: 7 is not one of correct, wrong",
        ),
        (
            _text(problems=[{"id": ["t"], "outcome": "wrong", "correct": False}]),
            "(problems[0].id: ['t'] is not a string",
        ),
        (_text(dataset=DATASET | {"config": ["main"]}), "(dataset.config: not a string)"),
        (
            _text(configs=[{"protocol": {}, "dataset": {"split": 7}, "config": {"name": "c"}}]),
            "(configs[0].dataset.split: not a string)",
        ),
        (_text(configs={}), "(configs: not a list)"),
        (_text(configs=[{"protocol": {}, "dataset": {}}]), "(configs[0].config.name: None is"),
        (_text(configs=[{"protocol": {}}]), "(configs[0].dataset: missing or not an object)"),
        (
            _text(configs=[{"protocol": {}, "dataset": {}, "config": {"name": "test"}}]),
            "(problems[0].id: 'test-0000' names no config)",
        ),
        (
            _text(schema="x" * 10_000),
            "JSON report schema 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...;",
        ),
        ("[" * 100 + "]" * 100, "nested deeper than 64"),
    ],
)
def test_a_file_that_is_not_a_report_is_one_line_naming_it(text: str, needle: str) -> None:
    with pytest.raises(CompareError) as info:
        load_report(text, "runs/a.json")
    message = str(info.value)
    assert message.startswith("runs/a.json: ")
    assert needle in message
    assert "\n" not in message


def test_markdown_reads_like_the_step_summary() -> None:
    a = report(every(range(10), "correct"), model="release-41")
    b = report(every(range(4), "correct") | every(range(4, 10), "wrong"), model="release-42")
    questions = {pid(4): "Janet's ducks lay 16 eggs per day. " * 5}
    text = compare_markdown(compare(a, b, where=("a.json", "b.json")), questions)
    lines = text.splitlines()
    assert lines[0] == "### gsm8k compare (test@1, 0-shot CoT): B 0.4000 vs A 1.0000 on 10 problems"
    assert "| A | `a.json` | `release-41` | 1.0000 | 10 |" in lines
    assert "| B | `b.json` | `release-42` | 0.4000 | 10 |" in lines
    assert "Paired on the 10 problems both reports hold (A holds 10, B holds 10)." in lines
    (stats,) = [line for line in lines if line.startswith("- accuracy: ")]
    assert stats.startswith(
        "- accuracy: 1.0000 -\\> 0.4000 on 10 problems; diff -60.00 points \\[95% CI -"
    )
    assert (
        "- flips: 6 newly failing, 0 newly passing; p=0.01562 (one-sided: the gate's test)" in text
    )
    assert "| gate | result | detail |" in lines
    assert any(
        line.startswith(
            "| compare | FAIL | p=0.0156 \\< --alpha 0.05 (exact McNemar): 6 newly failing, 0 "
            "newly passing"
        )
        for line in lines
    )
    assert "**Newly failing in B (6):**" in lines
    assert f"- `{pid(4)}`: Janet's ducks lay 16 eggs per day. Janet's ducks" in text
    assert f"- `{pid(9)}`: " in lines
    assert "Newly passing" not in text
    assert text.endswith("\n")


def test_markdown_escapes_what_came_from_outside() -> None:
    a = report(every(range(2), "correct"), model="evil`|\x1b[31m*bold*")
    text = compare_markdown(compare(a, a, where=("a|b.json", "a.json")))
    assert "\x1b" not in text
    assert "| A | `a\\|b.json` | ``evil`\\|*bold*`` | 1.0000 | 2 |" in text


def test_a_long_problem_list_says_how_many_more_and_where() -> None:
    ids = [pid(i) for i in range(LISTED + 3)]
    lines = problem_list("Newly failing in B", ids, {}, "see the JSON reports")
    assert lines[0] == f"**Newly failing in B ({LISTED + 3}):**"
    assert lines[-2] == "- ... and 3 more (see the JSON reports)"
    assert len([line for line in lines if line.startswith("- `")]) == LISTED
    assert problem_list("x", [], {}, "") == []


def test_reports_with_repeats_are_compared_by_the_noise_aware_rule() -> None:
    """A report run with --gsm8k-repeats carries each problem's outcomes: compare weighs a
    failure by them, as the baseline gate does. Six problems right 2 of 5 times in A failing
    once in B are noise; the same six right 5 of 5 times in A are a regression."""
    a = report(every(range(10), "correct"))
    b = report(every(range(4), "correct") | every(range(4, 10), "wrong"))
    for record in a["problems"][4:]:
        record.update(repeats=["correct", "correct", "wrong", "wrong", "wrong"])
    noisy = compare(a, b)
    assert noisy.verdict.passed
    assert "noise-aware, baseline 5 runs per problem" in noisy.verdict.detail
    assert "6 newly failing: 0 stable (right in all 5 baseline runs), 6 noisy" in (
        noisy.verdict.detail
    )
    for record in a["problems"][4:]:
        record["repeats"] = ["correct"] * 5
    stable = compare(a, b)
    assert not stable.verdict.passed
    assert "6 newly failing: 6 stable (right in all 5 baseline runs), 0 noisy" in (
        stable.verdict.detail
    )


def test_errors_on_a_comparison_too_small_to_fail_are_said_first() -> None:
    """Rule (decide's coverage, one rule for a run and compare): each reason a verdict is not
    one is a reason to act on; errors left out of a comparison too small to fail are named
    before the size, and the comparison is undecided (exit 1, its one stderr line)."""
    a = report(every(range(4), "correct"))
    b = report({0: "error", 1: "correct", 2: "correct", 3: "correct"})
    result = compare(a, b)
    assert not result.verdict.passed
    assert result.undecided == (
        "1 of the 4 problems both reports hold ended in an error (0 in A, 1 in B), and "
        "unanswered they could hide a drop: rerun until every problem has an answer"
    )
    assert result.verdict.detail.startswith(
        f"not a verdict: {result.undecided}; the smallest p 3 problems can give"
    )


def test_a_full_split_with_100_repeats_a_side_compares_in_seconds() -> None:
    """Rule (issue 32): compare's cost grows with the problems, not with problems x repeats
    squared. The largest reports compare accepts (the full split, 100 repeats a side: each
    noisy problem's rate 3 points lower in B) took over 300 s when the rate statistic's law
    was built problem by problem; the same p-values now come in seconds."""
    rates = [100] * 880 + [0] * 165 + [5 + (i * 90) // 274 for i in range(274)]

    def runs(right: list[int]) -> dict[str, Any]:
        out = report(every(range(len(right)), "wrong"))
        for record, k in zip(out["problems"], right, strict=True):
            record["repeats"] = ["correct"] * k + ["wrong"] * (100 - k)
            record["outcome"] = "correct" if 2 * k >= 100 else "wrong"
            record["correct"] = record["outcome"] == "correct"
        return out

    b = runs([r - 3 if 0 < r < 100 else r for r in rates])
    started = time.perf_counter()
    result = compare(runs(rates), b)
    assert time.perf_counter() - started < 20
    assert not result.verdict.passed
    assert result.block["difference"] == pytest.approx(-3 * 274 / 1319 / 100)
    assert "0 stable (right in all 100 baseline runs), 274 noisy" in result.verdict.detail
