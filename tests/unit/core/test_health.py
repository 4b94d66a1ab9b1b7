"""Answer-format health: what the gates count (problem outcomes, also with samples), and the
one-line hint that a chat model is being asked through the completions API (core/health.py)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pytest_gsm8k.core.gates import MaxShare, NoiseAware
from pytest_gsm8k.core.health import HINT_MIN_COUNT, TEMPLATE_TOKENS, chat_api_hint, chat_sign
from pytest_gsm8k.core.outcome import error_record, score_response
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

PROBLEM = Problem(index=3, split="test", question="q?", answer="... #### 18", gold=Decimal(18))
PLAIN = "I am not sure how to solve this problem."


def _record(
    *samples: tuple[str, str], protocol: Protocol | None = None, index: int = 3
) -> ProblemRecord:
    """A scored record; each sample is (text, finish_reason)."""
    problem = Problem(index=index, split="test", question="q?", answer="#### 18", gold=Decimal(18))
    response = ModelResponse(completions=[Completion(text=t, finish_reason=f) for t, f in samples])
    return score_response(problem, response, protocol or Protocol(), None)


def _summary(
    records: list[ProblemRecord],
    api: str = "chat",
    model: str = "m",
    health: tuple[MaxShare, ...] = (),
) -> GroupVerdict:
    """The records decided (core/verdict.py) with the health gates ``health``."""
    protocol = Protocol(api=api)  # type: ignore[arg-type]
    group = Group(
        name="",
        label=protocol.label,
        protocol=protocol.identity(),
        protocol_label=protocol.label,
        dataset={"name": "x", "config": "main", "split": "test", "rows": 9, "fingerprint": "f"},
        subset={"limit": None, "seed": 1234, "of": len(records)},
        model=model,
        endpoint="http://e",
        specs=GateSpecs(None, NoiseAware(0.01), False, health),
    )
    selection = Selection(tuple(r["id"] for r in records))
    return decide_run([GroupInput(group, tuple(records), selection)], top=None, times=None)


def _lines(summary: GroupVerdict) -> list[str]:
    return [line for line, _ in styled_lines(summary)]


# -- what the gates count ------------------------------------------------------------------------


def test_the_denominator_is_every_problem_with_a_result_errors_included() -> None:
    records = [
        _record(("#### 18", "stop")),
        _record(("Let me think: 3 +", "length")),  # truncated
        _record((PLAIN, "stop")),  # unparsed
        _record(("#### 5", "stop")),  # wrong: no format failure
        error_record(PROBLEM, "HTTP 500"),
    ]
    specs = (MaxShare("truncated", 0.2), MaxShare("unparsed", 0.19), MaxShare("error", 0.2))
    summary = _summary(records, health=specs)
    truncated, unparsed, errors = summary.gates
    assert (truncated.passed, truncated.value) == (True, 1 / 5)  # 1 of 5 <= 0.2
    assert not unparsed.passed
    assert unparsed.detail == (
        "20.0% of 5 problems unparsed (1; 0 allowed) > --gsm8k-max-unparsed 0.19"
    )
    assert errors.passed
    assert [g.name for g in summary.gates] == ["max-truncated", "max-unparsed", "max-error"]
    assert summary.failed
    lines = _lines(summary)
    assert "  gate max-unparsed: FAIL: 20.0% of 5 problems unparsed (1; 0 allowed) > " in (
        "\n".join(lines)
    )


@pytest.mark.parametrize(
    ("samples", "outcome"),
    [
        # no sample gave a number: the problem is unparsed, or truncated when one was cut
        ([(PLAIN, "stop"), (PLAIN, "stop")], "unparsed"),
        ([(PLAIN, "stop"), ("Let me think: 3 +", "length")], "truncated"),
        # a number in any sample: not a format failure, whatever the others did
        ([(PLAIN, "stop"), ("#### 17", "stop")], "wrong"),
        ([("Let me think: 3 +", "length"), ("#### 17", "stop")], "wrong"),
        ([("Let me think: 3 +", "length"), ("#### 18", "stop")], "correct"),
    ],
)
@pytest.mark.parametrize("name", ["pass@2", "maj@2"])
def test_with_samples_a_problem_counts_only_when_no_sample_gave_a_number(
    samples: list[tuple[str, str]], outcome: str, name: str
) -> None:
    """The gates read the problem's outcome, one per problem (the report's ``counts``):
    with pass@N and maj@N a cut or unparsed sample among parsed ones does not count."""
    protocol = Protocol(name=name, samples=2, temperature=0.7)
    record = _record(*samples, protocol=protocol)
    assert record["outcome"] == outcome
    for kind in ("unparsed", "truncated"):
        (verdict,) = _summary([record], health=(MaxShare(kind, 0.0),)).gates
        assert verdict.passed is (outcome != kind)


# -- the chat-API hint ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "sign"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", "its id 'Qwen/Qwen2.5-7B-Instruct' has 'instruct'"),
        ("meta-llama/Llama-2-7b-chat-hf", "its id 'meta-llama/Llama-2-7b-chat-hf' has 'chat'"),
        ("google/gemma-2-9b-it", "its id 'google/gemma-2-9b-it' has '-it'"),
        ("gemma-3-27b-it-qat", "its id 'gemma-3-27b-it-qat' has '-it'"),
        ("mistral-7b-v0.1", None),
        ("meta-llama/Meta-Llama-3-8B", None),
        ("gemma-3-270m-q4_k_m", None),  # the packaged local model
        ("italian-gpt", None),  # "it" inside a word is not the -it suffix
        ("qwen-lit", None),
    ],
)
def test_the_model_id_rule(model: str, sign: str | None) -> None:
    assert chat_sign([model], []) == sign


@pytest.mark.parametrize("token", TEMPLATE_TOKENS)
def test_a_reply_with_a_chat_template_token_is_a_sign(token: str) -> None:
    assert chat_sign(["base-model"], ["12 apples", f"{token}assistant\n{PLAIN}"]) == (
        f"a reply holds the chat-template token {token!r}"
    )


def test_the_hint_is_one_line_naming_the_share_the_sign_and_the_option() -> None:
    hint = chat_api_hint("completions", ["Qwen2.5-7B-Instruct"], 8, 20, [])
    assert hint == (
        "hint: 40.0% of 20 problems unparsed (8) through --gsm8k-api completions, and the "
        "model looks like a chat model (its id 'Qwen2.5-7B-Instruct' has 'instruct'): try "
        "--gsm8k-api chat, which applies its chat template"
    )


@pytest.mark.parametrize(
    ("api", "unparsed", "n", "given"),
    [
        ("completions", 5, 50, True),  # exactly 10% and exactly 5: given
        ("completions", 5, 51, False),  # 9.8%: below the share
        ("completions", 4, 10, False),  # 40% but only 4 problems
        ("completions", 0, 0, False),
        ("chat", 50, 50, False),  # already the chat API
    ],
)
def test_the_hint_thresholds(api: str, unparsed: int, n: int, given: bool) -> None:
    assert HINT_MIN_COUNT == 5
    hint = chat_api_hint(api, ["x-instruct"], unparsed, n, [])
    assert (hint is not None) is given


def test_no_hint_for_a_model_that_does_not_look_like_a_chat_model() -> None:
    assert chat_api_hint("completions", ["llama-3-8b"], 50, 50, [PLAIN] * 50) is None


def test_the_summary_prints_the_hint_once_from_its_own_records() -> None:
    """With or without a gate: the hint is a line of the terminal block of its own."""
    records = [_record((PLAIN, "stop"), index=i) for i in range(6)]
    records += [_record(("#### 18", "stop"), index=6 + i) for i in range(4)]
    hinted = _summary(records, api="completions", model="org/model-Instruct")
    lines = [line for line in _lines(hinted) if "hint:" in line]
    assert lines == [
        "  hint: 60.0% of 10 problems unparsed (6) through --gsm8k-api completions, and the "
        "model looks like a chat model (its id 'org/model-Instruct' has 'instruct'): try "
        "--gsm8k-api chat, which applies its chat template"
    ]
    assert hinted.gates == ()
    template = [_record((f"<|im_start|>assistant\n{PLAIN}", "stop"), index=i) for i in range(6)]
    by_token = _summary(template, api="completions", model="base")
    assert any("chat-template token '<|im_start|>'" in line for line in _lines(by_token))
    assert not any("hint:" in line for line in _lines(_summary(records, api="chat")))
    assert not any("hint:" in line for line in _lines(_summary(records, api="completions")))
