"""``--gsm8k-markdown PATH``: the Markdown summary the run appends to ``$GITHUB_STEP_SUMMARY``,
written to a file (replaced, not appended to), with or without GitHub. A path that cannot
be written is refused before any request: tests/plugin/test_outputs_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import GsmRun, output, report

from pytest_gsm8k.core.dataset import select
from pytest_gsm8k.core.scrub import md_text
from pytest_gsm8k.runtime.data import load_split

LIMIT = "--gsm8k-limit=20"


def test_the_markdown_file_is_the_step_summary_replaced_each_run(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step = pytester.path / "step.md"
    step.write_text("an earlier step's summary\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    written = pytester.path / "out" / "summary.md"
    written.parent.mkdir()
    written.write_text("stale\n")
    server.set_script(Script(default="wrong"))
    args = [LIMIT, "--gsm8k-min-acc=0.99", "--gsm8k-report=r.json"]
    result, _ = gsm8k_run(*args, "--gsm8k-markdown=out/summary.md", ret=1, report=None)
    text = output(result)
    assert report(pytester)["counts"]["wrong"] == 20
    markdown = written.read_text()
    assert step.read_text() == "an earlier step's summary\n" + markdown
    assert markdown.startswith("### gsm8k acc (test@1, 0-shot CoT) = 0.0000")
    assert "| min-acc | FAIL | accuracy " in markdown
    assert "stale" not in markdown
    assert "  markdown: out/summary.md" in text.splitlines()

    # without GitHub: the file alone, replaced again (not appended to)
    monkeypatch.delenv("GITHUB_STEP_SUMMARY")
    server.set_script(Script())
    gsm8k_run(*args, "--gsm8k-no-cache", "--gsm8k-markdown=out/summary.md", report=None)
    again = written.read_text()
    assert again.startswith("### gsm8k acc (test@1, 0-shot CoT) = 1.0000")
    assert again.count("### gsm8k acc") == 1
    assert "| min-acc | PASS | accuracy 1.0000 " in again
    assert step.read_text() == "an earlier step's summary\n" + markdown


def test_the_ini_twin_names_the_file(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.makeini("[pytest]\ngsm8k_markdown = from-ini.md\n")
    gsm8k_run("--gsm8k-limit=3", report=None)
    assert (pytester.path / "from-ini.md").read_text().startswith("### gsm8k acc ")


def test_a_markdown_file_unwritable_at_the_end_is_one_line_and_fails_the_run(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    # a test of the user's turns the path into a folder after the session-start check
    pytester.makepyfile(test_spoil="import os\n\ndef test_spoil():\n    os.mkdir('m.md')\n")
    args = ["--gsm8k-limit=3", "--gsm8k-report=r.json"]
    result, _ = gsm8k_run(*args, "--gsm8k-markdown=m.md", ret=1, report=None)
    text = output(result)
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if "gsm8k: --gsm8k-markdown:" in line]
    assert len(lines) == 1, text
    assert lines[0].startswith("gsm8k: --gsm8k-markdown: cannot write m.md: ")
    assert "is a folder" in lines[0]
    assert "  markdown: m.md" not in text
    assert report(pytester)["n"] == 3


def test_a_regressed_run_shows_before_and_after_the_flips_and_no_local_path(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 34 (8): a reviewer reads the baseline's accuracy and this run's, each with its
    interval, the one difference estimate, the flips (newly failing and newly passing), the
    same numbers the terminal and the JSON report say; and where the page is, relative to the
    repository or as the artifact's file, never this machine's absolute path."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    ids = [p.index for p in select(load_split(None, "test", "main").problems, 40, 1234)]
    args = ["--gsm8k-limit=40", "--gsm8k-no-cache", "--gsm8k-markdown=m.md"]
    # the baseline: one problem wrong then; the page outside the repository
    server.set_script(Script(behaviours={ids[0]: "wrong"}))
    outside = tmp_path / "pages" / "gsm8k.html"
    gsm8k_run(*args, "--snapshot-update", f"--gsm8k-html={outside}", report=None)
    markdown = (pytester.path / "m.md").read_text()
    assert str(tmp_path) not in markdown
    assert "The run's page: `gsm8k.html` in the job's artifact" in markdown
    assert "Baseline written: `__snapshots__/gsm8k/test@1_0-shot_CoT.gsm8k`." in markdown

    # ten of its right problems wrong now, the wrong one right: the page inside the repository
    server.set_script(Script(behaviours={i: "wrong" for i in ids[3:13]}))
    inside = pytester.path / "out" / "gsm8k.html"
    result, _ = gsm8k_run(
        *args, "--gsm8k-report=r.json", f"--gsm8k-html={inside}", ret=1, report=None
    )
    text = output(result)
    markdown = (pytester.path / "m.md").read_text()
    assert str(pytester.path) not in markdown
    assert "The run's page: `out/gsm8k.html` (relative to the repository" in markdown
    data = report(pytester)
    base = data["baseline"]
    assert "**Against the baseline** `__snapshots__/gsm8k/test@1_0-shot_CoT.gsm8k`:" in markdown
    # this run's interval is the headline's (all its problems are compared)
    assert base["current_ci95"] == data["ci95"]
    (low, high), (c_low, c_high) = base["baseline_ci95"], data["ci95"]
    said = f"95% CI: baseline {low:.4f}-{high:.4f}, this run {c_low:.4f}-{c_high:.4f}"
    assert f"- {said}" in markdown
    assert f"    {said}" in text
    low, high = data["ci95"]
    assert f"[95% CI {low:.4f}-{high:.4f}]  n=40" in data["headline"]
    # the terminal's baseline line: the same accuracies, the same difference estimate
    line = next(x for x in text.splitlines() if x.startswith("    accuracy: "))
    assert line.startswith("    accuracy: 0.9750 -> 0.7500 on 40 problems; diff ")
    assert f"- {md_text(line.strip())}" in markdown  # the same row, word for word
    assert "10 newly failing, 1 newly passing; p=" in text
    # the flips, each problem listed
    failing = markdown.index("**Newly failing (10):**")
    passing = markdown.index("**Newly passing (1):**")
    assert failing < passing
    assert markdown.index(f"- `test-{ids[3]:04d}`: ") > failing
    assert markdown.index(f"- `test-{ids[0]:04d}`: ") > passing
    assert "stable (" not in markdown  # a single-run baseline cannot tell: no such count
    assert "noisy (" not in markdown


def test_the_page_is_named_as_given_and_a_page_on_a_device_is_not_named(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 34 (8): the page's path relative to the repository as it was given (a link keeps
    its own name, not its target's); a page written to a device or FIFO is no file a reader
    could open, and the summary names none (it printed the device's absolute path)."""
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    (pytester.path / "keep").mkdir()
    (pytester.path / "p.html").symlink_to(pytester.path / "keep" / "page.html")
    args = ["--gsm8k-limit=3", "--gsm8k-markdown=m.md"]
    gsm8k_run(*args, "--gsm8k-html=p.html", report=None)
    assert (
        "The run's page: `p.html` (relative to the repository"
        in (pytester.path / "m.md").read_text()
    )
    gsm8k_run(*args, "--gsm8k-html=/dev/null", report=None)
    markdown = (pytester.path / "m.md").read_text()
    assert markdown.startswith("### gsm8k acc ")
    assert "page" not in markdown
    assert "/dev/null" not in markdown
