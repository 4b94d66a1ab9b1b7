"""End-to-end tests of the plugin: pytest itself, run by ``pytester``, against
the real loopback fake OpenAI server (``tests/fakeserver.py``).

Each test runs pytest in a fresh, empty pytester directory (a repository with no
test code) unless it writes a user test or conftest on purpose. Full-split runs
(1,319 items) are kept to three; everything else uses ``--gsm8k-limit``.
"""

from __future__ import annotations

import json
import re
import socket
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from gsm8k_copy import data_dir
from helpers import NO_EXTRA_PLUGINS, TEST_KEY, GsmRun, output
from helpers import report as read_report
from helpers import sent as completions_sent

from pytest_gsm8k.core.dataset import select
from pytest_gsm8k.core.scoring import format_number
from pytest_gsm8k.runtime.data import load_split

USAGE_ERROR = int(pytest.ExitCode.USAGE_ERROR)


HEADLINE = "gsm8k acc (test@1, 0-shot CoT) = "


# -- helpers -------------------------------------------------------------------------


@cache
def _split() -> Any:
    return load_split(None, "test", "main")


def selected(limit: int | None, seed: int = 1234) -> list[int]:
    """Indices the plugin runs for ``--gsm8k-limit=limit`` (computed by the pure module)."""
    return [p.index for p in select(_split().problems, limit, seed)]


def collected_ids(result: pytest.RunResult) -> list[str]:
    return [line.strip() for line in result.outlines if "::" in line and "[" in line]


def outcome_map(report: dict[str, Any], outcome: str) -> set[int]:
    return {p["index"] for p in report["problems"] if p["outcome"] == outcome}


def projection(report: dict[str, Any]) -> dict[str, Any]:
    """The parts of a report that must not depend on how the run was scheduled."""
    keys = (
        "accuracy",
        "correct",
        "n",
        "expected",
        "complete",
        "counts",
        "rules",
        "protocol",
        "dataset",
        "subset",
        "gates",
        "model",
    )
    problems = [
        {k: p[k] for k in ("index", "id", "gold", "extracted", "correct", "outcome", "response")}
        for p in report["problems"]
    ]
    return {**{k: report[k] for k in keys}, "problems": problems}


def assert_one_line_error(result: pytest.RunResult, server: FakeOpenAIServer, *needles: str) -> str:
    """A usage error: one ``ERROR: gsm8k: ...`` line holding every needle, no traceback,
    nothing sent to the server."""
    text = output(result)
    assert result.ret == USAGE_ERROR, text
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("ERROR: gsm8k:")]
    assert len(lines) == 1, text
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert completions_sent(server) == 0
    return lines[0]


def free_closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def fast_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shrink openai's exponential backoff (0.5 s base) for in-process runs."""
    monkeypatch.setattr("openai._base_client.INITIAL_RETRY_DELAY", 0.01)


CALLABLE_CONFTEST = """
import asyncio, json
import pytest
from pytest_gsm8k.core.scoring import gold_number

GOLD = {{}}
with open({data!r}, encoding="utf-8") as fh:
    for i, line in enumerate(l for l in fh if l.strip()):
        GOLD[f"test-{{i:04d}}"] = gold_number(json.loads(line)["answer"])

def answer(request):
    gold = GOLD[request.problem_id]
    index = int(request.problem_id.split("-")[1])
    value = gold + 1 if index % 3 == 0 else gold
    return f"Step by step. #### {{value}}"

@pytest.fixture(scope="session")
def gsm8k_model():
    kind = {kind!r}
    if kind == "sync":
        return answer
    if kind == "list":
        return lambda request: [answer(request)]
    async def model(request):
        await asyncio.sleep(0)
        return answer(request)
    return model
"""


# -- Done when: the full split ---------------------------------------------------------


def test_full_split_all_correct_in_empty_directory(
    server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    result, report = gsm8k_run("--gsm8k-min-acc=1.0")
    text = output(result)
    assert report["n"] == 1319
    assert report["expected"] == 1319
    assert report["complete"] is True
    assert report["accuracy"] == 1.0
    assert report["correct"] == 1319
    assert len(report["problems"]) == 1319
    assert {p["id"] for p in report["problems"]} == {f"test-{i:04d}" for i in range(1319)}
    assert report["dataset"]["split"] == "test"
    assert report["dataset"]["rows"] == 1319
    assert report["dataset"]["fingerprint"] == _split().fingerprint
    assert report["dataset"]["name"] == "embedded openai/gsm8k"
    assert report["model"] == "fake-model"
    assert report["protocol"]["name"] == "test@1"
    assert report["gates"] == [
        {
            "name": "min-acc",
            "rule": "min-acc",
            "passed": True,
            "value": 1.0,
            "threshold": 1.0,
            "detail": report["gates"][0]["detail"],
            "verdict": "PASS",
        }
    ]
    result.stdout.fnmatch_lines([f"{HEADLINE}1.0000  [[]95% CI *]  n=1319", "*1319 correct*"])
    assert completions_sent(server) == 1319
    assert "Traceback" not in text


def test_full_split_gate_fails_with_every_outcome_counted(
    server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    """(The same report and summary under xdist, each request once: test_engine_runs.py's
    xdist report, every outcome and a failed gate on 80 problems.)"""
    wrong = set(range(0, 1319, 53))
    unparsed = {7, 700, 1318}
    truncated = {11, 1200}
    behaviours = {i: "wrong" for i in wrong}
    behaviours.update({i: "unparsed" for i in unparsed})
    behaviours.update({i: "truncated" for i in truncated})
    server.set_script(Script(behaviours=behaviours))
    bad = len(wrong) + len(unparsed) + len(truncated)
    expected_acc = (1319 - bad) / 1319
    args = ["--gsm8k-min-acc=0.98", "--gsm8k-no-cache"]

    result, report = gsm8k_run(*args, ret=1, report="plain.json")
    assert completions_sent(server) == 1319
    assert report["accuracy"] == expected_acc
    assert report["n"] == 1319
    assert outcome_map(report, "wrong") == wrong
    assert outcome_map(report, "unparsed") == unparsed
    assert outcome_map(report, "truncated") == truncated
    assert report["gates"][0]["passed"] is False
    text = output(result)
    gate_lines = [line for line in text.splitlines() if "--gsm8k-min-acc 0.98" in line]
    assert len(gate_lines) == 1, text
    assert "FAIL" in gate_lines[0]
    assert f"{expected_acc:.4f}" in gate_lines[0]
    assert f"{HEADLINE}{expected_acc:.4f}" in text
    assert (
        f"{1319 - bad} correct, {len(wrong)} wrong, {len(unparsed)} unparsed, "
        f"{len(truncated)} truncated"
    ) in text


def test_gate_pass_is_the_same_with_n0(server: FakeOpenAIServer, gsm8k_run: GsmRun) -> None:
    """-n 0: xdist loaded, no worker. (A passing gate under -n 2: test_acceptance.py's
    min_acc_pass, the whole report; each request once under -n 2: test_engine_runs.py.)"""
    chosen = selected(30)
    server.set_script(Script(behaviours={chosen[1]: "wrong", chosen[20]: "unparsed"}))
    args = ["--gsm8k-limit=30", "--gsm8k-min-acc=0.9", "--gsm8k-no-cache"]
    reports = []
    for name, extra in (("plain", []), ("n0", ["-n", "0"])):
        server.reset()
        reports.append(gsm8k_run(*args, report=f"{name}.json", xdist=extra)[1])
        assert completions_sent(server) == 30
    assert reports[0]["accuracy"] == 28 / 30
    assert reports[0]["gates"][0]["passed"] is True
    assert projection(reports[0]) == projection(reports[1])


# -- outcomes, scoring, display -------------------------------------------------------


def test_known_wrong_set_marked_exactly_and_counts_line(
    server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    chosen = selected(40)
    wrong, unparsed, truncated = {chosen[3], chosen[17]}, {chosen[5]}, {chosen[30]}
    behaviours = {i: "wrong" for i in wrong}
    behaviours.update({i: "unparsed" for i in unparsed})
    behaviours.update({i: "truncated" for i in truncated})
    server.set_script(Script(behaviours=behaviours))
    # wrong answers are measurements; no gate, no failure: exit 0
    result, report = gsm8k_run("--gsm8k-limit=40")
    text = output(result)
    assert outcome_map(report, "wrong") == wrong
    assert outcome_map(report, "unparsed") == unparsed
    assert outcome_map(report, "truncated") == truncated
    assert outcome_map(report, "correct") == set(chosen) - wrong - unparsed - truncated
    assert report["accuracy"] == 36 / 40
    assert report["correct"] == 36
    assert report["n"] == 40
    assert report["counts"] == {
        "correct": 36,
        "wrong": 2,
        "unparsed": 1,
        "truncated": 1,
        "error": 0,
    }
    for record in report["problems"]:
        assert set(record) >= {
            "index",
            "id",
            "gold",
            "extracted",
            "correct",
            "outcome",
            "response",
            "usage",
        }
        assert record["usage"]["completion_tokens"] > 0
    assert "36 correct, 2 wrong, 1 unparsed, 1 truncated" in result.outlines[-1]
    assert "outcomes: 36 correct, 2 wrong, 1 unparsed, 1 truncated" in text
    progress = "".join(
        line.split()[1]
        for line in result.outlines
        if line.startswith("gsm8k ") and re.search(r"\[ *\d+%\]$", line)
    )
    assert sorted(progress) == sorted("." * 36 + "ww" + "u" + "t"), progress
    assert f"{HEADLINE}0.9000" in text
    assert "n=40" in text
    assert "FAIL" not in text


def test_flexible_accuracy_reported_beside_strict(
    server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    # A strict pattern nothing matches: strict (gating) 0, flexible still sees the numbers.
    chosen = selected(20)
    server.set_script(Script(behaviours={chosen[0]: "wrong", chosen[1]: "unparsed"}))
    result, report = gsm8k_run("--gsm8k-limit=20", r"--gsm8k-answer-regex=ANSWER=(\d+)")
    assert report["accuracy"] == 0.0
    assert report["rules"]["strict"] == 0.0
    assert report["rules"]["flexible"] == 18 / 20
    assert report["counts"]["unparsed"] == 20
    result.stdout.fnmatch_lines(["*by extractor: strict* 0.0000*flexible 0.9000*"])


def test_answer_regex_replaces_strict_pattern(server: FakeOpenAIServer, gsm8k_run: GsmRun) -> None:
    chosen = selected(10)
    server.set_script(Script(behaviours={chosen[2]: "wrong"}))
    _, report = gsm8k_run("--gsm8k-limit=10", r"--gsm8k-answer-regex=The answer is (-?[\d,.]+)")
    assert report["accuracy"] == 9 / 10
    assert outcome_map(report, "wrong") == {chosen[2]}


def test_train_split_is_not_a_reportable_number(gsm8k_run: GsmRun) -> None:
    result, _ = gsm8k_run("--gsm8k-split=train", "--gsm8k-limit=3", "--co", "-q", report=None)
    ids = collected_ids(result)
    assert len(ids) == 3
    assert all(re.fullmatch(r"gsm8k::test_gsm8k\[train-\d{4}\]", i) for i in ids)
    result, _ = gsm8k_run("--gsm8k-split=train", "--gsm8k-limit=3", ret=None, report=None)
    result.stdout.fnmatch_lines(["gsm8k acc*n=3*train split: not a reportable number*"])


# -- items: ids, --gsm8k-limit, -k, --co, -x, --lf ---------------------------------


def test_limit_subset_is_stable_seeded_and_nested(
    server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    def ids(*extra: str) -> list[str]:
        return collected_ids(gsm8k_run("--co", "-q", *extra, report=None)[0])

    thirty = ids("--gsm8k-limit=30")
    assert len(thirty) == 30
    assert all(re.fullmatch(r"gsm8k::test_gsm8k\[test-\d{4}\]", i) for i in thirty), thirty
    assert thirty == [f"gsm8k::test_gsm8k[test-{i:04d}]" for i in selected(30)]
    assert thirty == ids("--gsm8k-limit=30")  # stable across runs
    assert thirty != [f"gsm8k::test_gsm8k[test-{i:04d}]" for i in range(30)]  # not the first N
    ten = ids("--gsm8k-limit=10")
    assert len(ten) == 10
    assert set(ten) < set(thirty)
    other_seed = ids("--gsm8k-limit=30", "--gsm8k-seed=7")
    assert len(other_seed) == 30
    assert set(other_seed) != set(thirty)
    everything = ids()
    assert len(everything) == 1319
    assert everything[42] == "gsm8k::test_gsm8k[test-0042]"
    assert completions_sent(server) == 0  # --co sends no completion request


def test_keyword_selects_exactly_one_problem(server: FakeOpenAIServer, gsm8k_run: GsmRun) -> None:
    result, report = gsm8k_run("-k", "test-0042")
    assert result.parseoutcomes() == {"correct": 1, "deselected": 1318}
    assert server.stats()["requests_by_index"] == {42: 1}  # nothing else was prefetched
    assert [p["id"] for p in report["problems"]] == ["test-0042"]


def test_exitfirst_after_error_writes_partial_report_then_lf_reruns_it(
    server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    chosen = selected(20)
    broken = chosen[4]
    server.set_script(Script(behaviours={broken: "error500"}))
    args = ["--gsm8k-limit=20", "--gsm8k-max-retries=0"]
    result, report = gsm8k_run(*args, "-x", ret=1)
    text = output(result)
    assert result.parseoutcomes() == {"correct": 4, "errors": 1}
    assert "stopping after 1 failures" in text
    assert report["complete"] is False
    assert report["expected"] == 20
    assert [p["index"] for p in report["problems"]] == chosen[:5]
    assert outcome_map(report, "error") == {broken}
    assert "HTTP 500" in report["problems"][4]["error"]
    assert "Traceback" not in text

    server.reset()
    server.set_script(Script())
    rerun, report = gsm8k_run(*args, "--lf")
    assert rerun.parseoutcomes() == {"correct": 1, "deselected": 19}
    assert server.stats()["requests_by_index"] == {broken: 1}
    assert [p["index"] for p in report["problems"]] == [broken]


# -- ini twins ---------------------------------------------------------------------


def test_ini_twins_and_command_line_wins(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_data: Path, keyed_env: str
) -> None:
    chosen = selected(20)
    server.set_script(Script(behaviours={chosen[0]: "wrong", chosen[1]: "wrong"}))
    pytester.makeini(f"""
        [pytest]
        gsm8k_model = fake-model
        gsm8k_base_url = {server.base_url}
        gsm8k_data = {gsm8k_data}
        gsm8k_limit = 20
        gsm8k_min_acc = 0.95
        gsm8k_report = r.json
    """)
    result = pytester.runpytest(*NO_EXTRA_PLUGINS)
    assert result.ret == 1, output(result)
    report = read_report(pytester)
    assert report["n"] == 20
    assert report["accuracy"] == 0.9
    assert [g["passed"] for g in report["gates"]] == [False]
    assert "--gsm8k-min-acc 0.95" in output(result)

    result = pytester.runpytest(
        *NO_EXTRA_PLUGINS, "--gsm8k-min-acc=0.85", "--gsm8k-report=cli.json"
    )
    assert result.ret == 0, output(result)
    report = read_report(pytester, "cli.json")
    assert report["gates"][0]["passed"] is True
    assert "0.85" in report["gates"][0]["detail"]


# -- fixtures and user tests ----------------------------------------------------------


def test_user_test_is_parametrized_without_model(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_data: Path, keyed_env: str
) -> None:
    pytester.makepyfile(
        test_mine="""
        from decimal import Decimal

        def test_mine(gsm8k_problem):
            assert isinstance(gsm8k_problem.gold, Decimal)
            assert gsm8k_problem.id == f"test-{gsm8k_problem.index:04d}"
    """
    )
    result = pytester.runpytest(
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-limit=7",
        f"--gsm8k-base-url={server.base_url}",
        "-v",
        *NO_EXTRA_PLUGINS,
    )
    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=7)
    text = output(result)
    for index in selected(7):
        assert f"test_mine.py::test_mine[test-{index:04d}] PASSED" in text
    assert "gsm8k::" not in text  # the built-in test needs --gsm8k-model
    assert server.stats()["requests_total"] == 0


def test_builtin_test_not_collected_without_model(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_data: Path, keyed_env: str
) -> None:
    result = pytester.runpytest(
        f"--gsm8k-data={gsm8k_data}",
        f"--gsm8k-base-url={server.base_url}",
        "--gsm8k-min-acc=0.9",
        *NO_EXTRA_PLUGINS,
    )
    # a gate asked for with nothing to measure is a usage error, not "no tests ran" (exit 5)
    assert result.ret == USAGE_ERROR, output(result)
    assert "gsm8k: no model given and no test uses the gsm8k fixtures" in output(result)
    assert "gsm8k acc" not in output(result)
    assert server.stats()["requests_total"] == 0


def test_plugin_can_be_disabled(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("-p", "no:gsm8k", "--gsm8k-model=x")
    assert result.ret == USAGE_ERROR
    assert "unrecognized arguments: --gsm8k-model=x" in output(result)


def test_plain_suite_imports_neither_datasets_nor_openai(
    pytester: pytest.Pytester, server: FakeOpenAIServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
    pytester.makepyfile(
        test_plain="""
        import sys

        def test_plain(pytestconfig):
            assert pytestconfig.pluginmanager.has_plugin("gsm8k")
            heavy = sorted(m for m in ("datasets", "openai", "httpx", "pyarrow")
                           if m in sys.modules)
            assert heavy == [], heavy
    """
    )
    result = pytester.runpytest_subprocess(*NO_EXTRA_PLUGINS)
    assert result.ret == 0, output(result)
    result.assert_outcomes(passed=1)
    assert server.stats()["requests_total"] == 0


@pytest.mark.parametrize("kind", ["sync", "async", "list"])
def test_callable_model_override_is_gated(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_data: Path,
    keyed_env: str,
    kind: str,
) -> None:
    pytester.makeconftest(CALLABLE_CONFTEST.format(data=str(gsm8k_data / "test.jsonl"), kind=kind))
    pytester.makepyfile(
        test_model="""
        def test_model(gsm8k_outcome):
            assert gsm8k_outcome.outcome in ("correct", "wrong")
    """
    )
    chosen = selected(30)
    wrong = {i for i in chosen if i % 3 == 0}
    accuracy = (30 - len(wrong)) / 30
    args = [
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-limit=30",
        "--gsm8k-report=r.json",
        *NO_EXTRA_PLUGINS,
    ]
    result = pytester.runpytest(*args, f"--gsm8k-min-acc={accuracy + 0.001!r}")
    assert result.ret == 1, output(result)
    report = read_report(pytester)
    assert report["accuracy"] == accuracy
    assert report["n"] == 30
    assert outcome_map(report, "wrong") == wrong
    assert f"{HEADLINE}{accuracy:.4f}" in output(result)
    result = pytester.runpytest(*args, f"--gsm8k-min-acc={accuracy!r}")
    assert result.ret == 0, output(result)
    assert server.stats()["requests_total"] == 0  # the callable, not HTTP


def test_report_written_on_keyboard_interrupt(pytester: pytest.Pytester, gsm8k_data: Path) -> None:
    pytester.makeconftest(
        CALLABLE_CONFTEST.format(data=str(gsm8k_data / "test.jsonl"), kind="sync")
    )
    pytester.makepyfile(
        test_model="""
        SEEN = []

        def test_model(gsm8k_outcome):
            SEEN.append(gsm8k_outcome)
            if len(SEEN) == 4:
                raise KeyboardInterrupt
    """
    )
    result = pytester.runpytest_subprocess(
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-limit=10",
        "--gsm8k-report=r.json",
        *NO_EXTRA_PLUGINS,
    )
    assert result.ret == int(pytest.ExitCode.INTERRUPTED), output(result)
    report = read_report(pytester)
    assert report["complete"] is False
    assert report["expected"] == 10
    assert [p["index"] for p in report["problems"]] == selected(10)[:3]


def test_report_written_when_gate_fails(server: FakeOpenAIServer, gsm8k_run: GsmRun) -> None:
    chosen = selected(10)
    server.set_script(Script(behaviours={chosen[0]: "wrong"}))
    result, report = gsm8k_run(
        "--gsm8k-limit=10", "--gsm8k-min-acc=0.95", ret=1, report="out/r.json"
    )
    assert report["complete"] is True
    assert report["accuracy"] == 0.9
    assert report["gates"][0]["passed"] is False
    assert report["gates"][0]["detail"] in output(result)


# -- bad input ----------------------------------------------------------------------

GOOD_ROWS = [json.loads(line) for line in (data_dir() / "test.jsonl").read_text().splitlines()[:3]]


def _jsonl(rows: list[Any]) -> str:
    return "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n"


BAD_INPUTS: dict[str, tuple[dict[str, str], list[str], list[str]]] = {
    # name: (files to write, extra args, needles in the one error line)
    "bad-json-line": (
        {"bad.jsonl": _jsonl([*GOOD_ROWS, '{"question": "x", '])},
        ["--gsm8k-data=bad.jsonl"],
        ["bad.jsonl:4", "not valid JSON"],
    ),
    "row-without-hashes": (
        {
            "nohash.jsonl": _jsonl(
                [GOOD_ROWS[0], {"question": "q", "answer": "it is 4"}, GOOD_ROWS[1]]
            )
        },
        ["--gsm8k-data=nohash.jsonl"],
        ["nohash.jsonl:2", "####"],
    ),
    "answer-not-a-number": (
        {
            "nan.jsonl": _jsonl(
                [GOOD_ROWS[0], GOOD_ROWS[1], {"question": "q", "answer": "so #### many"}]
            )
        },
        ["--gsm8k-data=nan.jsonl"],
        ["nan.jsonl:3", "many"],
    ),
    "missing-question": (
        {"noq.jsonl": _jsonl([{"answer": "#### 4"}])},
        ["--gsm8k-data=noq.jsonl"],
        ["noq.jsonl:1", "question"],
    ),
    "missing-file": ({}, ["--gsm8k-data=missing.jsonl"], ["--gsm8k-data", "missing.jsonl"]),
    "folder-without-test-jsonl": (
        {"folder/train.jsonl": _jsonl(GOOD_ROWS)},
        ["--gsm8k-data=folder"],
        ["--gsm8k-data", "folder", "test.jsonl"],
    ),
    "wrong-row-count": (
        {"short/test.jsonl": _jsonl(GOOD_ROWS)},
        ["--gsm8k-data=short"],
        ["short/test.jsonl", "1319", "has 3"],
    ),
    "min-acc-not-a-number": ({}, ["--gsm8k-min-acc=abc"], ["--gsm8k-min-acc", "abc"]),
    "min-acc-out-of-range": ({}, ["--gsm8k-min-acc=1.5"], ["--gsm8k-min-acc", "1.5"]),
    "bad-protocol": ({}, ["--gsm8k-protocol=best@3"], ["--gsm8k-protocol", "best@3"]),
    "protocol-zero-samples": ({}, ["--gsm8k-protocol=maj@0"], ["--gsm8k-protocol", "maj@0"]),
    "bad-regex": ({}, ["--gsm8k-answer-regex=(#+"], ["--gsm8k-answer-regex"]),
    "unknown-extractor": ({}, ["--gsm8k-extract=nope"], ["--gsm8k-extract", "nope"]),
    "limit-zero": ({}, ["--gsm8k-limit=0"], ["--gsm8k-limit"]),
    "limit-not-int": ({}, ["--gsm8k-limit=ten"], ["--gsm8k-limit", "ten"]),
    "unknown-api": ({}, ["--gsm8k-api=grpc"], ["--gsm8k-api", "grpc"]),
    "unknown-config": ({}, ["--gsm8k-dataset-config=mian"], ["--gsm8k-dataset-config", "mian"]),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_error_before_any_request(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    case: str,
) -> None:
    files, extra, needles = BAD_INPUTS[case]
    for name, content in files.items():
        target = pytester.path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content, encoding="utf-8")
    args = [
        a
        for a in gsm8k_args
        if not (a.startswith("--gsm8k-data=") and any(e.startswith("--gsm8k-data=") for e in extra))
    ]
    result = pytester.runpytest(*args, *extra, "--gsm8k-report=r.json")
    assert_one_line_error(result, server, *needles)
    assert server.stats()["requests_total"] == 0
    assert not (pytester.path / "r.json").exists()


@pytest.mark.parametrize(
    ("line", "needles"),
    [
        ("gsm8k_min_acc = lots", ["ini gsm8k_min_acc", "lots"]),
        ("gsm8k_limit = ten", ["ini gsm8k_limit", "ten"]),
        ("gsm8k_no_cache = maybe", ["ini gsm8k_no_cache", "maybe"]),
    ],
)
def test_bad_ini_value_names_the_option(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    line: str,
    needles: list[str],
) -> None:
    pytester.makeini(f"[pytest]\n{line}\n")
    result = pytester.runpytest(*gsm8k_args)
    assert_one_line_error(result, server, *needles)


def test_bad_data_with_user_test_and_no_model_is_one_line_error(
    pytester: pytest.Pytester, server: FakeOpenAIServer, keyed_env: str
) -> None:
    pytester.makepyfile(test_mine="def test_mine(gsm8k_problem):\n    pass\n")
    (pytester.path / "bad.jsonl").write_text(_jsonl([GOOD_ROWS[0], "{oops"]), encoding="utf-8")
    result = pytester.runpytest("--gsm8k-data=bad.jsonl")
    assert_one_line_error(result, server, "bad.jsonl:2", "not valid JSON")


def test_bad_data_with_user_test_under_xdist_is_one_line_error(
    pytester: pytest.Pytester, server: FakeOpenAIServer, keyed_env: str
) -> None:
    # Under xdist the controller never collects, so the workers report the bad file as a
    # collection error of the module: one line, no INTERNALERROR, nothing sent.
    pytester.makepyfile(test_mine="def test_mine(gsm8k_problem):\n    pass\n")
    (pytester.path / "bad.jsonl").write_text(_jsonl([GOOD_ROWS[0], "{oops"]), encoding="utf-8")
    result = pytester.runpytest("--gsm8k-data=bad.jsonl", "-n", "2")
    text = output(result)
    assert result.ret == pytest.ExitCode.TESTS_FAILED, text
    assert "Traceback" not in text, text
    assert "INTERNALERROR" not in text, text
    lines = [line for line in text.splitlines() if line.startswith("gsm8k: bad.jsonl:2:")]
    assert len(lines) == 1, text
    assert "not valid JSON" in lines[0], text
    assert completions_sent(server) == 0


def test_callable_override_with_builtin_test_needs_no_endpoint(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str
) -> None:
    pytester.makeconftest(
        CALLABLE_CONFTEST.format(data=str(gsm8k_data / "test.jsonl"), kind="sync")
    )
    port = free_closed_port()  # nothing listens: the callable must be all that is asked
    result = pytester.runpytest(
        "--gsm8k-model=my-callable",
        f"--gsm8k-data={gsm8k_data}",
        f"--gsm8k-base-url=http://127.0.0.1:{port}/v1",
        "--gsm8k-limit=6",
        "--gsm8k-report=r.json",
        *NO_EXTRA_PLUGINS,
    )
    assert result.ret == 0, output(result)
    assert read_report(pytester)["n"] == 6


def test_a_conftest_importing_the_plugins_own_fixtures_overrides_nothing(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str
) -> None:
    # Importing the plugin's fixtures by name (to use or re-export them) is not an override:
    # the session-start check of the endpoint still runs and refuses an unreachable one.
    pytester.makeconftest(
        "from pytest_gsm8k.fixtures import gsm8k_model, gsm8k_protocol  # noqa: F401\n"
    )
    port = free_closed_port()
    result = pytester.runpytest(
        "--gsm8k-model=fake-model",
        f"--gsm8k-data={gsm8k_data}",
        f"--gsm8k-base-url=http://127.0.0.1:{port}/v1",
        *NO_EXTRA_PLUGINS,
    )
    text = output(result)
    assert result.ret == USAGE_ERROR, text
    lines = [line for line in text.splitlines() if line.startswith("ERROR: gsm8k:")]
    assert len(lines) == 1, text
    assert "cannot reach" in lines[0], text


# -- endpoint problems ---------------------------------------------------------------


def test_unreachable_endpoint_is_one_message_within_seconds(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str
) -> None:
    port = free_closed_port()
    result = pytester.runpytest(
        "--gsm8k-model=fake-model",
        f"--gsm8k-data={gsm8k_data}",
        f"--gsm8k-base-url=http://127.0.0.1:{port}/v1",
    )
    text = output(result)
    assert result.ret == USAGE_ERROR, text
    lines = [line for line in text.splitlines() if line.startswith("ERROR: gsm8k:")]
    assert len(lines) == 1, text
    assert "cannot reach" in lines[0], text
    assert str(port) in lines[0], text
    assert "Traceback" not in text


def test_wrong_key_is_a_401_message(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MY_KEY", "sk-wrong-OTHER-000")
    result = pytester.runpytest(*gsm8k_args, "--gsm8k-api-key-env=MY_KEY")
    line = assert_one_line_error(result, server, "401", "MY_KEY")
    assert "sk-wrong-OTHER-000" not in output(result)
    assert line.count("\n") == 0


def test_unknown_model_lists_served_models(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    args = [a for a in gsm8k_args if not a.startswith("--gsm8k-model=")]
    result = pytester.runpytest(*args, "--gsm8k-model=gpt-nonexistent")
    assert_one_line_error(result, server, "gpt-nonexistent", "fake-model")


def test_429_and_500_are_retried_and_end_correct(
    server: FakeOpenAIServer, gsm8k_run: GsmRun, fast_retries: None
) -> None:
    chosen = selected(10)
    server.set_script(
        Script(
            fail_first={
                chosen[0]: {"429": 2},
                chosen[1]: {"500": 1},
                chosen[2]: {"429": 1, "500": 1},
            }
        )
    )
    _, report = gsm8k_run("--gsm8k-limit=10")
    assert report["accuracy"] == 1.0
    assert report["n"] == 10
    stats = server.stats()
    assert stats["status_counts"].get(429) == 3
    assert stats["status_counts"].get(500) == 2
    assert stats["requests_by_index"][chosen[0]] == 3
    assert stats["requests_by_index"][chosen[2]] == 3


def test_request_failing_after_retries_is_an_error(
    server: FakeOpenAIServer, gsm8k_run: GsmRun, fast_retries: None
) -> None:
    chosen = selected(10)
    server.set_script(Script(behaviours={chosen[6]: "error500"}))
    result, report = gsm8k_run("--gsm8k-limit=10", "--gsm8k-max-retries=1", ret=1)
    text = output(result)
    assert result.parseoutcomes() == {"correct": 9, "errors": 1}
    assert server.stats()["requests_by_index"][chosen[6]] == 2  # one try plus one retry
    assert outcome_map(report, "error") == {chosen[6]}
    assert report["counts"]["error"] == 1
    assert report["accuracy"] == 0.9
    assert "HTTP 500" in text
    assert "Traceback" not in text
    assert "During handling" not in text  # one message, not the exception chain
    assert "1 error" in result.outlines[-1]


def test_endpoint_dying_mid_run_stops_it_once_within_seconds(
    pytester: pytest.Pytester,
    gsm8k_data: Path,
    keyed_env: str,
) -> None:
    # openai's real backoff (0.5 s, doubling): the breaker must stop the run before the
    # items' retries are used up, so it ends with one message, not one per problem.
    with FakeOpenAIServer(gsm8k_data / "test.jsonl", api_key=TEST_KEY, die_after=5) as dying:
        result = pytester.runpytest(
            "--gsm8k-model=fake-model",
            f"--gsm8k-base-url={dying.base_url}",
            f"--gsm8k-data={gsm8k_data}",
            "--gsm8k-limit=40",
            "--gsm8k-concurrency=2",
            "--gsm8k-report=r.json",
            *NO_EXTRA_PLUGINS,
        )
    text = output(result)
    assert result.ret == 1, text
    assert "Traceback" not in text
    report = read_report(pytester)
    assert report["complete"] is False
    assert 5 <= report["counts"]["correct"] < 40
    errors = [line for line in result.outlines if line.startswith("ERROR gsm8k::")]
    assert len(errors) == 1, errors  # stopped loudly once, not once per remaining problem
    assert "unreachable" in text


# -- the key never leaks --------------------------------------------------------------


def test_api_key_never_in_output_report_junit_or_cache(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    chosen = selected(12)
    server.set_script(
        Script(behaviours={chosen[0]: "error500", chosen[1]: "wrong", chosen[2]: "unparsed"})
    )
    result, _ = gsm8k_run(
        "--gsm8k-limit=12",
        "--gsm8k-max-retries=0",
        "--junitxml=junit.xml",
        "-v",
        "-rA",
        "--showlocals",
        "-l",
        ret=1,
    )
    assert server.stats()["auth_headers"] == [f"Bearer {TEST_KEY}"]  # the key was used
    assert TEST_KEY not in output(result)
    files = [p for p in pytester.path.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"r.json", "junit.xml"} <= names
    cache = pytester.path / ".pytest_cache"
    assert any(p.suffix == ".json" and "gsm8k" in p.parts for p in cache.rglob("*")), names
    for path in files:
        assert TEST_KEY.encode() not in path.read_bytes(), path
        assert b"SECRET-1234567890" not in path.read_bytes(), path


# -- the datasets path (a folder laid out like the hub repository) -----------------


def test_hub_layout_folder_through_the_plugin(
    gsm8k_run: GsmRun, hub_folder: Path, hf_cache: Path
) -> None:
    _, report = gsm8k_run(f"--gsm8k-data={hub_folder}", "--gsm8k-limit=15")
    jsonl = _split()
    assert report["dataset"]["rows"] == 1319
    assert report["dataset"]["fingerprint"] == jsonl.fingerprint
    assert [p["index"] for p in report["problems"]] == selected(15)
    golds = {p.id: format_number(p.gold) for p in jsonl.problems}
    assert all(p["gold"] == golds[p["id"]] for p in report["problems"])
    assert report["accuracy"] == 1.0
