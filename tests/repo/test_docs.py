"""The README stays true: every option is documented, and CI runs the README's test command."""

from __future__ import annotations

from helpers import REPO

from pytest_gsm8k.core.settings import OPTIONS

README = (REPO / "README.md").read_text()


def test_every_option_and_ini_twin_is_in_the_readme_table() -> None:
    missing = [o.flag for o in OPTIONS if f"| `{o.flag}` | `{o.dest}` |" not in README]
    assert missing == []


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
    """No ../shared, no --gsm8k-data: the data ships inside the package."""
    blocks = [
        line
        for line in README.split("## What you get")[0].splitlines()
        if line.startswith("    python3 -m venv")
    ]
    assert all("shared" not in b and "--gsm8k-data" not in b for b in blocks)
    assert all('CMAKE_ARGS="-DGGML_NATIVE=OFF"' in b for b in blocks)  # portable llama.cpp
