"""The verdict step (core/verdict.py), rule by rule: each rule of ``decide`` in a run of one
group and in a 2-config matrix, checked by its word, whether it blocks, and its exact detail;
the baseline's write, comparison and refusals; the one report builder against its schema."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.gates import MinAcc, NoiseAware, ToleranceFloor
from pytest_gsm8k.core.html_report import render_html
from pytest_gsm8k.core.outcome import score_response
from pytest_gsm8k.core.plan import GateSpecs, StoredBaseline
from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.records import ProblemRecord
from pytest_gsm8k.core.render import config_rows, markdown, styled_lines
from pytest_gsm8k.core.types import Completion, ModelResponse, Problem
from pytest_gsm8k.core.verdict import (
    BaselineInput,
    EarlyOutcome,
    Group,
    GroupInput,
    RunVerdict,
    Selection,
    decide_run,
)

PROTOCOL = Protocol()
LABEL = PROTOCOL.label
DATASET = {"name": "x", "config": "main", "split": "test", "rows": 8, "fingerprint": "f"}
SUBSET = {"limit": None, "seed": 1234, "of": 8, "ids_hash": "h", "deselected": 0}
NOISE = NoiseAware(0.01)
SPLIT = tuple(
    Problem(index=i, split="test", question=f"q{i}?", answer="#### 18", gold=Decimal(18))
    for i in range(8)
)


def _records(outcomes: str, group: str = "", cached: int = 0) -> list[ProblemRecord]:
    """One record per letter: c correct, w wrong, u unparsed (problems 0, 1, ...)."""
    text = {"c": "#### 18", "w": "#### 5", "u": "no idea"}
    out = []
    for i, letter in enumerate(outcomes):
        problem = Problem(
            index=i, split="test", question="q?", answer="#### 18", gold=Decimal(18), group=group
        )
        response = ModelResponse(completions=[Completion(text=text[letter])])
        record = score_response(problem, response, PROTOCOL, None)
        if i < cached:
            record["cached"] = True
        out.append(record)
    return out


def _config(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "source": f"{name}.yaml",
        "model_name": "m",
        "accuracy_threshold": 0.5,
        "tolerance": 0.0,
        "num_questions": 4,
        "num_fewshot": 0,
    }


def _group(name: str = "", min_acc: float | None = 0.5) -> Group:
    label = f"{name}: {LABEL}" if name else LABEL
    floor = ToleranceFloor(name, 0.5, 0.0) if name else None
    return Group(
        name=name,
        label=label,
        protocol=PROTOCOL.identity(),
        protocol_label=LABEL,
        dataset=DATASET,
        subset=SUBSET,
        model="m",
        endpoint="http://e",
        specs=GateSpecs(MinAcc(min_acc) if min_acc is not None else None, NOISE, False),
        floor=floor,
        extra={"config": _config(name)} if name else {},
    )


def _decide(
    matrix: bool,
    outcomes: str = "cccc",
    *,
    ran: int | None = None,
    min_acc: float = 0.5,
    early: EarlyOutcome | None = None,
    **selection: Any,
) -> RunVerdict:
    """A run (or a matrix of configs A and B, both with ``outcomes``) decided; ``ran``: how
    many of the selection's problems have a record (the first ones)."""
    names = ["A", "B"] if matrix else [""]
    inputs = []
    for name in names:
        records = _records(outcomes, name)
        ids = tuple(r["id"] for r in records)
        inputs.append(
            GroupInput(
                _group(name, min_acc),
                tuple(records[:ran]),
                Selection(ids, **selection),
                early=early,
            )
        )
    top = None
    if matrix:
        top = Group(
            "",
            "2 vLLM configs",
            PROTOCOL.identity(),
            LABEL,
            DATASET,
            SUBSET,
            "m",
            "-",
            GateSpecs(None, NOISE, False),
        )
    return decide_run(inputs, top=top, times=None)


def _min_acc(verdict: RunVerdict, matrix: bool) -> tuple[str, bool, str]:
    name = "A:min-acc" if matrix else "min-acc"
    gate = next(g for g in verdict.gates if g.name == name)
    return gate.word, not gate.passed, gate.detail


RUN_LABEL = "test@1, 0-shot CoT"
STOP = "stopped after 2 of 4 problems: min-acc verdict FAIL is certain"
WHOLE = (
    "a gate holds for the whole selection: run the whole selection (a subset on purpose: "
    "--gsm8k-limit)"
)

#: two tests answered a problem differently (a user's own model beside the built-in test)
CLASH = (
    "1 problem was answered differently by two tests, first test-0002: a.py::t and gsm8k::t; "
    "run one of them (-k, or a marker of your own and -m)"
)


def _early(verdict: str | None) -> EarlyOutcome:
    record = {"mode": "certain", "decided_after": 2, "n_total": 4, "verdicts": {"min-acc": verdict}}
    return EarlyOutcome(record, STOP, stopped=True, not_stopped="two tests ask a problem")


@pytest.mark.parametrize("matrix", [False, True], ids=["run", "matrix"])
@pytest.mark.parametrize(
    ("case", "word", "blocks", "detail"),
    [
        ("pass", "PASS", False, "accuracy 1.0000 ({label}, n=4) >= --gsm8k-min-acc 0.5"),
        ("fail", "FAIL", True, "accuracy 0.0000 ({label}, n=4) is below --gsm8k-min-acc 0.5"),
        ("early", "FAIL", True, STOP),
        ("moot", "UNDECIDED", False, "undecided: the {what} stopped early on another gate's FAIL"),
        (
            "deselected",
            "FAIL",
            True,
            "not a verdict: 1 of the 5 problems of its selection were deselected (-k); "
            f"{WHOLE}; on what ran: accuracy 1.0000 ({{label}}, n=4) >= --gsm8k-min-acc 0.5",
        ),
        (
            "skipped",
            "FAIL",
            True,
            "not a verdict: 1 of the 4 problems of its selection have no result (skipped, or "
            f"not reached); {WHOLE}; on what ran: accuracy 1.0000 ({{label}}, n=3) >= "
            "--gsm8k-min-acc 0.5",
        ),
        (
            "cannot-fail",
            "FAIL",
            True,
            "not a verdict: --gsm8k-min-acc 0 cannot fail (every accuracy reaches it): set it "
            "above 0; on what ran: accuracy 1.0000 ({label}, n=4) >= --gsm8k-min-acc 0",
        ),
        (
            "resumed",
            "PASS",
            False,
            "accuracy 1.0000 ({label}, n=4) >= --gsm8k-min-acc 0.5; 2 of 4 answers from earlier "
            "runs (--gsm8k-resume)",
        ),
        ("shard", "UNDECIDED", False, "shard 1 of 3: verdict at the merge"),
        (
            "clash",
            "FAIL",
            True,
            f"not a verdict: {CLASH}; on what ran: accuracy 0.0000 ({{label}}, n=4) is below "
            "--gsm8k-min-acc 0.5",
        ),
    ],
)
def test_each_rule_of_decide_gives_its_word_and_detail(
    case: str, word: str, blocks: bool, detail: str, matrix: bool
) -> None:
    kwargs: dict[str, Any] = {}
    outcomes = "cccc"
    if case == "fail":
        outcomes = "wwww"
    elif case in ("early", "moot"):
        kwargs["early"] = _early("FAIL" if case == "early" else None)
        kwargs["ran"] = 2
    elif case == "deselected":
        kwargs |= {"deselected": 1, "deselected_by": "-k"}
    elif case == "skipped":
        kwargs["ran"] = 3
    elif case == "cannot-fail":
        kwargs["min_acc"] = 0.0
    elif case == "resumed":
        kwargs["resumed"] = True
    elif case == "shard":
        kwargs["shard"] = (1, 3)
    elif case == "clash":  # a FAIL too: the other test's answers could have passed it
        outcomes, kwargs["clashes"] = "wwww", (("test-0002", "a.py::t", "gsm8k::t"),)
    verdict = _decide(matrix, outcomes, **kwargs)
    if case == "resumed":  # two answers of each group came from the cache
        verdict = _resumed(matrix)
    label = f"A: {RUN_LABEL}" if matrix else RUN_LABEL
    expected = detail.format(label=label, what="config" if matrix else "run")
    assert _min_acc(verdict, matrix) == (word, blocks, expected)
    # the report's gate record carries the word, as decided here (every output reads it)
    records = {g["name"]: g for g in verdict.to_json()["gates"]}
    assert [r["verdict"] for r in records.values()] == [g.word for g in verdict.gates]
    assert records["A:min-acc" if matrix else "min-acc"]["verdict"] == word
    # the run fails exactly when a gate blocks
    assert verdict.failed == any(not g.passed for g in verdict.gates)
    if matrix:  # each config's gates, named after it, gathered at the top in config order
        assert [g.name.partition(":")[0] for g in verdict.gates] == ["A", "A", "B", "B"]
        assert [g.name for g in verdict.groups[0].gates] == ["A:vllm-threshold", "A:min-acc"]


def _resumed(matrix: bool) -> RunVerdict:
    names = ["A", "B"] if matrix else [""]
    inputs = [
        GroupInput(
            _group(name),
            tuple(_records("cccc", name, cached=2)),
            Selection(tuple(r["id"] for r in _records("cccc", name)), resumed=True),
        )
        for name in names
    ]
    top = (
        Group(
            "",
            "2",
            PROTOCOL.identity(),
            LABEL,
            DATASET,
            SUBSET,
            "m",
            "-",
            GateSpecs(None, NOISE, False),
        )
        if matrix
        else None
    )
    return decide_run(inputs, top=top, times=None)


def test_an_early_stop_that_decided_at_the_last_problem_overrides_nothing() -> None:
    record = {"mode": "certain", "decided_after": 4, "n_total": 4, "verdicts": {"min-acc": "FAIL"}}
    early = EarlyOutcome(record, "h", stopped=False, not_stopped="two tests ask a problem")
    verdict = _decide(False, "cccc", early=early)
    assert _min_acc(verdict, False)[0] == "PASS"
    # a config says it was not stopped; a run says the early stop's own line
    config = _decide(True, "cccc", early=early).groups[0]
    assert (
        "  early stop (certain): not stopped early: its verdicts were open until the last "
        "of its 4 problems" in config.notes
    )
    assert "  early stop (certain): h" in verdict.notes


def test_an_early_stop_decided_before_the_last_problem_but_not_stopped_says_why_config_too() -> (
    None
):
    """Rule: the summary says what the run did. Two tests asking one problem keep the early
    stop from ending the run (the full run's answers decide); a config's line said "its
    verdicts were open until the last of its 4 problems" though it decided after 2 (seen
    failing before the fix), and its table row said it stopped "after 2 of 4"; a config says
    what the run says."""
    headline = "decided after 2 of 4 problems: min-acc verdict FAIL is certain"
    record = {"mode": "certain", "decided_after": 2, "n_total": 4, "verdicts": {"min-acc": "FAIL"}}
    early = EarlyOutcome(record, headline, stopped=False, not_stopped="two tests ask a problem")
    said = "  early stop (certain): decided after 2 of 4 problems: min-acc verdict FAIL is "
    said += "certain; not stopped: two tests ask a problem"
    assert said in _decide(False, "cccc", early=early).notes
    matrix = _decide(True, "cccc", early=early)
    assert said in matrix.groups[0].notes
    # the verdict table's "stopped" column: not stopped (it said "after 2 of 4")
    configs = matrix.to_json()["configs"]
    assert [row[-2] for row in config_rows(configs)] == ["stopped", "-", "-"]


# -- the baseline ---------------------------------------------------------------------------


def _baseline_run(
    outcomes: str, stored: StoredBaseline, *, update: bool = False, error: str | None = None
) -> RunVerdict:
    records = _records(outcomes)
    ids = tuple(r["id"] for r in records)
    base = BaselineInput(stored, SPLIT[: len(ids)], update=update, write_error=error)
    group = _group(min_acc=None)
    return decide_run(
        [GroupInput(group, tuple(records), Selection(ids), base)], top=None, times=None
    )


def _stored(document: dict[str, Any] | None = None) -> StoredBaseline:
    return StoredBaseline(Path("b.gsm8k"), "b.gsm8k", document)


def test_a_baseline_write_is_a_document_and_a_note_and_its_failure_the_one_derived_copy() -> None:
    written = _baseline_run("cccw", _stored(), update=True)
    document = written.baseline_write
    assert document is not None
    assert document["problems"] == {
        "test-0000": "correct",
        "test-0001": "correct",
        "test-0002": "correct",
        "test-0003": "wrong",
    }
    assert "  baseline written: b.gsm8k (n=4, accuracy 0.7500)" in written.notes
    assert written.to_json()["baseline"] == {"path": "b.gsm8k", "written": True, "partial": False}
    assert written.gates == ()
    failed = _baseline_run("cccw", _stored(), update=True, error="disk full")
    assert [(g.name, g.word, g.detail) for g in failed.gates] == [
        ("baseline", "FAIL", "b.gsm8k: cannot write it (disk full)")
    ]
    assert failed.baseline_write is None
    assert "baseline" not in failed.to_json()
    assert failed.failed
    # nor from answers that two tests gave differently (which one counted was timing)
    clashes = (("test-0002", "a.py::t", "gsm8k::t"),)
    records = tuple(_records("cccw"))
    ids = tuple(r["id"] for r in records)
    base = BaselineInput(_stored(), SPLIT[:4], update=True)
    refused = decide_run(
        [GroupInput(_group(min_acc=None), records, Selection(ids, clashes=clashes), base)],
        top=None,
        times=None,
    )
    assert [g.detail for g in refused.gates] == [f"not written to b.gsm8k: {CLASH}"]
    assert refused.baseline_write is None


def test_a_baseline_written_beside_a_failing_gate_holds_the_same_document() -> None:
    """Rule: the baseline file holds the run's facts and answers, never its gates' words (the
    write reads the verdict's JSON with its gates since issue 33: the same file as without)."""
    records = _records("cccw")
    ids = tuple(r["id"] for r in records)
    base = BaselineInput(_stored(), SPLIT[: len(ids)], update=True)
    documents = [
        decide_run(
            [GroupInput(_group(min_acc=m), tuple(records), Selection(ids), base)],
            top=None,
            times=None,
        )
        for m in (None, 0.9)
    ]
    assert [len(v.gates) for v in documents] == [0, 1]  # min-acc FAIL beside the write
    plain, gated = (v.baseline_write for v in documents)
    assert gated == plain
    assert gated is not None
    assert not {"gates", "headline", "early_stop"} & set(gated)


def test_a_baseline_comparison_fails_on_flips_and_a_missing_one_is_a_note() -> None:
    document = _baseline_run("cccccccc", _stored(), update=True).baseline_write
    assert document is not None
    flipped = _baseline_run("wwwwwwwc", _stored(dict(document)))
    gate = flipped.gates[-1]
    assert (gate.name, gate.rule, gate.word) == ("baseline", "noise-aware", "FAIL")
    assert gate.detail.startswith("p=0.00781 < --gsm8k-alpha 0.01 (exact McNemar): 7 newly failing")
    lines = [line for line, _ in styled_lines(flipped)]
    assert "  baseline b.gsm8k:" in lines
    assert any(
        line.startswith("    accuracy: 1.0000 -> 0.1250 on 8 problems; diff ") for line in lines
    )
    block: Any = flipped.to_json()["baseline"]
    assert block["newly_failing"][0] == "test-0000"
    missing = _baseline_run("cccc", _stored())
    assert missing.gates == ()
    assert missing.notes == (
        "  baseline: no baseline at b.gsm8k; record one with: pytest <same options> "
        "--snapshot-update",
    )


def test_the_noise_evidence_is_computed_once_per_decision_and_never_memoised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 32: the gate, the noise line and the report's block read one evidence that the
    decision computes itself; a cache keyed on the pairs is a channel by which another
    run's numbers could reach this verdict, so two decisions on equal pairs compute twice."""
    from pytest_gsm8k.core import calibrated

    document = _baseline_run("cccccccc", _stored(), update=True).baseline_write
    assert document is not None
    asked: list[tuple[Any, ...]] = []
    real = calibrated.rate_p_values

    def counted(pairs: Any) -> tuple[float, float]:
        asked.append(tuple(pairs))
        return real(pairs)

    monkeypatch.setattr(calibrated, "rate_p_values", counted)
    first = _baseline_run("cccwcccc", _stored(dict(document)))
    seen = [pairs for pairs in asked if any(p.now_correct for p in pairs)]
    assert len(seen) == 1  # the gate, the rise warning and the block: one computation
    second = _baseline_run("cccwcccc", _stored(dict(document)))
    assert len([pairs for pairs in asked if any(p.now_correct for p in pairs)]) == 2
    assert first.to_json()["baseline"] == second.to_json()["baseline"]


def test_a_refused_or_unwritable_baseline_is_a_fail() -> None:
    errored = _baseline_run("cccc", StoredBaseline(Path("b"), "b", None, "b: not JSON"))
    assert [(g.word, g.detail) for g in errored.gates] == [("FAIL", "b: not JSON")]
    # a write from a run with an error in it is refused
    records = _records("cc")
    records[1] = {**records[1], "outcome": "error", "correct": False}
    ids = tuple(r["id"] for r in records)
    base = BaselineInput(_stored(), SPLIT[:2], update=True)
    refused = decide_run(
        [GroupInput(_group(min_acc=None), tuple(records), Selection(ids), base)],
        top=None,
        times=None,
    )
    assert [g.detail for g in refused.gates] == [
        "not written to b.gsm8k: 1 problems ended in an error"
    ]
    assert refused.baseline_write is None
    assert bl.fewer_repeats({"calibration": {"repeats": 5}}, 1) is not None


def test_a_report_as_baseline_skips_the_file_checks_and_not_whole_leaves_a_pass_undecided() -> None:
    """compare's two facts (core/compare.py): report A is a baseline its reader checked (no
    split to fit: its ids need not be a split's), and what the records cannot show (errors
    left out, a report not whole) makes a PASS UNDECIDED in compare's words; a FAIL stays."""
    why = "2 of the 8 problems both reports hold ended in an error: rerun"
    document = _baseline_run("cccccccc", _stored(), update=True).baseline_write
    assert document is not None
    for outcomes, held in (("cccccccc", True), ("wwwwwwwc", False)):
        records = _records(outcomes)
        ids = tuple(r["id"] for r in records)
        stored = _stored(dict(document))
        group = _group(min_acc=None)
        base = BaselineInput(stored, (), from_report=True)
        verdict = decide_run(
            [GroupInput(group, tuple(records), Selection(ids, not_whole=why), base)],
            top=None,
            times=None,
        )
        (gate,) = verdict.gates
        # not a verdict blocks (FAIL, exit 1), as any undecided gate that would have passed
        assert (gate.rule, gate.passed, gate.undecided) == ("noise-aware", False, held)
        assert gate.detail.startswith(f"not a verdict: {why}; on what ran: p=1 ") == held
    # a file's baseline is checked against its split
    checked = decide_run(
        [GroupInput(group, tuple(records), Selection(ids), replace(base, from_report=False))],
        top=None,
        times=None,
    )
    assert "8 problem ids are not in the test split" in checked.gates[0].detail


# -- the outputs ----------------------------------------------------------------------------


@pytest.mark.parametrize("matrix", [False, True], ids=["run", "matrix"])
def test_every_output_renders_from_the_verdict_and_the_report_matches_its_schema(
    matrix: bool,
) -> None:
    verdict = _decide(matrix, "ccwu", early=_early(None), ran=2)
    text = resources.files("pytest_gsm8k").joinpath("schema/report.schema.json").read_text()
    report = json.loads(json.dumps(verdict.to_json()))
    jsonschema.Draft202012Validator(json.loads(text)).validate(report)
    lines = [line for line, _ in styled_lines(verdict)]
    name = "A:min-acc" if matrix else "min-acc"
    assert f"  gate {name}: UNDECIDED: undecided: the " in "\n".join(lines)
    assert f"| {name} | UNDECIDED |" in markdown(verdict, {})
    # a gate that was not decided never passes: not on the page either
    page = render_html(report, {}, {})
    assert re.search(r'class="badge undecided">UNDECIDED</span></td><th>' + name, page)
    assert 'class="verdict undecided">UNDECIDED<' in page
    assert 'class="badge pass">PASS</span></td><th>' + name not in page
    # nor in the JUnit XML a merge writes without pytest: a skipped case, as a run's
    from xml.etree import ElementTree as ET

    from pytest_gsm8k.runtime.finish import junit_xml

    case = ET.fromstring(junit_xml(verdict)).find(f".//testcase[@name='{name}']")
    assert case is not None
    detail = next(gate.detail for gate in verdict.gates if gate.name == name)
    assert [(mark.tag, mark.get("message")) for mark in case] == [("skipped", detail)]
    if matrix:  # nor in the verdict table, the page's configs table or the headline
        assert lines[-4].startswith("gsm8k vLLM configs: 0 of 2 pass, 2 undecided")
        assert lines[-2].split()[-1] == lines[-1].split()[-1] == "UNDECIDED"
        card = page[page.index("vLLM configs (accuracy") :]
        assert card.count('class="badge undecided">UNDECIDED') == 2
        assert 'class="badge pass"' not in card
        assert report["configs"][1]["gates"][1]["name"] == "B:min-acc"
