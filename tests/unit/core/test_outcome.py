"""Pure scoring of responses into outcome records, and their aggregation (no HTTP, no pytester)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pytest_gsm8k.core.gates import MinAcc, NoiseAware
from pytest_gsm8k.core.outcome import combine_repeats, error_record, score_response
from pytest_gsm8k.core.plan import GateSpecs
from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.records import ProblemRecord
from pytest_gsm8k.core.render import styled_lines
from pytest_gsm8k.core.types import Completion, ModelResponse, Problem
from pytest_gsm8k.core.verdict import (
    Group,
    GroupInput,
    GroupVerdict,
    Selection,
    decide_run,
)

PROBLEM = Problem(index=7, split="test", question="q?", answer="... #### 18", gold=Decimal(18))


def _score(
    *texts: str,
    protocol: Protocol | None = None,
    finish: str = "stop",
    reasoning: str | None = None,
) -> ProblemRecord:
    response = ModelResponse(
        completions=[Completion(text=t, finish_reason=finish, reasoning=reasoning) for t in texts]
    )
    return score_response(PROBLEM, response, protocol or Protocol(), None)


@pytest.mark.parametrize(
    ("text", "outcome", "extracted"),
    [
        ("So she makes $18.\n#### 18", "correct", "18"),
        ("#### 18.00", "correct", "18"),
        ("#### $18", "unparsed", None),  # the seed's strict rule has no '$'; flexible finds it
        ("#### 19", "wrong", "19"),
        ("I cannot say.", "unparsed", None),
        ("<think>#### 5</think>\n#### 18", "correct", "18"),
        ("<think>so it is #### 18</think>\nno idea", "unparsed", None),
    ],
)
def test_test_at_1_outcomes(text: str, outcome: str, extracted: str | None) -> None:
    record = _score(text)
    assert record["outcome"] == outcome
    assert record["extracted"] == extracted
    assert record["correct"] is (outcome == "correct")
    assert record["id"] == "test-0007"
    assert record["gold"] == "18"


def test_flexible_is_scored_beside_strict() -> None:
    record = _score("She makes $18 a day.")
    assert record["rules"] == {
        "strict": False,
        "answer-is": False,
        "boxed": False,
        "flexible": True,
        "last-int": True,
    }


def test_truncated_when_cut_and_not_correct() -> None:
    assert _score("Let me think: 3 + 4 =", finish="length")["outcome"] == "truncated"
    assert _score("#### 18", finish="length")["outcome"] == "correct"


def test_reasoning_only_response_is_unparsed_with_a_note() -> None:
    record = _score("", reasoning="... so the answer is 18")
    assert record["outcome"] == "unparsed"
    assert "reasoning_content" in record["note"]


@pytest.mark.parametrize(
    ("text", "reasoning", "shown"),
    [
        ("<THINK>step 1</Think>#### 18", None, "step 1"),  # tags in any ASCII case
        ("plan</tHiNk>#### 18", None, "plan"),  # the opening tag stripped by the server
        ("<thinK>never closed", None, "never closed"),
        ("<think>a</think>#### 18", "the server's", "the server's"),
        ("#### 18", "", None),  # an empty reasoning field is no reasoning
        ("#### 18", None, None),
    ],
)
def test_the_reported_reasoning(text: str, reasoning: str | None, shown: str | None) -> None:
    assert _score(text, reasoning=reasoning)["samples"][0]["reasoning"] == shown


def test_pass_and_maj_decisions() -> None:
    texts = ("#### 17", "#### 18", "#### 17", "nothing")
    passed = _score(*texts, protocol=Protocol(name="pass@4", samples=4, temperature=0.7))
    assert passed["correct"]
    assert passed["n_correct"] == 1
    assert passed["n_samples"] == 4
    voted = _score(*texts, protocol=Protocol(name="maj@4", samples=4, temperature=0.7))
    assert not voted["correct"]
    assert voted["outcome"] == "wrong"
    assert voted["extracted"] == "17"
    assert voted["votes"] == [["17", 2], ["18", 1]]


def _summary(
    records: list[ProblemRecord],
    protocol: Protocol | None = None,
    split: str = "test",
    min_acc: float | None = None,
) -> GroupVerdict:
    """The records decided (core/verdict.py), with ``--gsm8k-min-acc`` when given."""
    protocol = protocol or Protocol()
    group = Group(
        name="",
        label=protocol.label,
        protocol=protocol.identity(),
        protocol_label=protocol.label,
        dataset={"name": "x", "config": "main", "split": split, "rows": 4, "fingerprint": "f"},
        subset={"limit": None, "seed": 1234, "of": 4},
        model="m",
        endpoint="http://e",
        specs=GateSpecs(MinAcc(min_acc) if min_acc is not None else None, NoiseAware(0.01), False),
    )
    selection = Selection(tuple(r["id"] for r in records))
    return decide_run([GroupInput(group, tuple(records), selection)], top=None, times=None)


def test_summary_counts_accuracy_interval_and_gate() -> None:
    records = [
        _score("#### 18"),
        _score("#### 18"),
        _score("#### 1"),
        error_record(PROBLEM, "HTTP 500 after retries"),
    ]
    summary = _summary(records, min_acc=0.6)
    assert summary.accuracy == 0.5
    assert summary.counts() == {"correct": 2, "wrong": 1, "unparsed": 0, "truncated": 0, "error": 1}
    low, high = summary.interval()
    assert 0.15 < low < 0.5 < high < 0.85
    (gate,) = summary.gates
    assert not gate.passed
    assert "is below --gsm8k-min-acc 0.6" in gate.detail
    assert summary.headline().startswith("gsm8k acc (test@1, 0-shot CoT) = 0.5000  [95% CI ")


def test_a_summary_with_no_answers_has_no_accuracy_figure() -> None:
    errors = [error_record(PROBLEM, "HTTP 404"), error_record(PROBLEM, "HTTP 404")]
    summary = _summary(errors)
    assert summary.answered == 0
    assert summary.headline() == "gsm8k acc (test@1, 0-shot CoT): no answers: 2 errors  n=2"
    lines = [line for line, _ in styled_lines(summary)]
    assert not any("0.0000" in line for line in lines), lines
    assert not any("by extractor" in line for line in lines), lines
    data = summary.to_json()
    assert data["accuracy"] is None
    assert data["ci95"] is None
    assert _summary([]).headline() == "gsm8k acc (test@1, 0-shot CoT): no answers  n=0"
    answered = _summary([*errors, _score("#### 1")])
    assert answered.headline().startswith("gsm8k acc (test@1, 0-shot CoT) = 0.0000  [95% CI ")
    assert answered.to_json()["accuracy"] == 0.0


def test_train_split_headline_says_not_reportable() -> None:
    assert (
        "train split: not a reportable number"
        in _summary([_score("#### 18")], split="train").headline()
    )


def test_pass_at_k_over_problems() -> None:
    protocol = Protocol(name="pass@4", samples=4, temperature=0.7)
    records = [
        _score("#### 18", "#### 1", "#### 1", "#### 1", protocol=protocol),
        _score("#### 1", "#### 1", "#### 1", "#### 1", protocol=protocol),
    ]
    pass_at = _summary(records, protocol).to_json()["pass_at_k"]
    assert pass_at["pass@1"] == pytest.approx((1 / 4 + 0) / 2)
    assert pass_at["pass@2"] == pytest.approx((1 / 2 + 0) / 2)
    assert pass_at["pass@4"] == pytest.approx(0.5)


def test_format_failures_count_strict_misses_another_rule_gets() -> None:
    summary = _summary([_score("The answer is 18."), _score("#### 18"), _score("#### 3")])
    assert summary.to_json()["format_failures"] == 1


def test_repeats_combine_into_one_record_of_the_most_common_outcome() -> None:
    """--gsm8k-repeats: one item per problem; its record is the most common outcome's (a tie
    goes to the first seen), with the K outcomes and the correct count beside it."""
    wrong, right, none = _score("#### 19"), _score("#### 18"), _score("no idea")
    for record in (wrong, right, none):
        record["usage"] = {"completion_tokens": 10}
    combined = combine_repeats([wrong, right, right, none, wrong])
    assert combined["outcome"] == "wrong"  # 2 wrong, 2 correct: wrong came first
    assert combined["extracted"] == "19"
    assert combined["repeats"] == ["wrong", "correct", "correct", "unparsed", "wrong"]
    assert combined["repeats_correct"] == 2
    assert combined["usage"] == {"completion_tokens": 50}
    majority = combine_repeats([right, wrong, right])
    assert (majority["outcome"], majority["correct"], majority["repeats_correct"]) == (
        "correct",
        True,
        2,
    )
    assert "repeats" not in combine_repeats([right])  # K = 1: the record as it was
    assert "repeats" not in right  # the inputs are not changed
    # there is always a record to combine: an item asks at least once, whatever --gsm8k-repeats
    assert [ask.repeat for ask in Protocol().request(PROBLEM).asks(0)] == [0]
