"""The HTML report page (issue 15): a pure renderer of the JSON report, checked as text and
in a real headless Chromium (driven over the DevTools protocol by ``tests/browser.py``).

The browser tests run the plugin (``pytester.runpytest_subprocess``) against the loopback fake
server, with a baseline recorded first and then some answers flipped; one scripted answer is
hostile HTML. They skip only when ``chromium`` is not installed.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from browser import Browser, chromium
from fakeserver import FakeOpenAIServer, Script
from helpers import XDIST

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.dataset import select
from pytest_gsm8k.core.html_report import (
    ProblemText,
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
needs_chromium = pytest.mark.skipif(
    chromium() is None, reason="chromium not found on PATH (apt-get install chromium)"
)


@cache
def _split() -> Any:
    return load_split(None)


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
    texts = {
        r["id"]: ProblemText("<script>alert(1)</script> apples?", "</textarea><!-- 5")
        for r in records
    }
    page = render_html(report, texts)
    for hostile in HOSTILE:
        if hostile != "</script>":
            assert hostile not in page, hostile
    # "</script>" only where the page's own two elements end: the data block and the code
    assert page.count("<script") == 2 and page.count("</script>") == 2
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the model name, shown as text
    data = _embedded(page)  # and the data survives the escaping unchanged
    assert [p["r"] for p in data["problems"]] == [r["response"] for r in records]
    assert data["problems"][0]["q"] == "<script>alert(1)</script> apples?"
    assert data["problems"][0]["s"] == "</textarea><!-- 5"


def test_no_external_resource_and_no_secret() -> None:
    report = _report(
        [_record(0, "correct")],
        endpoint="https://user:sk-live-XYZ@api.example.com/v1?api-key=sk-q-ABC",
    )
    page = render_html(report)
    assert not re.search(r"""\b(src|href)\s*=|@import|url\(""", page)
    assert "sk-live-XYZ" not in page and "sk-q-ABC" not in page
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
    page = render_html(_report(records, started_at="2024-05-01T10:00:00Z", duration_s=61.2))
    assert "gsm8k acc (test@1, 8-shot CoT) = 0.4000  [95% CI 0.5000-0.9000]  n=5" in page
    assert re.search(r'class="verdict fail">FAIL<', page)
    assert re.search(r'class="badge fail">FAIL</span></td><th>min-acc</th>', page)
    assert "7573bc2082847ca0" in page and "http://127.0.0.1:9/v1" in page
    assert "prompt 1,234, completion 5,678" in page and "61.2 s" in page
    assert "min-acc 0.85" in page  # the threshold on the accuracy axis, parsed from the gate
    assert page.count("<svg") == 2  # accuracy axis, outcome bar; no pass@k without pass@N
    assert "2 correct" in page and "1 truncated" in page
    assert "INCOMPLETE" not in page and "EARLY STOP" not in page


def test_pass_at_k_curve_when_sampled() -> None:
    report = _report(
        [_record(0, "correct")], pass_at_k={"pass@1": 0.61, "pass@2": 0.7, "pass@4": 0.78}
    )
    page = render_html(report)
    assert page.count("<svg") == 3
    assert "pass@4 = 0.7800" in page and page.count("<polyline") == 1


def test_interrupted_and_early_stopped_runs_say_so() -> None:
    report = _report([_record(0, "correct"), _record(1, "wrong")], complete=False, expected=1319)
    report["early_stop"] = {
        "mode": "sprt",
        "alpha": 0.05,
        "decided_after": 2,
        "verdicts": {"min-acc": "fail"},
        "bounds": [0.1, 0.9],
    }
    page = render_html(report)
    assert "INCOMPLETE: 2 of 1319 problems have a result" in page
    assert "EARLY STOP: mode sprt; alpha 0.05; decided after 2" in page
    assert "<dt>verdicts</dt><dd>min-acc: fail</dd>" in page
    assert "<dt>bounds</dt><dd>[0.1, 0.9]</dd>" in page


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
    }
    page = render_html(_report(records, baseline=baseline))
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
    # without the baseline file, its correctness is derived from the flips
    assert [p["b"] for p in data["problems"]] == [
        "correct",
        "correct",
        "not correct",
        "not correct",
        "not correct",
        "correct",
    ]
    assert "one-sided p = 0.6875" in page and "-0.0000 [95% CI -0.3000, +0.3000]" not in page
    assert "+0.0000 [95% CI -0.3000, +0.3000]" in page
    # given the baseline's own outcomes, they win
    page = render_html(_report(records, baseline=baseline), None, {"test-0000": "unparsed"})
    assert _embedded(page)["problems"][2]["b"] == "unparsed"


def test_problem_texts_and_baseline_outcomes() -> None:
    problem = _split().problems[0]
    text = problem_texts([problem])[problem.id]
    assert text.question == problem.question
    assert "<<" not in text.solution and "####" not in text.solution and text.solution
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
        assert "</script" not in text.lower() and "<!--" not in text and "</style" not in text


# -- a real run's page in headless Chromium ----------------------------------------------------


VISIBLE = (
    "[...document.querySelectorAll('#rows > details')].filter(e => !e.hidden)"
    ".map(e => e.id.slice(2))"
)


def _set(browser: Browser, element: str, value: str, event: str) -> list[str]:
    """Set a filter control like a user would, and return the ids left visible."""
    browser.evaluate(
        f"(() => {{ const e = document.getElementById({json.dumps(element)}); "
        f"e.value = {json.dumps(value)}; e.dispatchEvent(new Event('{event}')); }})()"
    )
    return list(browser.evaluate(VISIBLE))


@pytest.fixture
def browser(tmp_path: Path) -> Any:
    b = Browser(tmp_path / "chromium-profile", height=1500)
    try:
        yield b
    finally:
        b.close()


HOSTILE_ANSWER = "<script>window.__pwned=1</script></textarea> <!-- 7"


@needs_chromium
def test_real_run_page_in_chromium(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    browser: Browser,
    tmp_path: Path,
) -> None:
    ids = [p.index for p in select(_split().problems, 40, 1234)]
    args = [
        *gsm8k_args,
        "--gsm8k-limit=40",
        "--gsm8k-temperature=0.7",
        "--gsm8k-no-cache",
        "--gsm8k-min-acc=0.8",
    ]
    server.set_script(Script(behaviours={ids[0]: "wrong", ids[1]: "unparsed", ids[2]: "wrong"}))
    result = pytester.runpytest_subprocess(*args, "--snapshot-update", timeout=600)
    assert result.ret == 0, result.stdout.str()
    # samples are served for sampling requests (temperature > 0): the hostile answer is one
    server.set_script(
        Script(
            behaviours={
                ids[0]: "correct",
                ids[1]: "unparsed",
                ids[2]: "wrong",
                ids[3]: "wrong",
                ids[4]: "truncated",
                ids[6]: "think",
            },
            samples={ids[5]: [HOSTILE_ANSWER]},
        )
    )
    page = tmp_path / "report.html"
    result = pytester.runpytest_subprocess(
        *args, "--gsm8k-report=r.json", f"--gsm8k-html={page}", timeout=600
    )
    assert result.ret == 1, result.stdout.str()  # the baseline gate fails
    result.stdout.fnmatch_lines([f"  page: {page}"])  # the terminal says where the page is
    report = json.loads((pytester.path / "r.json").read_text())
    failing = [f"test-{i:04d}" for i in sorted(ids[3:6])]
    assert report["baseline"]["newly_failing"] == failing
    assert report["baseline"]["newly_passing"] == [f"test-{ids[0]:04d}"]
    # the page the plugin wrote is the page the renderer makes of this run
    stored = bl.loads(next((pytester.path / "__snapshots__").rglob("*.gsm8k")).read_text(), "b")
    expected = render_html(report, problem_texts(_split().problems), outcomes_from_baseline(stored))
    assert page.read_text(encoding="utf-8") == expected
    assert "__pwned=1</script>" not in page.read_text()
    assert keyed_env not in page.read_text()

    browser.open(page.as_uri())
    assert browser.evaluate("document.documentElement.dataset.ready") == "40"
    hostile = f"test-{ids[5]:04d}"
    by_index = sorted(report["problems"], key=lambda p: p["index"])
    rest = [p["id"] for p in by_index if p["id"] not in failing + [f"test-{ids[0]:04d}"]]
    assert browser.evaluate(VISIBLE) == failing + [f"test-{ids[0]:04d}"] + rest
    # every row opened: the hostile answer is on the page as text, and never ran
    browser.evaluate("document.querySelectorAll('#rows > details').forEach(d => d.open = true)")
    browser.evaluate("new Promise(r => setTimeout(r, 50))")
    row_text = browser.evaluate(f"document.getElementById('p-{hostile}').textContent")
    assert HOSTILE_ANSWER in row_text and "baseline: correct" in row_text
    assert browser.evaluate("typeof window.__pwned") == "undefined"
    assert browser.evaluate("document.scripts.length") == 2
    assert (
        browser.evaluate(
            "document.querySelectorAll('#rows script, #rows textarea, #rows img').length"
        )
        == 0
    )
    assert browser.evaluate("document.querySelectorAll('#rows .body').length") == 40

    wrong = sorted(p["id"] for p in report["problems"] if p["outcome"] == "wrong")
    assert sorted(_set(browser, "f-outcome", "wrong", "change")) == wrong
    not_correct = _set(browser, "f-outcome", "notcorrect", "change")
    assert len(not_correct) == report["n"] - report["correct"]
    assert _set(browser, "f-change", "failing", "change") == [
        p for p in failing if p in not_correct
    ]
    _set(browser, "f-outcome", "all", "change")
    assert _set(browser, "f-change", "passing", "change") == [f"test-{ids[0]:04d}"]
    _set(browser, "f-change", "all", "change")
    target = f"test-{ids[7]:04d}"
    assert _set(browser, "f-search", target.upper(), "input") == [target]
    question = _split().problems[ids[8]].question
    assert f"test-{ids[8]:04d}" in _set(browser, "f-search", question[10:50], "input")
    assert _set(browser, "f-search", "window.__pwned", "input") == [hostile]
    assert browser.evaluate("document.getElementById('f-count').textContent") == "1 of 40 shown"
    assert _set(browser, "f-search", "", "input") == failing + [f"test-{ids[0]:04d}"] + rest

    browser.evaluate(
        "document.querySelectorAll('#rows > details').forEach((d, i) => "
        "d.open = i === 0 || d.id === 'p-" + hostile + "')"
    )
    png = browser.screenshot(tmp_path / "html-report.png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    assert browser.errors() == []
    assert browser.requested_urls() == [page.as_uri()]  # the page fetched nothing else


@needs_chromium
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
    html_text = render_html(report, problem_texts(_split().problems))
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


@XDIST
def test_the_page_is_written_when_the_gate_fails_and_when_the_endpoint_dies(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    ids = [p.index for p in select(_split().problems, 20, 1234)]
    server.set_script(Script(behaviours={ids[0]: "wrong"}))
    run = [*gsm8k_args, *xdist, "--gsm8k-limit=20", "--gsm8k-no-cache", "-p", "no:hypothesispytest"]
    result = pytester.runpytest(*run, "--gsm8k-min-acc=1", "--gsm8k-html=out/page.html")
    assert result.ret == 1
    page = (pytester.path / "out" / "page.html").read_text(encoding="utf-8")
    assert "gsm8k acc (test@1, 0-shot CoT) = 0.9500" in page and "FAIL" in page
    assert keyed_env not in page
    server.die_after = 5  # the endpoint goes away mid-run: the page of what was done
    result = pytester.runpytest(*run, "--gsm8k-html=out/page.html", "--gsm8k-max-retries=0")
    assert result.ret == 1
    page = (pytester.path / "out" / "page.html").read_text(encoding="utf-8")
    assert "gsm8k acc" in page and "error" in page
