"""From a model response to one problem's outcome record (docs/report.md). Pure."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import cast

from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.records import Outcome, ProblemRecord, SampleRecord
from pytest_gsm8k.core.scoring import (
    RULES,
    SampleScore,
    ascii_lower,
    format_number,
    last_int,
    majority_vote,
    numbers_equal,
    score_text,
)
from pytest_gsm8k.core.types import Completion, ModelResponse, Problem


def _outcome(correct: bool, cut: Sequence[bool], answer: object, samples: int) -> Outcome:
    """Not correct and cut by the token limit (for pass@N/maj@N: only with no answer at
    all) is ``truncated``; no number the gating rule finds, ``unparsed``."""
    if correct:
        return "correct"
    if any(cut) and (samples == 1 or answer is None):
        return "truncated"
    return "unparsed" if answer is None else "wrong"


def _decide(
    protocol: Protocol, scores: list[SampleScore], rule: str, gold: Decimal | None
) -> tuple[Decimal | None, bool, list[tuple[str, int]]]:
    """The problem's answer under the protocol's aggregation, for one rule."""
    values = [s.extracted[rule] for s in scores]
    if protocol.name.startswith("maj@"):
        winner, votes = majority_vote(values)
        return winner, numbers_equal(winner, gold), votes
    if protocol.name.startswith("pass@"):
        hit = next((s.extracted[rule] for s in scores if s.correct[rule]), None)
        first = next((v for v in values if v is not None), None)
        return (hit, True, []) if hit is not None else (first, False, [])
    if not scores:
        return None, False, []
    return values[0], scores[0].correct[rule], []


#: a ``<think>`` block (one never closed runs to the end), or the text before a first
#: ``</think>`` whose opening tag the server stripped; ASCII case only, in linear time
_THINK = re.compile(
    r"\A((?:(?!<think>).)*?)</think>|<think>(.*?)(?:</think>|\Z)", re.I | re.A | re.S
)


def reasoning_text(completion: Completion) -> str | None:
    """The sample's reasoning, kept for the report and never scored: the server's
    ``reasoning_content``, else what ``<think>`` blocks in the content hold."""
    if completion.reasoning or "think>" not in ascii_lower(completion.text):  # no regex scan
        return completion.reasoning or None
    parts = (m[1] if m[1] is not None else m[2] for m in _THINK.finditer(completion.text))
    return "\n".join(part.strip() for part in parts).strip() or None


def cut_while_reasoning(completion: Completion) -> bool:
    """Whether the sample stopped inside its reasoning: a ``<think>`` never closed, or
    reasoning but no visible content with no clean stop (the server hit the token limit)."""
    lowered = ascii_lower(completion.text)
    last_open = lowered.rfind("<think>")
    if last_open != -1 and lowered.find("</think>", last_open) == -1:
        return True
    return bool(
        completion.reasoning
        and not completion.text.strip()
        and completion.finish_reason not in ("stop", "eos", "end_turn")
    )


def score_response(
    problem: Problem, response: ModelResponse, protocol: Protocol, pattern: re.Pattern[str] | None
) -> ProblemRecord:
    """Score every sample with every rule, then decide the problem's outcome."""
    label = last_int(problem.answer)
    golds = {rule: label if rule == "last-int" else problem.gold for rule in RULES}
    scores = [score_text(c.text, problem.gold, pattern, label) for c in response.completions]
    gated = protocol.extractor
    decided = gated if gated in RULES else "strict"
    decision, correct, votes = _decide(protocol, scores, decided, golds[decided])
    truncated = [
        c.finish_reason == "length" or cut_while_reasoning(c) for c in response.completions
    ]
    outcome = _outcome(correct, truncated, decision, protocol.samples)
    rules = {rule: _decide(protocol, scores, rule, golds[rule])[1] for rule in RULES}
    shown = format_number(decision)
    text = response.completions[0].text if response.completions else ""  # the first sample's
    if protocol.preset == "lm-eval":
        # lm-eval's own filters and string match, labelled by its names; strict-match gates
        from pytest_gsm8k.core.presets import lm_eval_score, lm_eval_strict

        rules.update(lm_eval_score(text, problem.answer))
        correct = rules["strict-match"]
        shown = lm_eval_strict(text)
        outcome = _outcome(correct, truncated, shown, 1)
    samples: list[SampleRecord] = [
        {
            "text": c.text,
            "finish_reason": c.finish_reason,
            "extracted": {rule: format_number(s.extracted[rule]) for rule in RULES},
            "correct": s.correct.get(gated, correct),
            "reasoning": reasoning_text(c),
            "truncated": cut,
        }
        for c, s, cut in zip(response.completions, scores, truncated, strict=True)
    ]
    record: ProblemRecord = {
        "index": problem.index,
        "id": problem.id,
        "gold": format_number(problem.gold),
        "outcome": outcome,
        "correct": correct,
        "extracted": shown,
        "rules": rules,
        "n_samples": len(scores),
        "n_correct": (
            sum(1 for s in scores if s.correct[gated]) if gated in RULES else int(correct)
        ),
        "response": text,
        "samples": samples,
        "usage": dict(response.usage),
        "cached": response.cached,
        "model": response.model,
        "error": None,
    }
    if protocol.name.startswith("maj@"):
        record["votes"] = [list(v) for v in votes]
    if any(not c.text.strip() and c.reasoning for c in response.completions):
        record["note"] = "empty content; the answer was only in reasoning_content"
    return record


def error_record(problem: Problem, message: str) -> ProblemRecord:
    record = score_response(problem, ModelResponse(completions=[]), Protocol(), None)
    return {**record, "outcome": "error", "error": message}


def combine_repeats(records: Sequence[ProblemRecord]) -> ProblemRecord:
    """The repeat of the most common outcome (a tie: the first), so every reader sees one
    answer as given, with the K outcomes, the correct count, summed tokens and cache hits."""
    if len(records) == 1:
        return records[0]
    outcomes = [r["outcome"] for r in records]
    top = Counter(outcomes).most_common(1)[0][0]  # of the most common, the first given
    combined = cast(ProblemRecord, dict(records[outcomes.index(top)]))
    usage: Counter[str] = Counter()
    for record in records:
        usage.update(record.get("usage") or {})
    combined["usage"] = dict(usage)
    combined["cached"] = sum(int(r.get("cached") or 0) for r in records)
    combined["repeats"] = outcomes
    combined["repeats_correct"] = sum(1 for r in records if r["correct"])
    return combined
