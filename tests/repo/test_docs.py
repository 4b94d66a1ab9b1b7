"""The README stays true: CI runs the README's test command, and every link between the
README and docs/ leads somewhere. The options table: tests/test_options_table.py."""

from __future__ import annotations

import re
from pathlib import Path

from helpers import REPO

README = (REPO / "README.md").read_text()
DOCS = [REPO / "README.md", REPO / "CHANGELOG.md", REPO / "benchmarks" / "README.md"]
DOCS += sorted((REPO / "docs").glob("*.md"))

#: a Markdown link or image whose target is not a URL: [text](target) / ![alt](target)
_LINK = re.compile(r"\]\((?!https?://|mailto:)([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_anchor(m) for m in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def _broken_links(path: Path) -> list[str]:
    broken = []
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in _LINK.findall(text):
        file, _, fragment = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            broken.append(f"{target}: no heading with that anchor")
    return broken


def test_links_between_the_readme_and_docs_resolve() -> None:
    assert {p.name for p in DOCS} >= {"README.md", "CHANGELOG.md", "design.md"}
    broken = {str(p.relative_to(REPO)): _broken_links(p) for p in DOCS}
    assert {name: links for name, links in broken.items() if links} == {}


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# Title: `x`, y\n\nsee [b](b.md) and [t](#title-x-y)\n")
    page = tmp_path / "page.md"
    page.write_text("[a](a.md#title-x-y) [gone](gone.md) [bad](a.md#nope) ![i](a.md)\n")
    assert _broken_links(page) == [
        "gone.md: no such file",
        "a.md#nope: no heading with that anchor",
    ]
    assert _broken_links(tmp_path / "a.md") == ["b.md: no such file"]


def test_ci_runs_the_readme_test_command() -> None:
    blocks = [
        line.strip()
        for line in README.splitlines()
        if line.startswith("    python3 -m venv .venv && ")
    ]
    assert len(blocks) >= 2, "README must start with the set-up/run command and the test command"
    main_job, test_command = blocks[0], blocks[1]
    assert "--gsm8k-model=local" in main_job
    ci = (REPO / ".ci" / "run").read_text()
    assert test_command in ci.splitlines()


def test_the_readme_commands_need_nothing_beside_the_repository() -> None:
    """No ../shared, no --gsm8k-data: the data ships inside the package. The two commands
    open the README, before its first section ("In your repository", further down, installs
    a wheel into a user's own virtualenv)."""
    blocks = [
        line
        for line in README.split("\n## ")[0].splitlines()
        if line.startswith("    python3 -m venv")
    ]
    assert all("shared" not in b and "--gsm8k-data" not in b for b in blocks)
    assert all('CMAKE_ARGS="-DGGML_NATIVE=OFF"' in b for b in blocks)  # portable llama.cpp


def test_readme_quotes_the_zero_shot_instruction_the_plugin_sends() -> None:
    from pytest_gsm8k.core.prompts import COT_INSTRUCTION

    assert f"    {COT_INSTRUCTION}\n" in README
