"""Rule 1 of issue 31: a verdict rests on answers this run received.

The cache is written (so a run can be resumed) but not read unless the user asks with
``--gsm8k-resume``; then every output says how many answers came from earlier runs, and the
answers of another run that is still going are never read. Each case here once passed a
bad model: the graded answers were an earlier (or a concurrent) run's, not the build's
under test. The servers' own records of what they were asked are the evidence.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import (
    FAKESERVER,
    NO_CACHEPROVIDER,
    NO_EXTRA_PLUGINS,
    XDIST,
    GsmRun,
    config_serve,
    output,
    output_of,
    read_json,
    report,
    sent,
    spawn_pytest,
    wait_until,
)

NOISE = [*NO_EXTRA_PLUGINS, *NO_CACHEPROVIDER]
REPORT_SCHEMA = json.loads(
    resources.files("pytest_gsm8k").joinpath("schema/report.schema.json").read_text()
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("FAKESERVER_SCRIPT", raising=False)  # in the servers' cache keys


def _first_rows(gsm8k_data: Path, tmp_path: Path, count: int) -> Path:
    rows = (gsm8k_data / "test.jsonl").read_text().splitlines()[:count]
    data = tmp_path / f"first-{count}.jsonl"
    data.write_text("\n".join(rows) + "\n")
    return data


def _serve_line(gsm8k_data: Path, *args: str) -> str:
    """A --gsm8k-serve line that starts the scripted server with ``args``."""
    words = [sys.executable, str(FAKESERVER), "--data", str(gsm8k_data / "test.jsonl")]
    words += ["--port", "{port}", "--model", "fake-model", *args]
    return " ".join(shlex.quote(w) for w in words)


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _wrong_from(first: int, count: int) -> str:
    """A script: problems ``first`` .. ``count - 1`` answered wrong, the rest right."""
    return json.dumps({"behaviours": {str(i): "wrong" for i in range(first, count)}})


@XDIST
def test_rule1_a_rerun_of_a_serve_command_asks_the_rebuilt_server_again(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """Rule 1, case 1: run 1 of a --gsm8k-serve command on a good build hit one transient
    500 (so the run was unfinished); run 2 of the same command on a rebuilt server that is
    30% accurate once graded 39 of run 1's answers from the cache: min-acc PASS, exit 0.
    By default a rerun asks the server again: the rebuilt build's own answers decide."""
    data = _first_rows(gsm8k_data, tmp_path, 40)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"behaviours": {"3": "error500"}}))
    bodies = tmp_path / "bodies.jsonl"
    command = _serve_line(gsm8k_data, "--script", str(script), "--record-file", str(bodies))
    run = [
        f"--gsm8k-serve={command}",
        f"--gsm8k-data={data}",
        "--gsm8k-max-retries=0",
        f"--gsm8k-cache-dir={tmp_path / 'cache'}",
        "--gsm8k-min-acc=0.85",
        *NOISE,
    ]
    first = pytester.runpytest(*run)  # the set-up: plain under -n 2 too
    assert first.ret == 1, output(first)  # one error: the run did not finish
    assert _lines(bodies) == 40
    script.write_text(_wrong_from(12, 40))  # rebuilt: 12 of 40 right
    second = pytester.runpytest(*run, *xdist, "--gsm8k-report=r.json")
    text = output(second)
    assert second.ret == 1, text
    assert _lines(bodies) == 80, "the rerun graded answers it did not ask the new build for"
    assert "answers from cache: 0 of 40" in text
    assert report(pytester)["accuracy"] == 0.3
    assert "gate min-acc: FAIL" in text


@XDIST
def test_rule1_with_resume_every_output_says_how_many_answers_came_from_earlier_runs(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_data: Path,
    gsm8k_args: list[str],
    keyed_env: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    xdist: list[str],
) -> None:
    """Rule 1: reading the cache is the user's choice (--gsm8k-resume, to resume a run of the
    same build); then the terminal summary, each gate line, the JSON report, the Markdown
    step summary, the page and the gates' JUnit test cases say how many answers came from
    earlier runs."""
    server.set_script(Script(behaviours={3: "error500"}))
    data = f"--gsm8k-data={_first_rows(gsm8k_data, tmp_path, 40)}"
    run = [*gsm8k_args, data, "--gsm8k-max-retries=0", "--gsm8k-cache-dir=c"]
    first = pytester.runpytest(*run, "--gsm8k-min-acc=0.85")  # the set-up: plain
    assert first.ret == 1, output(first)
    server.set_script(Script())
    server.reset()
    step = tmp_path / "step.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    second = pytester.runpytest(
        *run,
        *xdist,
        "--gsm8k-min-acc=0.85",
        "--gsm8k-max-error=0",
        "--gsm8k-resume",
        "--gsm8k-report=r.json",
        "--gsm8k-html=page.html",
        "--gsm8k-markdown=summary.md",
        "--junitxml=junit.xml",
    )
    text = output(second)
    assert second.ret == 0, text
    assert sent(server) == 1  # only the problem that errored
    said = "39 of 40 answers from earlier runs (--gsm8k-resume)"
    assert "answers from cache: 39 of 40 (earlier runs, read with --gsm8k-resume)" in text
    gate_lines = [line for line in text.splitlines() if line.startswith("  gate ")]
    assert [line.split(":")[0] for line in gate_lines] == ["  gate min-acc", "  gate max-error"]
    assert all(line.endswith(said) for line in gate_lines), gate_lines
    doc = report(pytester)
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert doc["resumed"] is True
    assert doc["from_cache"] == 39
    assert [g["detail"].endswith(said) for g in doc["gates"]] == [True, True]
    for markdown in (step.read_text(), (pytester.path / "summary.md").read_text()):
        assert markdown.count(said) == 3, markdown  # the outcomes line and each gate's row
    page = (pytester.path / "page.html").read_text()
    assert "answers from cache: 39 of 40 (earlier runs, read with --gsm8k-resume)" in page
    assert page.count(said) >= 2  # each gate's detail
    cases = ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    gates = {c.get("name"): c for c in cases if c.get("classname") == "gsm8k.gates"}
    assert set(gates) == {"min-acc", "max-error"}
    for case in gates.values():
        properties = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert properties == {"answers_from_earlier_runs": "39 of 40"}

    # without --gsm8k-resume nothing is read, and no output speaks of earlier runs (plain:
    # nothing read under -n 2 is case 1 above)
    server.reset()
    third = pytester.runpytest(*run, "--gsm8k-min-acc=0.85", "--gsm8k-report=r.json")
    assert third.ret == 0, output(third)
    assert sent(server) == 40
    assert report(pytester)["resumed"] is False
    assert "earlier runs" not in output(third)


def _crash_after(events: Path, bodies: Path, count: int) -> threading.Thread:
    """SIGKILL the server the events file names once it has received ``count`` requests."""

    def crash() -> None:
        if wait_until(lambda: _lines(bodies) >= count, 60):
            os.kill(int(json.loads(events.read_text().splitlines()[0])["pid"]), signal.SIGKILL)

    thread = threading.Thread(target=crash, daemon=True)
    thread.start()
    return thread


@XDIST
def test_rule1_a_config_rerun_after_a_crash_asks_the_new_build_again(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """Rule 1, case 2: night 1 a config's server crashed mid-run; night 2, the same config
    and command started a 20% build, and 30 of 40 answers came from night 1's cache: PASS.
    By default the config's server is asked for every answer again."""
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "Alpha-1B.yaml").write_text(
        'model_name: "org/Alpha-1B"\naccuracy_threshold: 0.8\nnum_questions: 40\nnum_fewshot: 0\n',
        encoding="utf-8",
    )
    script = tmp_path / "build.json"  # what the build does, outside the command line
    # the 31st question (concurrency 1 asks in order) never gets its answer before the kill:
    # without the hang, a kill that lands late under load let it answer (31 correct, not 30)
    script.write_text(json.dumps({"behaviours": {"30": "hang"}}))
    bodies, events = tmp_path / "bodies.jsonl", tmp_path / "events.jsonl"
    serve = config_serve(
        gsm8k_data,
        *("--script", str(script), "--record-file", str(bodies)),
        *("--events-file", str(events), "--latency", "0.05"),
    )
    run = [
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={serve}",
        f"--gsm8k-data={gsm8k_data}",
        f"--gsm8k-cache-dir={tmp_path / 'cache'}",
        "--gsm8k-concurrency=1",
        "--gsm8k-max-retries=0",
        *NOISE,
    ]
    crash = _crash_after(events, bodies, 31)  # 30 answered, the 31st under way
    night1 = pytester.runpytest(*run, "--gsm8k-report=r.json")  # the set-up: plain
    crash.join()
    assert night1.ret == 1, output(night1)
    assert report(pytester)["configs"][0]["counts"]["correct"] == 30, output(night1)
    script.write_text(_wrong_from(8, 40))  # night 2's build: 8 of 40 right
    night2 = pytester.runpytest(*run, *xdist, "--gsm8k-report=r.json")
    text = output(night2)
    assert night2.ret == 1, text
    assert _lines(bodies) == 31 + 40, "night 2 graded answers night 1's build gave"
    [config] = report(pytester)["configs"]
    assert config["from_cache"] == 0
    assert config["accuracy"] == 0.2
    gate = next(g for g in report(pytester)["gates"] if g["name"] == "Alpha-1B:vllm-threshold")
    assert not gate["passed"], gate


@XDIST
def test_rule1_a_resumed_config_says_its_count_in_each_of_its_gates(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """Rule 1 with --gsm8k-resume and configs: a config's run that errored is resumed, and
    each of its gates (in the terminal, the JSON report and JUnit) says how many of its
    answers came from earlier runs."""
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "Alpha-1B.yaml").write_text(
        'model_name: "org/Alpha-1B"\naccuracy_threshold: 0.8\nnum_questions: 10\nnum_fewshot: 0\n',
        encoding="utf-8",
    )
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"behaviours": {"2": "error500"}}))
    run = [
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={config_serve(gsm8k_data, '--script', str(script))}",
        f"--gsm8k-data={gsm8k_data}",
        f"--gsm8k-cache-dir={tmp_path / 'cache'}",
        "--gsm8k-max-retries=0",
        *NOISE,
    ]
    assert pytester.runpytest(*run).ret == 1  # the set-up: plain under -n 2 too
    script.write_text("{}")
    result = pytester.runpytest(
        *run, *xdist, "--gsm8k-resume", "--gsm8k-report=r.json", "--junitxml=junit.xml"
    )
    text = output(result)
    assert result.ret == 0, text
    said = "9 of 10 answers from earlier runs (--gsm8k-resume)"
    [line] = [line for line in text.splitlines() if "gate Alpha-1B:" in line]
    assert line.startswith("  gate Alpha-1B:vllm-threshold: PASS: "), line
    assert line.endswith(said), line
    doc = report(pytester)
    jsonschema.validate(doc, REPORT_SCHEMA)
    assert doc["resumed"] is True
    assert doc["configs"][0]["from_cache"] == 9
    assert doc["configs"][0]["resumed"] is True
    assert [g["detail"].endswith(said) for g in doc["gates"]] == [True]
    cases = ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    [gate] = [c for c in cases if c.get("classname") == "gsm8k.gates"]
    properties = {p.get("name"): p.get("value") for p in gate.iter("property")}
    assert properties == {"answers_from_earlier_runs": "9 of 10"}


def _entries(cache: Path) -> int:
    return len(list((cache / "responses").glob("*/*.json")))


# -n 2 with --gsm8k-resume only: without it nothing is read, under -n 2 too (case 1 above)
@pytest.mark.parametrize(
    ("xdist", "resume"),
    [([], []), ([], ["--gsm8k-resume"]), (["-n", "2"], ["--gsm8k-resume"])],
    ids=["plain-default", "plain-resume", "xdist-resume"],
)
def test_rule1_two_runs_at_once_never_read_each_others_answers(
    pytester: pytest.Pytester,
    gsm8k_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    xdist: list[str],
    resume: list[str],
) -> None:
    """Rule 1, case 3: two runs of one --gsm8k-serve command at once in one rootdir, a 95%
    server and a 20% one: the 20% run took most of its answers from the other run's cache
    entries and passed. A run never reads the answers of a run that is still going, not
    even with --gsm8k-resume (that run holds a lock on its entries while it goes)."""
    data = _first_rows(gsm8k_data, tmp_path, 100)
    # one command line; what each server does is read from this file as it starts
    script = tmp_path / "script.json"
    good = {"behaviours": {str(i): "wrong" for i in range(5)}, "latency_by_index": {"99": 60}}
    script.write_text(json.dumps(good))
    run = [
        f"--gsm8k-serve={_serve_line(gsm8k_data, '--script', str(script))}",
        f"--gsm8k-data={data}",
        "--gsm8k-min-acc=0.85",
        *NO_EXTRA_PLUGINS,  # pytest's cache plugin on: both runs share the rootdir's cache
    ]
    other = spawn_pytest(
        pytester,
        *run,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    cache = pytester.path / ".pytest_cache" / "d" / "gsm8k"
    try:
        # the 95% run has every answer but the last one (which takes a minute) on disk
        assert wait_until(lambda: _entries(cache) >= 99, 60), "the other run never got going"
        script.write_text(_wrong_from(20, 100))
        result = pytester.runpytest(*run, *resume, *xdist, "--gsm8k-report=r.json")
        assert other.poll() is None, "the other run ended before this one: not at once"
    finally:
        os.killpg(other.pid, signal.SIGKILL)
        other.wait()
    text = output(result)
    assert result.ret == 1, text
    doc = report(pytester)
    assert doc["from_cache"] == 0, text
    assert doc["accuracy"] == 0.2
    assert "gate min-acc: FAIL" in text
    if resume:
        assert text.count("holds answers of another run that is still going") == 1, text


@XDIST
def test_rule1_a_resumed_run_never_reads_a_run_that_started_after_it(
    pytester: pytest.Pytester,
    gsm8k_data: Path,
    tmp_path: Path,
    xdist: list[str],
) -> None:
    """Rule 1, two runs at once, the later one first to end: a slow resumed run of a 0%
    build and, started after it, a fast run of a good build of the same --gsm8k-serve
    command in one rootdir. Once the fast run ended (its lock released), the slow one read
    its answers as "earlier runs" and passed. With --gsm8k-resume a run reads only the
    answers of runs that ended before it started: it asks its own server for every one."""
    data = _first_rows(gsm8k_data, tmp_path, 100)
    script = tmp_path / "script.json"  # read by each server as it starts
    script.write_text(json.dumps({"default": "wrong", "latency": 1.0}))
    run = [
        f"--gsm8k-serve={_serve_line(gsm8k_data, '--script', str(script))}",
        f"--gsm8k-data={data}",
        "--gsm8k-limit=12",
        "--gsm8k-min-acc=0.8",
        *NO_EXTRA_PLUGINS,  # pytest's cache plugin on: both runs share the rootdir's cache
    ]
    slow_args = ["--gsm8k-resume", "--gsm8k-concurrency=1", "--gsm8k-report=slow.json"]
    slow = spawn_pytest(
        pytester,
        *run,
        *xdist,
        *slow_args,
        start_new_session=True,
    )
    cache = pytester.path / ".pytest_cache" / "d" / "gsm8k"
    try:
        # the slow run's server read its script: it has an answer on disk
        assert wait_until(lambda: _entries(cache) >= 1, 60), "the slow run never got going"
        script.write_text(json.dumps({}))
        fast = pytester.runpytest(*run, "--gsm8k-report=fast.json")
        assert fast.ret == 0, output(fast)
        assert slow.poll() is None, "the slow run ended before the fast one: not overlapping"
        text = output_of(slow, 120)
    finally:
        if slow.poll() is None:
            os.killpg(slow.pid, signal.SIGKILL)
        slow.wait()
    assert slow.returncode == 1, text
    doc = report(pytester, "slow.json")
    assert doc["from_cache"] == 0, text
    assert doc["accuracy"] == 0.0, text
    assert "gate min-acc: FAIL" in text


@XDIST
def test_rule1_weights_swapped_behind_the_same_name_and_card_are_caught_by_default(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    """Rule 1, case 4: a URL endpoint whose weights were swapped behind the same served
    name and model card: every answer came from the cache, the baseline gate PASSed with 0
    flips. By default the endpoint is asked again and the flips are found."""
    run = ["--gsm8k-limit=40", "--gsm8k-cache-dir=cache"]
    gsm8k_run(*run, "--snapshot-update", "--gsm8k-report=r.json", report=None, xdist=())
    ids = sorted(p["index"] for p in report(pytester)["problems"])
    server.set_script(Script(behaviours={i: "wrong" for i in ids[:10]}))  # new weights
    server.reset()
    result, _ = gsm8k_run(*run, "--gsm8k-report=r.json", ret=1, report=None)
    text = output(result)
    assert sent(server) == 40
    doc = report(pytester)
    assert doc["from_cache"] == 0
    assert len(doc["baseline"]["newly_failing"]) == 10
    assert "gate baseline: FAIL" in text


def test_rule1_a_crashed_runs_answers_are_resumed(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_data: Path,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    """Rule 1: the lock that keeps a running run's answers from being read goes with its
    process, however it ends: a run killed with SIGKILL leaves answers --gsm8k-resume reads."""
    server.set_script(Script(latency_by_index={39: 60}))
    cache = pytester.path / "cache"
    data = f"--gsm8k-data={_first_rows(gsm8k_data, pytester.path, 40)}"
    run = [*gsm8k_args, data, f"--gsm8k-cache-dir={cache}"]
    proc = spawn_pytest(
        pytester,
        *run,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        assert wait_until(lambda: _entries(cache) >= 39, 60)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    kept = _entries(cache)
    server.set_script(Script())
    server.reset()
    result = pytester.runpytest(*run, "--gsm8k-resume", "--gsm8k-report=r.json")
    assert result.ret == 0, output(result)
    assert read_json(pytester.path / "r.json")["from_cache"] == kept == 39
    assert sent(server) == 1  # the one the killed run was waiting for
