"""Replies no real model sends, in real runs with and without xdist.

A hostile or broken server may send a reply of 70 MB, a gzip bomb, text that
UTF-8 cannot encode (a lone surrogate) or token counts that are not counts.
Each must be that problem's own outcome (an ``error`` with one line, or the
answer kept exactly), the same with and without xdist, and never a crash, a
lost summary or another problem's answer. Every run talks HTTP to the
scripted fake server. The pieces on their own (the xdist channel's frames, the bounded
decoder, the client's gzip bound, surrogate escapes) are tested in tests/unit.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from fakeserver import LONE_SURROGATE, FakeOpenAIServer, Script
from helpers import XDIST, GsmRun, output, report, sent

from pytest_gsm8k.core.dataset import select
from pytest_gsm8k.runtime.data import load_split

CRASHES = ("Traceback", "INTERNALERROR", "JSONDecodeError", "UnicodeEncodeError")


def chosen(limit: int) -> list[int]:
    """The problem indices ``--gsm8k-limit=limit`` runs, in run order."""
    return [p.index for p in select(load_split(None, "test", "main").problems, limit, 1234)]


def by_index(rep: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(p["index"]): p for p in rep["problems"]}


# -- replies too large to keep, a gzip bomb ---------------------------------------------------


@XDIST
def test_replies_over_the_bound_are_their_own_errors_and_never_shift_answers(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    xdist: list[str],
) -> None:
    """70 MB answers (longer than a line-based channel reads at once, so the rest would be
    read as the next reply) are refused at 32 MiB, and so is a gzip bomb once decoded: each is
    its own problem's error in one line; every other problem is scored with its own answer,
    under xdist too. (One run for both, one huge reply: each costs about a CPU-second.) A lone
    surrogate in a reply and in the served model's name crosses to the workers in the same
    run, kept exactly (the files and the cache it is written to: the test below, plain)."""
    indices = chosen(20)
    huge = {indices[2]}  # the answers after it are their own
    bomb = indices[5]
    odd = indices[1]
    behaviours = {**dict.fromkeys(huge, "huge"), bomb: "gzipbomb", odd: "surrogate"}
    server.set_script(Script(behaviours=behaviours, reported_model=f"fake-model{LONE_SURROGATE}"))
    result, _ = gsm8k_run(
        "--gsm8k-limit=20", "--gsm8k-concurrency=4", "--gsm8k-report=r.json", ret=1, report=None
    )
    text = output(result)
    assert not any(crash in text for crash in CRASHES), text
    problems = by_index(report(pytester))
    assert set(problems) == set(indices)
    for index, record in problems.items():
        if index in huge or index == bomb:
            assert record["outcome"] == "error", record
            assert "\n" not in record["error"]
            if index == bomb:
                assert "over 32 MiB decoded" in record["error"]
            else:
                assert record["error"].startswith("the endpoint's reply is over 32 MiB (7")
        else:
            assert record["outcome"] == "correct", (index, record["response"][-200:])
            assert record["extracted"] == server.golds[index].replace(",", "")
    assert sent(server) == 20  # a refused reply is not asked for again
    # the lone surrogate
    assert "answer channel" not in text
    assert "(server reported: fake-model\\ud83d)" in text  # shown as its escape
    assert LONE_SURROGATE in problems[odd]["response"]
    assert problems[odd]["samples"][0]["finish_reason"] == "stop" + LONE_SURROGATE
    assert "\\ud83d" in (pytester.path / "r.json").read_text(encoding="utf-8")


# -- text UTF-8 cannot encode ----------------------------------------------------------------


def test_a_lone_surrogate_is_kept_exactly_in_the_report_the_page_and_the_cache(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """(Under -n 2: the run of the test above, which has a surrogate too.)"""
    indices = chosen(6)
    odd = indices[1]
    server.set_script(
        Script(behaviours={odd: "surrogate"}, reported_model=f"fake-model{LONE_SURROGATE}")
    )
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(pytester.path / "summary.md"))
    run = ["--gsm8k-limit=6", "--gsm8k-cache-dir=cache"]
    first, _ = gsm8k_run(*run, "--gsm8k-report=r.json", "--gsm8k-html=p.html", report=None)
    text = output(first)
    assert not any(crash in text for crash in CRASHES), text
    assert "answer channel" not in text
    assert "gsm8k cache" not in text
    assert "(server reported: fake-model\\ud83d)" in text  # shown as its escape
    record = by_index(report(pytester))[odd]
    assert record["outcome"] == "correct"
    assert LONE_SURROGATE in record["response"]
    assert record["samples"][0]["finish_reason"] == "stop" + LONE_SURROGATE
    # the files are UTF-8 and hold the escape, which reads back as the same text
    assert "\\ud83d" in (pytester.path / "r.json").read_text(encoding="utf-8")
    page = (pytester.path / "p.html").read_text(encoding="utf-8")
    assert "\\ud83d" in page
    assert "<h1>gsm8k acc" in page
    assert (pytester.path / "summary.md").read_text(encoding="utf-8").startswith("### gsm8k acc")
    entries = list((pytester.path / "cache" / "responses").rglob("*.json"))
    assert len(entries) == 6
    server.reset()
    again, _ = gsm8k_run(*run, "--gsm8k-resume", "--gsm8k-report=r2.json", report=None)
    assert sent(server) == 0, output(again)
    again.stdout.fnmatch_lines(["*answers from cache: 6 of 6*"])
    assert by_index(report(pytester, "r2.json"))[odd]["response"] == record["response"]


# -- token counts that are not counts --------------------------------------------------------


#: a function-scoped gsm8k_model that hands on the plugin's own client: the same object
#: every time, so the same engine (once, its one-time warnings said once), not one per item
PASS_THROUGH = (
    "import pytest\n\n@pytest.fixture\ndef gsm8k_model(gsm8k_model):\n    return gsm8k_model\n"
)


@pytest.mark.parametrize("conftest", ["", PASS_THROUGH], ids=["own", "function-scoped-own"])
def test_token_counts_that_are_not_counts_are_left_out_and_said_once(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun, conftest: str
) -> None:
    pytester.makeconftest(conftest)
    indices = chosen(5)
    server.set_script(
        Script(
            usage_by_index={
                indices[0]: {"prompt_tokens": -5},
                indices[1]: {"completion_tokens": 10**30},
                indices[2]: {"prompt_tokens": "many", "completion_tokens": True},
            }
        )
    )
    result, _ = gsm8k_run("--gsm8k-limit=5", "--gsm8k-report=r.json", report=None)
    text = output(result)
    rep = report(pytester)
    problems = by_index(rep)
    assert "prompt_tokens" not in problems[indices[0]]["usage"]
    assert "completion_tokens" not in problems[indices[1]]["usage"]
    assert problems[indices[2]]["usage"] == {}
    assert problems[indices[3]]["usage"]["prompt_tokens"] > 0  # good counts are kept
    for name in ("prompt_tokens", "completion_tokens"):
        counted = [p["usage"][name] for p in problems.values() if name in p["usage"]]
        assert rep["tokens"][name] == sum(counted)
        assert all(0 < c < 10**6 for c in counted)
    tokens = rep["tokens"]
    assert f"tokens: prompt {tokens['prompt_tokens']:,}, completion " in text
    assert f"completion {tokens['completion_tokens']:,};" in text
    # said once, naming whichever bad reply came first (the requests are concurrent)
    said = re.findall(r"token counts that are not counts \((.*?)\); they are left out", text)
    assert len(said) == 1, text
    assert said[0] in ("prompt_tokens=-5", "completion_tokens=" + repr(10**30)) or (
        said[0] == "prompt_tokens='many', completion_tokens=True"
    ), said
