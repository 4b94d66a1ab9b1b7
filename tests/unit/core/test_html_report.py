"""The HTML report page: a pure renderer of the JSON report, checked as text, and a full
split's page opened in a real headless Chromium (driven over the DevTools protocol by
``tests/browser.py``; skipped only when ``chromium`` is not installed). Pages of real runs are
in tests/plugin/test_html_report_runs.py.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

from browser import NEEDS_CHROMIUM, Browser

from pytest_gsm8k.core.html_report import (
    outcomes_from_baseline,
    problem_texts,
    render_html,
)
from pytest_gsm8k.runtime.data import load_split

HOSTILE = [
    "<script>alert(1)</script>",
    "</textarea>",
    "</script>",
    "<!--",
    "<img src=x onerror=alert(2)>",
]


@cache
def _split() -> Any:
    return load_split(None, "test", "main")


def _record(index: int, outcome: str, response: str = "", gold: str = "18") -> dict[str, Any]:
    """A problem record shaped like outcome.score_response's."""
    correct = outcome == "correct"
    extracted = gold if correct else ("19" if outcome == "wrong" else None)
    return {
        "index": index,
        "id": f"test-{index:04d}",
        "gold": gold,
        "outcome": outcome,
        "correct": correct,
        "extracted": extracted,
        "rules": {"strict": correct, "answer-is": correct, "boxed": False, "flexible": correct},
        "n_samples": 1,
        "n_correct": int(correct),
        "response": response or f"Step one.\nThe answer is {extracted}.\n#### {extracted}",
        "samples": [
            {
                "text": response or f"Step one.\nThe answer is {extracted}.\n#### {extracted}",
                "finish_reason": "stop",
                "extracted": {
                    "strict": extracted,
                    "answer-is": extracted,
                    "boxed": None,
                    "flexible": extracted,
                },
                "correct": correct,
            }
        ],
        "usage": {"prompt_tokens": 50, "completion_tokens": 20},
        "cached": 0,
        "model": "m",
        "error": None if outcome != "error" else "HTTP 500 after retries",
    }


def _report(records: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    """A JSON report around ``records`` (numbers consistent with them)."""
    n = len(records)
    correct = sum(r["correct"] for r in records)
    counts = {
        o: sum(r["outcome"] == o for r in records)
        for o in ("correct", "wrong", "unparsed", "truncated", "error")
    }
    return {
        "schema": 1,
        "headline": f"gsm8k acc (test@1, 8-shot CoT) = {correct / n:.4f}  [95% CI 0.5000-0.9000]"
        f"  n={n}",
        "accuracy": correct / n,
        "correct": correct,
        "n": n,
        "expected": n,
        "complete": True,
        "ci95": [0.5, 0.9],
        "counts": counts,
        "rules": {
            "strict": correct / n,
            "answer-is": correct / n,
            "boxed": 0.0,
            "flexible": correct / n,
        },
        "format_failures": 0,
        "pass_at_k": {},
        "protocol": {
            "name": "test@1",
            "samples": 1,
            "temperature": 0.0,
            "extractor": "strict",
            "max_tokens": 1024,
            "api": "chat",
            "label": "test@1, 8-shot CoT",
        },
        "model": "m",
        "reported_models": ["m"],
        "endpoint": "http://127.0.0.1:9/v1",
        "dataset": {
            "name": "openai/gsm8k",
            "config": "main",
            "split": "test",
            "rows": 1319,
            "fingerprint": "7573bc2082847ca0",
        },
        "subset": {},
        "tokens": {"prompt_tokens": 1234, "completion_tokens": 5678},
        "from_cache": 0,
        "gates": [
            {
                "name": "min-acc",
                "passed": False,
                "verdict": "FAIL",
                "detail": "accuracy 0.6000 (test@1, 8-shot CoT, n=5) is below --gsm8k-min-acc 0.85",
            }
        ],
        "problems": records,
        **extra,
    }


def _embedded(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="gsm8k-data">(.*?)</script>', page, re.S)
    assert found
    return dict(json.loads(found.group(1)))


# -- the renderer, as text -------------------------------------------------------------------


def test_hostile_text_is_never_markup() -> None:
    records = [
        _record(i, "wrong", response=f"Thinking {h} more\n#### {h}") for i, h in enumerate(HOSTILE)
    ]
    report = _report(records, model="<script>alert(1)</script>")
    report["gates"][0]["detail"] = "</script><script>alert(1)</script>"
    texts = {r["id"]: ("<script>alert(1)</script> apples?", "</textarea><!-- 5") for r in records}
    page = render_html(report, texts, {})
    for hostile in HOSTILE:
        if hostile != "</script>":
            assert hostile not in page, hostile
    # "</script>" only where the page's own two elements end: the data block and the code
    assert page.count("<script") == 2
    assert page.count("</script>") == 2
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the model name, shown as text
    data = _embedded(page)  # and the data survives the escaping unchanged
    assert [p["r"] for p in data["problems"]] == [r["response"] for r in records]
    assert data["problems"][0]["q"] == "<script>alert(1)</script> apples?"
    assert data["problems"][0]["s"] == "</textarea><!-- 5"


def test_names_in_the_header_are_one_line_without_escapes() -> None:
    """Issue 31, case 18: the model's name, the ids a server reported, the endpoint, the
    label and a gate's name are shown as the terminal shows them (core.scrub.printable):
    no ESC, CR, NUL, newline or right-to-left override reaches the page's markup."""
    evil = "x\n\x1b[2J\r\u202e\x00<b>"
    report = _report(
        [_record(0, "correct")],
        model=f"model{evil}",
        reported_models=[f"reported{evil}"],
        endpoint=f"http://127.0.0.1:9/v1/{evil}",
    )
    report["protocol"]["label"] = f"label{evil}"
    report["gates"][0]["name"] = f"gate{evil}"
    header = render_html(report, {}, {}).split("<main>")[0]
    for raw in ("\x1b", "\r", "\x00", "\u202e", "<b>"):
        assert raw not in header, repr(raw)
    assert "(server reported: reportedx \\u202e&lt;b&gt;)" in header


def test_no_external_resource_and_no_secret() -> None:
    report = _report(
        [_record(0, "correct")],
        endpoint="https://user:sk-live-XYZ@api.example.com/v1?api-key=sk-q-ABC",
    )
    page = render_html(report, {}, {})
    assert not re.search(r"""\b(src|href)\s*=|@import|url\(""", page)
    assert "sk-live-XYZ" not in page
    assert "sk-q-ABC" not in page
    assert "https://api.example.com/v1" in page
    assert "default-src 'none'" in page  # CSP: no fetch, no image, no frame from anywhere


def test_header_holds_headline_gates_run_and_pictures() -> None:
    records = [
        _record(0, "correct"),
        _record(1, "wrong"),
        _record(2, "unparsed"),
        _record(3, "correct"),
        _record(4, "truncated"),
    ]
    page = render_html(_report(records, started_at="2024-05-01T10:00:00Z", duration_s=61.2), {}, {})
    assert "gsm8k acc (test@1, 8-shot CoT) = 0.4000  [95% CI 0.5000-0.9000]  n=5" in page
    assert re.search(r'class="verdict fail">FAIL<', page)
    assert re.search(r'class="badge fail">FAIL</span></td><th>min-acc</th>', page)
    assert "7573bc2082847ca0" in page
    assert "http://127.0.0.1:9/v1" in page
    assert "prompt 1,234, completion 5,678" in page
    assert "61.2 s" in page
    assert "min-acc 0.85" in page  # the threshold on the accuracy axis, parsed from the gate
    assert page.count("<svg") == 2  # accuracy axis, outcome bar; no pass@k without pass@N
    assert "2 correct" in page
    assert "1 truncated" in page
    assert "INCOMPLETE" not in page
    assert "EARLY STOP" not in page


def test_pass_at_k_curve_when_sampled() -> None:
    report = _report(
        [_record(0, "correct")], pass_at_k={"pass@1": 0.61, "pass@2": 0.7, "pass@4": 0.78}
    )
    page = render_html(report, {}, {})
    assert page.count("<svg") == 3
    assert "pass@4 = 0.7800" in page
    assert page.count("<polyline") == 1


def test_interrupted_and_early_stopped_runs_say_so() -> None:
    report = _report([_record(0, "correct"), _record(1, "wrong")], complete=False, expected=1319)
    report["early_stop"] = {
        "mode": "sprt",
        "alpha": 0.05,
        "decided_after": 2,
        "verdicts": {"min-acc": "fail"},
        "bounds": [0.1, 0.9],
    }
    page = render_html(report, {}, {})
    assert "INCOMPLETE: 2 of 1319 problems have a result" in page
    assert "EARLY STOP: mode sprt; alpha 0.05; decided after 2" in page
    assert "<dt>verdicts</dt><dd>min-acc: fail</dd>" in page
    assert "<dt>bounds</dt><dd>[0.1, 0.9]</dd>" in page


#: what a baseline block holds beyond the flips (core/baseline.py noise_block)
_NOISE: dict[str, Any] = {
    "baseline_accuracy": 0.5,
    "current_accuracy": 0.5,
    "difference": 0.0,
    "difference_ci95": [-0.3, 0.3],
    "baseline_ci95": [0.2, 0.8],
    "current_ci95": [0.2, 0.8],
    "p_value": 0.6875,
    "alpha": 0.01,
    "repeats": {"baseline": 1, "run": 1},
    "detectable_drop": {"problems": 2, "points": 50.0, "power": 0.8, "repeats_for_one_point": None},
    "stability": {"stable_correct": 2, "stable_wrong": 0, "noisy": 2},
    "flip_rate": 0.5,
}


def test_baseline_orders_newly_failing_then_newly_passing_then_the_rest() -> None:
    outcomes = ["correct", "wrong", "correct", "unparsed", "wrong", "correct"]
    records = [_record(i, o) for i, o in enumerate(outcomes)]
    baseline = {
        "path": "b.gsm8k",
        "shared": 6,
        "baseline_accuracy": 0.5,
        "current_accuracy": 0.5,
        "difference": 0.0,
        "difference_ci95": [-0.3, 0.3],
        "newly_failing": ["test-0003", "test-0004"],
        "newly_passing": ["test-0000", "test-0005"],
        "mcnemar_p": 0.6875,
        "subset": False,
        "baseline_n": 6,
        **_NOISE,
    }
    page = render_html(_report(records, baseline=baseline), {}, {})
    data = _embedded(page)
    assert [p["id"] for p in data["problems"]] == [
        "test-0003",
        "test-0004",
        "test-0000",
        "test-0005",
        "test-0001",
        "test-0002",
    ]
    assert [p["ch"] for p in data["problems"]] == ["failing"] * 2 + ["passing"] * 2 + [""] * 2
    assert [p["b"] for p in data["problems"]] == [None] * 6  # no baseline file given
    assert "McNemar p=0.6875" in page
    assert "diff -0.00 points" not in page
    assert "diff +0.00 points [95% CI -30.00, +30.00]" in page
    # the baseline column: the baseline file's own outcomes (runtime/finish.py passes them)
    page = render_html(_report(records, baseline=baseline), {}, {"test-0000": "unparsed"})
    assert _embedded(page)["problems"][2]["b"] == "unparsed"


def test_stable_flips_come_first_then_noisy_failures_and_the_card_says_what_the_gate_sees() -> None:
    records = [_record(i, o) for i, o in enumerate(["wrong", "wrong", "wrong", "correct"])]
    baseline: dict[str, Any] = {
        "path": "b.gsm8k",
        "shared": 4,
        "newly_failing": ["test-0000", "test-0001", "test-0002"],
        "newly_passing": [],
        **_NOISE,
        "mcnemar_p": 0.25,
        "p_value": 0.02,
        "repeats": {"baseline": 5, "run": 1},
        "detectable_drop": {
            "problems": 2,
            "points": 50.0,
            "power": 0.8,
            "repeats_for_one_point": None,
        },
        "stable_flips": ["test-0002"],
        "noisy_failing": ["test-0000", "test-0001"],
        "stability": {"stable_correct": 2, "stable_wrong": 0, "noisy": 2},
        "flip_rate": 0.5,
    }
    page = render_html(_report(records, baseline=baseline), {}, {})
    ids = [p["id"] for p in _embedded(page)["problems"]]
    assert ids == ["test-0002", "test-0000", "test-0001", "test-0003"]
    assert "p=0.02 (one-sided: the gate&#x27;s test), McNemar p=0.25" in page
    assert "the gate detects a drop of 50.0 points or more" in page
    assert "5 runs per problem: 2 stable-correct, 0 stable-wrong, 2 noisy" in page
    assert "3 newly failing: 1 stable (right in all 5 baseline runs), 2 noisy" in page
    # the page says what the terminal says, from the same sentence (core/baseline.py): a drop
    # that needs more problems than ran is never claimed detectable (issue 32 #4)
    too_few = {**baseline["detectable_drop"], "problems": 7, "points": 175.0}
    page = render_html(_report(records, baseline={**baseline, "detectable_drop": too_few}), {}, {})
    assert "detects a drop of" not in page
    assert "the gate detects no drop at this size (4 problems; alpha=0.01)" in page


def test_problem_texts_and_baseline_outcomes() -> None:
    problem = _split().problems[0]
    question, solution = problem_texts([problem])[problem.id]
    assert question == problem.question
    assert "<<" not in solution
    assert "####" not in solution
    assert solution
    doc = {
        "problems": {
            "test-0001": "wrong",
            "test-0002": {"outcome": "correct", "n_correct": 3, "n_samples": 4},
        }
    }
    assert outcomes_from_baseline(doc) == {"test-0001": "wrong", "test-0002": "correct"}


def test_script_asset_cannot_close_its_element() -> None:
    from importlib import resources

    for name in ("html_report.js", "html_report.css"):
        text = resources.files("pytest_gsm8k.core").joinpath(name).read_text()
        assert "</script" not in text.lower()
        assert "<!--" not in text
        assert "</style" not in text


# -- a full split's page in headless Chromium --------------------------------------------------


@NEEDS_CHROMIUM
def test_full_split_page_opens_and_filters(tmp_path: Path, browser: Browser) -> None:
    """1,319 problems with ~1.5 KB responses: builds and filters in the browser; the times are
    printed (``-s``), not asserted (no wall-clock assertions in this suite)."""
    records = []
    for p in _split().problems:
        outcome = "correct" if p.index % 8 else ("wrong", "unparsed", "truncated")[p.index % 3]
        body = (p.answer.rpartition("####")[0] + " ") * 8
        rec = _record(
            p.index, outcome, response=body[:1500] + "\nThe answer is 7.\n#### 7", gold=str(p.gold)
        )
        records.append(rec)
    failing = [r["id"] for r in records if r["outcome"] != "correct"][::5]
    report = _report(
        records,
        baseline={
            "path": "b",
            "shared": len(records),
            "baseline_accuracy": 0.9,
            "current_accuracy": 0.875,
            "difference": -0.025,
            "difference_ci95": [-0.04, -0.01],
            "newly_failing": failing,
            "newly_passing": [],
            "mcnemar_p": 0.001,
            "subset": False,
            "baseline_n": len(records),
        },
    )
    html_text = render_html(report, problem_texts(_split().problems), {})
    page = tmp_path / "full.html"
    page.write_text(html_text, encoding="utf-8")
    browser.open(page.as_uri())
    timings = browser.evaluate("window.gsm8kReport.timings")
    paint = browser.evaluate(
        "(performance.getEntriesByName('first-contentful-paint')[0] || {}).startTime || null"
    )
    measured = browser.evaluate("""(() => {
        const s = document.getElementById('f-outcome'), q = document.getElementById('f-search');
        const run = (f) => { const t = performance.now(); f(); document.body.offsetHeight;
                             return performance.now() - t; };
        const filter = run(() => { s.value = 'wrong'; s.dispatchEvent(new Event('change')); });
        const shown = document.getElementById('f-count').textContent;
        const search1 = run(() => { q.value = 'apples'; q.dispatchEvent(new Event('input')); });
        const search2 = run(() => { q.value = 'bakery'; q.dispatchEvent(new Event('input')); });
        const reset = run(() => { s.value = 'all'; q.value = '';
                                  q.dispatchEvent(new Event('input')); });
        return {filter, shown, search1, search2, reset};
    })()""")
    wrong = sum(r["outcome"] == "wrong" for r in records)
    assert measured["shown"] == f"{wrong} of 1319 shown"
    count = browser.evaluate("document.getElementById('f-count').textContent")
    assert count == "1319 of 1319 shown"
    assert browser.errors() == []
    print(
        f"\nHTML report, 1319 problems, {len(html_text) / 1e6:.2f} MB: parse JSON "
        f"{timings['parseMs']:.1f} ms, build rows {timings['buildMs']:.1f} ms, ready at "
        f"{timings['readyAt']:.0f} ms after navigation start, first contentful paint "
        f"{paint} ms; filter 'wrong' {measured['filter']:.1f} ms, first search (builds the "
        f"lowercase text) {measured['search1']:.1f} ms, next search {measured['search2']:.1f} "
        f"ms, reset {measured['reset']:.1f} ms (each including layout)"
    )


def test_a_run_with_no_answers_has_no_accuracy_drawn() -> None:
    records = [_record(i, "error") for i in range(3)]
    report = _report(records)
    report.update(accuracy=None, ci95=None, headline="gsm8k acc (test@1, 8-shot CoT): no answers")
    page = render_html(report, {}, {})
    assert "no answers: 3 errors, so no accuracy" in page
    assert 'aria-label="accuracy' not in page  # no chart with a 0.0000 point


def test_a_configs_baseline_written_refused_or_missing_says_so_and_compares_nothing() -> None:
    """--gsm8k-config: a config whose baseline was written now, refused or absent has no
    comparison card and no changed rows; the configs table says which it was."""

    def config(name: str, baseline: dict[str, Any] | None, gate: bool | None) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "config": {"name": name},
            "model": f"org/{name}",
            "n": 2,
            "accuracy": 0.5,
            "ci95": [0.1, 0.9],
            "protocol": {"label": f"{name}: test@1"},
            "gates": []
            if gate is None
            else [
                {
                    "name": f"{name}:baseline",
                    "rule": "baseline",
                    "passed": gate,
                    "verdict": "PASS" if gate else "FAIL",
                    "detail": "x",
                }
            ],
        }
        if baseline is not None:
            entry["baseline"] = baseline
        return entry

    records = [
        {**_record(i, "correct"), "id": f"{name}:test-{i:04d}"}
        for name in ("A", "B", "C")
        for i in range(2)
    ]
    configs = [
        config("A", {"path": "a.gsm8k", "written": True, "partial": False}, None),
        config("B", None, False),  # refused: the gate's FAIL says why, no block
        config("C", None, None),  # none: a note in the terminal
    ]
    page = render_html(_report(records, configs=configs), {}, {})
    cells = re.findall(r"<td>(written|FAIL|none)</td>", page)
    assert cells == ["written", "FAIL", "none"]
    assert "against its baseline" not in page
    assert 'id="f-change"' not in page
    data = _embedded(page)
    assert data["baseline"] is False
    assert {p["ch"] for p in data["problems"]} == {""}
    assert [p["c"] for p in data["problems"]] == ["A", "A", "B", "B", "C", "C"]


def test_braces_and_markup_in_names_are_text_in_the_configs_card_and_charts() -> None:
    """Rule (issue 33, the charts filled with str.format from html_report.html): a name the
    run did not make (a config's file name, a model, a label) is never a format field nor
    markup. Names holding ``{0}``, ``{x:>99999}`` and a lone ``}`` beside tags render as the
    text they are in the configs card and beside the charts (a KeyError or IndexError there
    would cost the run its page)."""
    names = ["{0}", "}{x:>99999}<b>", "a{"]
    configs = [
        {
            "config": {"name": name},
            "model": f"org/{name}<script>",
            "n": 2,
            "accuracy": 0.5,
            "ci95": [0.1, 0.9],
            "protocol": {"label": f"{name}: test@1 {{label}}</td>"},
            "gates": [{"name": f"{name}:vllm-threshold", "threshold": 0.4, "verdict": "PASS"}],
        }
        for name in names
    ]
    records = [
        {**_record(i, "correct" if i else "wrong"), "id": f"{name}:test-{i:04d}"}
        for name in names
        for i in range(2)
    ]
    page = render_html(_report(records, configs=configs, model="{model}<i>"), {}, {})
    for name in names:
        shown = name.replace("<", "&lt;").replace(">", "&gt;")
        assert f"<th>{shown}</th>" in page  # the configs card's config cell
        assert f"<td>org/{shown}&lt;script&gt;</td>" in page
    assert "<td>test@1 {label}&lt;/td&gt;</td>" in page  # the protocol cell, name cut off
    assert page.count("<script>") == 1  # the page's own
    # a single run: its charts (accuracy with the min-acc mark, outcomes, pass@k) beside names
    single = _report(
        [_record(0, "correct"), _record(1, "wrong")],
        model="{model}<i>",
        pass_at_k={"pass@1": 0.5, "pass@2": 0.75},
        headline="gsm8k acc ({0} {label}</h1>) = 0.5000",
    )
    single["protocol"]["label"] = "{0} {label}"
    single["gates"][0]["threshold"] = 0.85  # the chart's min-acc mark
    page = render_html(single, {}, {})
    assert "{0} {label}&lt;/h1&gt;" in page
    assert 'aria-label="accuracy 0.5000"' in page
    assert "min-acc 0.85</text>" in page
    assert 'aria-label="outcomes"' in page
    assert 'aria-label="pass@k"' in page


def test_a_baseline_sharing_no_problem_leaves_the_page_whole_without_a_comparison() -> None:
    """A baseline that holds none of the run's problems: the gate FAILs ("no problem id in
    common") and the page, as the terminal and the Markdown, compares nothing (its numbers
    are none: rendering them raised, and the run lost its page)."""
    from pytest_gsm8k.core import baseline as bl
    from pytest_gsm8k.core.calibrated import evidence

    records = [_record(0, "correct"), _record(1, "wrong")]
    document = {"problems": {"test-0100": "correct"}}
    compared = bl.noise_block(document, records, ["test-0000", "test-0001"], 0.05, evidence([]))
    block = {"path": "b.gsm8k", "partial": False, **compared}
    assert block["shared"] == 0
    page = render_html(_report(records, baseline=block), {}, {})
    assert "Against the baseline" not in page


def test_a_baseline_sharing_no_problem_is_never_said_written() -> None:
    """A comparison with a baseline that holds none of the run's problems has a block (its
    gate FAILs and says why) but no numbers: the page must not call it a baseline written."""
    records = [_record(i, "correct") for i in range(3)]
    block = {"path": "b.gsm8k", "partial": False, "shared": 0, "not_in_baseline": 3}
    page = render_html(_report(records, baseline=block), {}, {})
    assert "written to" not in page
    written = {"path": "b.gsm8k", "written": True, "partial": False}
    assert "written to <code>b.gsm8k</code>" in render_html(
        _report(records, baseline=written), {}, {}
    )
