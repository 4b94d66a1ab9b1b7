"""The answer-format health gates and the chat-API hint, end to end.

Real runs (pytester), plain and under ``-n 2``, against the loopback fake server scripted to
cut answers at the token limit (``finish_reason: length``), to answer without a number, to
fail with HTTP 500 or to answer in a chat template's turn markup. The rules themselves:
tests/unit/core/test_gate_rules.py, test_health.py and test_early_stop.py.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_EXTRA_PLUGINS, TEST_KEY, GsmRun, output, report, sent

from pytest_gsm8k.core.dataset import select
from pytest_gsm8k.runtime.data import load_split

LIMIT = 20
#: what the fake server does for each counted outcome (an error: HTTP 500, not retried)
BEHAVIOUR = {"truncated": "truncated", "unparsed": "unparsed", "error": "error500"}


def _selected() -> list[int]:
    """The indices of the problems ``--gsm8k-limit=20`` runs (the default seed)."""
    return [p.index for p in select(load_split(None, "test", "main").problems, LIMIT, 1234)]


def _gate(data: dict[str, object], name: str) -> dict[str, object]:
    gates = data["gates"]
    assert isinstance(gates, list)
    found: dict[str, object] = next(g for g in gates if g["name"] == name)
    return found


def _junit_gates(path: Path) -> dict[str, ET.Element]:
    suite = ET.parse(path).getroot().find("testsuite")
    assert suite is not None
    return {
        str(case.get("name")): case
        for case in suite.iter("testcase")
        if case.get("classname") == "gsm8k.gates"
    }


@pytest.mark.parametrize("outcome", ["truncated", "unparsed", "error"])
def test_a_health_gate_fails_the_run_with_one_line_and_passes_under_a_looser_rate(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    outcome: str,
) -> None:
    """4 of 20 problems (20%) of one outcome: ``--gsm8k-max-<outcome> 0.1`` (2 allowed)
    fails the run with its line, in the terminal, the JSON report, the JUnit XML, the
    Markdown summary and the page; 0.2 (exactly the share) passes."""
    bad = _selected()[3:7]
    server.set_script(Script(behaviours=dict.fromkeys(bad, BEHAVIOUR[outcome])))
    name, flag = f"max-{outcome}", f"--gsm8k-max-{outcome}"
    word = "ended in an error" if outcome == "error" else outcome
    args = [f"--gsm8k-limit={LIMIT}", "--gsm8k-max-retries=0"]
    result, _ = gsm8k_run(
        *args,
        f"{flag}=0.1",
        "--gsm8k-report=r.json",
        "--junitxml=junit.xml",
        "--gsm8k-markdown=summary.md",
        "--gsm8k-html=page.html",
        ret=1,
        report=None,
    )
    line = f"  gate {name}: FAIL: 20.0% of 20 problems {word} (4; 2 allowed) > {flag} 0.1"
    assert output(result).count(f"gate {name}:") == 1
    assert line in result.stdout.lines
    data = report(pytester)
    assert data["counts"][outcome] == 4
    gate = _gate(data, name)
    assert (gate["rule"], gate["passed"], gate["value"], gate["threshold"]) == (
        name,
        False,
        0.2,
        0.1,
    )
    [failure] = _junit_gates(pytester.path / "junit.xml")[name].findall("failure")
    assert line.split(": FAIL: ")[1] in str(failure.get("message"))
    assert f"| {name} | FAIL | 20.0% of 20 problems" in (pytester.path / "summary.md").read_text()
    assert name in (pytester.path / "page.html").read_text(encoding="utf-8")

    # an error fails its own item (an infrastructure failure), whatever the gate says
    looser, data = gsm8k_run(*args, f"{flag}=0.2", ret=1 if outcome == "error" else 0)
    assert f"  gate {name}: PASS: 20.0% of 20 problems {word} (4; 4 allowed) <= {flag} 0.2" in (
        looser.stdout.lines
    )
    assert _gate(data, name)["passed"] is True


def test_the_early_stop_fails_a_rambling_model_after_66_of_1319_problems(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    """Every answer cut by the token limit: 0.05 of 1319 allows 65, so FAIL is certain
    at the 66th, and the run stops there (plus the requests already in flight)."""
    server.set_script(Script(default="truncated"))
    gsm8k_run(
        "--gsm8k-max-truncated=0.05",
        "--gsm8k-early-stop=certain",
        "--gsm8k-concurrency=8",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        ret=1,
        report=None,
    )
    assert 66 <= sent(server) <= 66 + 8 + 2, sent(server)
    data = report(pytester)
    assert data["early_stop"]["decided_after"] == 66
    assert data["early_stop"]["verdicts"] == {"max-truncated": "FAIL"}
    gate = _gate(data, "max-truncated")
    assert (gate["rule"], gate["passed"]) == ("early-stop", False)
    assert "max-truncated verdict FAIL is certain (66 truncated already, 65 allowed)" in str(
        gate["detail"]
    )


def test_the_early_stop_passes_a_health_gate_once_the_rest_cannot_fail_it(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    """20 clean answers against 0.5 (10 allowed): PASS is certain after 10, and the
    stopped run exits 0 with the early verdict as the gate's."""
    gsm8k_run(
        f"--gsm8k-limit={LIMIT}",
        "--gsm8k-max-unparsed=0.5",
        "--gsm8k-early-stop=certain",
        "--gsm8k-concurrency=1",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        report=None,
    )
    data = report(pytester)
    assert data["early_stop"]["decided_after"] == 10
    gate = _gate(data, "max-unparsed")
    assert (gate["rule"], gate["passed"], gate["threshold"]) == ("early-stop", True, 0.5)


def test_a_health_gate_left_open_by_another_gates_early_fail_is_not_a_fail(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    """Every answer wrong: min-acc 0.85 fails for certain after 198 problems, when no
    answer was truncated but the full run's share is still open. The health gate says
    so instead of judging the partial counts; the run fails on min-acc."""
    server.set_script(Script(default="wrong"))
    gsm8k_run(
        "--gsm8k-min-acc=0.85",
        "--gsm8k-max-truncated=0.05",
        "--gsm8k-early-stop=certain",
        "--gsm8k-concurrency=8",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        ret=1,
        report=None,
    )
    data = report(pytester)
    assert data["early_stop"]["verdicts"] == {"min-acc": "FAIL", "max-truncated": None}
    assert _gate(data, "min-acc")["passed"] is False
    gate = _gate(data, "max-truncated")
    assert (gate["rule"], gate["passed"]) == ("early-stop", True)
    assert gate["detail"] == "undecided: the run stopped early on another gate's FAIL"


# -- the chat-API hint -------------------------------------------------------------------------


@pytest.fixture
def instruct_server(gsm8k_data: Path) -> Iterator[FakeOpenAIServer]:
    """A scripted server whose model id says it is instruction-tuned."""
    with FakeOpenAIServer(
        gsm8k_data / "test.jsonl", model="Qwen2.5-7B-Instruct", api_key=TEST_KEY
    ) as srv:
        yield srv


HINT = (
    "  hint: 30.0% of 20 problems unparsed (6) through --gsm8k-api completions, and the model "
    "looks like a chat model ({sign}): try --gsm8k-api chat, which applies its chat template"
)


def test_the_hint_names_a_chat_model_on_the_completions_api_once(
    pytester: pytest.Pytester, instruct_server: FakeOpenAIServer, keyed_env: str
) -> None:
    """No gate set: the hint is one line of the gsm8k block; the chat API gets none."""
    instruct_server.set_script(Script(behaviours=dict.fromkeys(_selected()[:6], "unparsed")))
    args = [
        "--gsm8k-model=Qwen2.5-7B-Instruct",
        f"--gsm8k-base-url={instruct_server.base_url}",
        *NO_EXTRA_PLUGINS,
        f"--gsm8k-limit={LIMIT}",
    ]
    result = pytester.runpytest(*args, "--gsm8k-api=completions")
    assert result.ret == 0, output(result)
    sign = "its id 'Qwen2.5-7B-Instruct' has 'instruct'"
    assert [line for line in result.stdout.lines if "hint:" in line] == [HINT.format(sign=sign)]
    assert "--gsm8k-api chat" not in result.stderr.str()
    chat = pytester.runpytest(*args, "--gsm8k-api=chat")
    assert chat.ret == 0, output(chat)
    assert "unparsed" in chat.stdout.str()  # the same answers: 6 unparsed
    assert "hint:" not in output(chat)


def test_the_hint_reads_chat_template_tokens_in_the_replies(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    """A model id that says nothing (``fake-model``): replies in Llama 3's turn markup are
    the sign; the same share of plain unparsed replies gives no hint."""
    six = _selected()[:6]
    args = [f"--gsm8k-limit={LIMIT}", "--gsm8k-api=completions"]
    server.set_script(Script(behaviours=dict.fromkeys(six, "template")))
    result, _ = gsm8k_run(*args, "--gsm8k-no-cache", "--gsm8k-max-unparsed=0.1", ret=1, report=None)
    sign = "a reply holds the chat-template token '<|eot_id|>'"
    assert [line for line in result.stdout.lines if "hint:" in line] == [HINT.format(sign=sign)]
    assert "  gate max-unparsed: FAIL: 30.0% of 20 problems unparsed (6; 2 allowed)" in (
        result.stdout.str()
    )
    server.set_script(Script(behaviours=dict.fromkeys(six, "unparsed")))
    plain, _ = gsm8k_run(*args, "--gsm8k-no-cache", report=None)
    assert "6 unparsed" in plain.stdout.str()
    assert "hint:" not in output(plain)
