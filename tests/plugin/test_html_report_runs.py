"""The HTML page of real runs: opened in headless Chromium (driven over the DevTools protocol
by ``tests/browser.py``) after a baseline was recorded and some answers flipped, one of them
hostile HTML; and written when the gate fails and when the endpoint dies."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from browser import NEEDS_CHROMIUM, Browser
from fakeserver import FakeOpenAIServer, Script

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.dataset import select
from pytest_gsm8k.core.html_report import (
    outcomes_from_baseline,
    problem_texts,
    render_html,
)
from pytest_gsm8k.runtime.data import load_split


@cache
def _split() -> Any:
    return load_split(None, "test", "main")


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


HOSTILE_ANSWER = "<script>window.__pwned=1</script></textarea> <!-- 7"


@NEEDS_CHROMIUM
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
    # 3 newly failing and 1 newly passing of 40: p = 0.3125 (exact McNemar), a FAIL only at
    # a loose level; the default 0.01 would pass it
    result = pytester.runpytest_subprocess(
        *args, "--gsm8k-alpha=0.5", "--gsm8k-report=r.json", f"--gsm8k-html={page}", timeout=600
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
    first = [*failing, f"test-{ids[0]:04d}"]
    rest = [p["id"] for p in by_index if p["id"] not in first]
    assert browser.evaluate(VISIBLE) == [*first, *rest]
    # every row opened: the hostile answer is on the page as text, and never ran
    browser.evaluate("document.querySelectorAll('#rows > details').forEach(d => d.open = true)")
    browser.evaluate("new Promise(r => setTimeout(r, 50))")
    row_text = browser.evaluate(f"document.getElementById('p-{hostile}').textContent")
    assert HOSTILE_ANSWER in row_text
    assert "baseline: correct" in row_text
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
    assert _set(browser, "f-search", "", "input") == [*first, *rest]

    browser.evaluate(
        "document.querySelectorAll('#rows > details').forEach((d, i) => "
        "d.open = i === 0 || d.id === 'p-" + hostile + "')"
    )
    png = browser.screenshot(tmp_path / "html-report.png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 20_000
    assert browser.errors() == []
    assert browser.requested_urls() == [page.as_uri()]  # the page fetched nothing else


def test_the_page_is_written_when_the_gate_fails_and_when_the_endpoint_dies(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    ids = [p.index for p in select(_split().problems, 20, 1234)]
    server.set_script(Script(behaviours={ids[0]: "wrong"}))
    run = [*gsm8k_args, "--gsm8k-limit=20", "--gsm8k-no-cache"]
    result = pytester.runpytest(*run, "--gsm8k-min-acc=1", "--gsm8k-html=out/page.html")
    assert result.ret == 1
    page = (pytester.path / "out" / "page.html").read_text(encoding="utf-8")
    assert "gsm8k acc (test@1, 0-shot CoT) = 0.9500" in page
    assert "FAIL" in page
    assert keyed_env not in page
    server.die_after = 5  # the endpoint goes away mid-run: the page of what was done
    result = pytester.runpytest(*run, "--gsm8k-html=out/page.html", "--gsm8k-max-retries=0")
    assert result.ret == 1
    page = (pytester.path / "out" / "page.html").read_text(encoding="utf-8")
    assert "gsm8k acc" in page
    assert "error" in page
