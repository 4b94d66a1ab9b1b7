"""The response cache in real runs, read as a resume reads it (--gsm8k-resume): entries that
do not belong where they are found are asked again, and a special file at an entry's path is
a miss, never a hang."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer
from helpers import output, report, sent


def entry_files(root: Path) -> list[Path]:
    return sorted((root / "responses").glob("*/*.json"))


@pytest.fixture
def run_args(gsm8k_args: list[str]) -> list[str]:
    return [*gsm8k_args, "--gsm8k-cache-dir=cache", "--gsm8k-resume"]


def _entries_by_problem(cache: Path) -> dict[str, Path]:
    """The cache's entries by the problem their request asks (its question's first words)."""
    return {
        json.loads(path.read_text())["request"]["messages"][-1]["content"][:60]: path
        for path in entry_files(cache)
    }


@pytest.mark.parametrize("without_key", [True, False], ids=["no-key-field", "key-field"])
def test_an_entry_filed_under_another_request_is_asked_again(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    run_args: list[str],
    keyed_env: str,
    without_key: bool,
) -> None:
    """One problem's entry copied over another's file: the stored key and request name the
    first problem, so the second is asked again, never graded with the first one's answer."""
    run = [*run_args, "--gsm8k-limit=12"]
    assert pytester.runpytest(*run).ret == 0
    first, second, third, *_ = entry_files(pytester.path / "cache")
    for source, target in ((first, second), (first, third)):
        data = json.loads(source.read_text())
        if without_key:
            del data["key"]
        target.write_text(json.dumps(data))
    server.reset()
    result = pytester.runpytest(*run, "--gsm8k-report=r.json")
    text = output(result)
    assert result.ret == 0, text
    assert sent(server) == 2
    assert report(pytester)["counts"]["correct"] == 12
    lines = [line for line in text.splitlines() if "filed under another request" in line]
    assert len(lines) == 1, text  # one line per run, not one per entry


def test_an_entry_whose_stored_request_differs_is_asked_again(
    pytester: pytest.Pytester, server: FakeOpenAIServer, run_args: list[str], keyed_env: str
) -> None:
    run = [*run_args, "--gsm8k-limit=6"]
    assert pytester.runpytest(*run).ret == 0
    path = entry_files(pytester.path / "cache")[0]
    data = json.loads(path.read_text())
    data["request"]["max_tokens"] = 7  # the answer of another request, under this key
    path.write_text(json.dumps(data))
    server.reset()
    result = pytester.runpytest(*run)
    assert result.ret == 0, output(result)
    assert sent(server) == 1
    assert "filed under another request" in output(result)


def test_a_fifo_at_an_entry_path_is_a_miss_with_one_warning(
    pytester: pytest.Pytester, server: FakeOpenAIServer, run_args: list[str], keyed_env: str
) -> None:
    """Opening a FIFO for reading waits for a writer: forever. The run must go on, ask
    that problem again and say why once. (A subprocess with a bound: a hang fails.)"""
    run = [*run_args, "--gsm8k-limit=3"]
    assert pytester.runpytest(*run).ret == 0
    path = entry_files(pytester.path / "cache")[1]
    path.unlink()
    os.mkfifo(path)
    server.reset()
    result = pytester.runpytest_subprocess(*run, timeout=60)
    text = output(result)
    assert result.ret == 0, text
    assert sent(server) == 1
    assert text.count("is not a regular file") == 1, text
