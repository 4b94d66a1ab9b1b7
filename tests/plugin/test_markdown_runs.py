"""``--gsm8k-markdown PATH``: the Markdown summary the run appends to ``$GITHUB_STEP_SUMMARY``,
written to a file (replaced, not appended to), with or without GitHub. A path that cannot
be written is refused before any request: tests/plugin/test_outputs_runs.py."""

from __future__ import annotations

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import XDIST, output, report

LIMIT = "--gsm8k-limit=20"


@XDIST
def test_the_markdown_file_is_the_step_summary_replaced_each_run(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step = pytester.path / "step.md"
    step.write_text("an earlier step's summary\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    written = pytester.path / "out" / "summary.md"
    written.parent.mkdir()
    written.write_text("stale\n")
    server.set_script(Script(default="wrong"))
    args = [*gsm8k_args, *xdist, LIMIT, "--gsm8k-min-acc=0.99", "--gsm8k-report=r.json"]
    result = pytester.runpytest(*args, "--gsm8k-markdown=out/summary.md")
    text = output(result)
    assert result.ret == 1, text
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
    result = pytester.runpytest(*args, "--gsm8k-no-cache", "--gsm8k-markdown=out/summary.md")
    assert result.ret == 0, output(result)
    again = written.read_text()
    assert again.startswith("### gsm8k acc (test@1, 0-shot CoT) = 1.0000")
    assert again.count("### gsm8k acc") == 1
    assert "| min-acc | PASS | accuracy 1.0000 " in again
    assert step.read_text() == "an earlier step's summary\n" + markdown


def test_the_ini_twin_names_the_file(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    pytester.makeini("[pytest]\ngsm8k_markdown = from-ini.md\n")
    result = pytester.runpytest(*gsm8k_args, "--gsm8k-limit=3")
    assert result.ret == 0, output(result)
    assert (pytester.path / "from-ini.md").read_text().startswith("### gsm8k acc ")


@XDIST
def test_a_markdown_file_unwritable_at_the_end_is_one_line_and_fails_the_run(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    # a test of the user's turns the path into a folder after the session-start check
    pytester.makepyfile(test_spoil="import os\n\ndef test_spoil():\n    os.mkdir('m.md')\n")
    args = [*gsm8k_args, *xdist, "--gsm8k-limit=3", "--gsm8k-report=r.json"]
    result = pytester.runpytest(*args, "--gsm8k-markdown=m.md")
    text = output(result)
    assert result.ret == 1, text
    assert "Traceback" not in text
    lines = [line for line in text.splitlines() if "gsm8k: --gsm8k-markdown:" in line]
    assert len(lines) == 1, text
    assert lines[0].startswith("gsm8k: --gsm8k-markdown: cannot write m.md: ")
    assert "is a folder" in lines[0]
    assert "  markdown: m.md" not in text
    assert report(pytester)["n"] == 3
