"""--gsm8k-config with --gsm8k-early-stop certain: each config stops once every gate of it
is certain (vLLM's floor, --gsm8k-min-acc and the health gates when asked, its baseline
gate), its items left are skipped with one line, its server stops and the next config's
starts. The verdicts are the full run's, exactly: each test runs the matrix both ways.

The evidence of what was not asked is each config's own fake server: it counts the
completion requests it received in its stop event.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from helpers import NO_CACHEPROVIDER, NO_EXTRA_PLUGINS, XDIST, config_serve, made_once, output

NOISE = [*NO_EXTRA_PLUGINS, *NO_CACHEPROVIDER]
#: the run's concurrency: what a config's engine may fetch ahead of the outcomes back
CONCURRENCY = 2
#: under xdist each worker asks for its next item as soon as it reported the last, and the
#: controller decides on the reports: on a loaded machine the two workers ran up to 8 items
#: past the decision before it reached the config's engine (seen: 6 to 8, 2 cores, 5 busy
#: processes); the plain run's bound is the concurrency alone
WORKER_SLACK = 12

CONFIGS = {
    # every answer wrong: 0.82 of 20 needs 17 correct, out of reach after 4 wrong (of 40:
    # 33, after 8)
    "Broken-1B.yaml": ("0.9", "0.08", '{"default": "wrong"}'),
    # every answer right: 0.5 - 0.1 of 20 needs 8 correct, certain after 8 (of 40: 16)
    "Good-3B.yaml": ("0.5", "0.1", '{"default": "correct"}'),
    # every answer right against a floor of 1.0: open until its last problem
    "Tight-7B.yaml": ("1.0", "0.0", '{"default": "correct"}'),
}


def _configs(
    folder: Path, configs: dict[str, tuple[str, str, str]] = CONFIGS, questions: int = 20
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (threshold, tolerance, script) in configs.items():
        (folder / name).write_text(
            f'model_name: "org/{name.removesuffix(".yaml")}"\n'
            f"accuracy_threshold: {threshold}\n"
            f"tolerance: {tolerance}\n"
            f"num_questions: {questions}\n"
            "num_fewshot: 0\n"
            "env:\n"
            f"  FAKESERVER_SCRIPT: '{script}'\n",
            encoding="utf-8",
        )
    return folder


def _run(
    pytester: pytest.Pytester, folder: Path, data: Path, events: Path, *args: str
) -> pytest.RunResult:
    return pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={config_serve(data, '--events-file', str(events))}",
        f"--gsm8k-data={data}",
        f"--gsm8k-concurrency={CONCURRENCY}",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "-rs",
        *args,
        *NOISE,
    )


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _sent(path: Path) -> dict[str, int]:
    """Completion requests each config's server received, by model (from its stop event)."""
    seen = _events(path)
    models = {e["pid"]: e["model"] for e in seen if e["event"] == "start"}
    return {models[e["pid"]]: e["completions"] for e in seen if e["event"] == "stop"}


def _verdicts(report: dict[str, Any]) -> dict[str, dict[str, bool]]:
    return {
        c["config"]["name"]: {g["name"]: g["passed"] for g in c["gates"]} for c in report["configs"]
    }


def _table(out: str) -> dict[str, list[str]]:
    """The verdict table's rows by config name (the header under "config")."""
    lines = out[out.index("gsm8k vLLM configs:") :].splitlines()[1:]
    rows = {line.split()[0]: re.split(r" {2,}", line.strip()) for line in lines[: len(CONFIGS) + 1]}
    return rows


@XDIST
def test_each_config_stops_once_its_verdict_is_certain_and_the_verdicts_are_the_full_runs(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    folder = _configs(tmp_path / "configs", questions=40)

    def full_run() -> None:  # plain, once per process: test_acceptance has = -n 2
        full_events = tmp_path / "full.jsonl"
        full = _run(pytester, folder, gsm8k_data, full_events)
        assert full.ret == 1, output(full)
        (pytester.path / "r.json").rename(pytester.path / "full.json")
        assert _sent(full_events) == {"org/Broken-1B": 40, "org/Good-3B": 40, "org/Tight-7B": 40}

    made_once("the configs' full run", pytester.path, ["full.json"], full_run)
    full_report = json.loads((pytester.path / "full.json").read_text())

    events = tmp_path / "early.jsonl"
    early = _run(
        pytester,
        folder,
        gsm8k_data,
        events,
        "--gsm8k-early-stop=certain",
        "--gsm8k-html=page.html",
        *xdist,
    )
    out = output(early)
    assert early.ret == 1, out  # the full run's
    report = json.loads((pytester.path / "r.json").read_text())
    # the verdict of every gate of every config is the full run's
    assert (
        _verdicts(report)
        == _verdicts(full_report)
        == {
            "Broken-1B": {"Broken-1B:vllm-threshold": False},
            "Good-3B": {"Good-3B:vllm-threshold": True},
            "Tight-7B": {"Tight-7B:vllm-threshold": True},
        }
    )
    configs = {c["config"]["name"]: c for c in report["configs"]}
    assert configs["Broken-1B"]["early_stop"]["decided_after"] == 8
    assert configs["Good-3B"]["early_stop"]["decided_after"] == 16
    assert configs["Tight-7B"]["early_stop"]["decided_after"] == 40  # open to its last
    assert configs["Tight-7B"]["n"] == 40
    # what each server was asked: the decision, plus what was under way or fetched ahead
    # (the concurrency) and, under xdist, what each worker had asked for already
    sent = _sent(events)
    slack = CONCURRENCY + (WORKER_SLACK if xdist else 0)
    assert 8 <= sent["org/Broken-1B"] <= 8 + slack, sent
    assert 16 <= sent["org/Good-3B"] <= 16 + slack, sent
    assert sent["org/Tight-7B"] == 40
    # servers in sequence, each stopped before the next started, the stopped ones early
    assert [e["event"] for e in _events(events)] == ["start", "stop"] * 3
    # the summary says per config that it stopped and after how many problems
    assert (
        "early stop (certain): stopped after 8 of 40 problems: vllm-threshold verdict FAIL "
        "is certain (at most 0.8000 reachable)" in out
    )
    assert "early stop (certain): stopped after 16 of 40 problems: vllm-threshold verdict" in out
    assert (
        "early stop (certain): not stopped early: its verdicts were open until the last of "
        "its 40 problems" in out
    )
    table = _table(out)
    assert table["config"][-2:] == ["stopped", "verdict"]
    assert table["Broken-1B"][-2:] == ["after 8 of 40", "FAIL"]
    assert table["Good-3B"][-2:] == ["after 16 of 40", "PASS"]
    assert table["Tight-7B"][-2:] == ["-", "PASS"]
    # the page's configs card: each config's floor, and after how many problems it stopped
    page = (pytester.path / "page.html").read_text()
    card = page[page.index("vLLM configs (accuracy") :]
    assert "<th>stopped</th>" in card
    assert "<th>Broken-1B</th><td>org/Broken-1B</td>" in card
    for floor, stopped in (("0.8200", "after 8 of 40"), ("0.4000", "after 16 of 40")):
        assert f"<td>{floor}</td><td>none</td><td>{stopped}</td>" in card
    assert "<td>1.0000</td><td>none</td><td>-</td>" in card
    # the items left are skipped, said in one line per config (pytest folds them)
    short = out[out.index("short test summary info") :]
    skipped = [line for line in short.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 2, short
    assert "not run: config Broken-1B stopped early (--gsm8k-early-stop certain)" in skipped[0]
    assert "not run: config Good-3B stopped early" in skipped[1]
    counts = early.parseoutcomes()
    assert counts["skipped"] == 120 - report["n"]
    assert "Traceback" not in out


def test_sequential_is_refused_with_configs(pytester: pytest.Pytester, tmp_path: Path) -> None:
    folder = _configs(tmp_path / "configs")
    result = pytester.runpytest(f"--gsm8k-config={folder}", "--gsm8k-early-stop=sequential", *NOISE)
    assert result.ret == 4, output(result)
    assert (
        "--gsm8k-early-stop sequential cannot be combined with --gsm8k-config: each config's "
        "verdict is vLLM's exact comparison" in result.stderr.str()
    )
    assert "Traceback" not in output(result)


def test_min_acc_and_a_health_gate_hold_a_config_the_floor_alone_would_stop(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    folder = _configs(tmp_path / "configs", {"Good-3B.yaml": CONFIGS["Good-3B.yaml"]})
    events = tmp_path / "events.jsonl"
    gates = ["--gsm8k-min-acc=0.9", "--gsm8k-max-unparsed=0.1"]
    result = _run(pytester, folder, gsm8k_data, events, "--gsm8k-early-stop=certain", *gates)
    out = output(result)
    assert result.ret == 0, out
    config = json.loads((pytester.path / "r.json").read_text())["configs"][0]
    # the floor is certain after 8; min-acc (18 of 20) and max-unparsed (18 clean) after 18
    early = config["early_stop"]
    assert early["decided_after"] == 18
    assert early["verdicts"] == {
        "min-acc": "PASS",
        "vllm-threshold": "PASS",
        "max-unparsed": "PASS",
    }
    assert {g["name"]: g["passed"] for g in config["gates"]} == {
        "Good-3B:vllm-threshold": True,
        "Good-3B:min-acc": True,
        "Good-3B:max-unparsed": True,
    }
    assert 18 <= _sent(events)["org/Good-3B"] <= 18 + CONCURRENCY


#: the label of the baselines' protocol (both configs 0-shot)
LABEL = "test@1_0-shot_CoT_completions_preset_vllm_extract_last-int"


def test_a_configs_baseline_gate_decides_when_it_stops(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    """Against its own baseline a config stops only once the noise-aware gate is certain too
    (an unchanged config: later than its floor alone), or as soon as it FAILs for certain.
    Plain only: a config's stop under xdist is the test above, the verdict the same step."""
    lenient = ("0.5", "0.1", '{"default": "correct"}')  # the floor: 8 of 20, certain after 8
    folder = _configs(tmp_path / "configs", {"Alpha-1B.yaml": lenient, "Delta-3B.yaml": lenient})
    recorded = _run(pytester, folder, gsm8k_data, tmp_path / "rec.jsonl", "--snapshot-update")
    assert recorded.ret == 0, output(recorded)
    assert (pytester.path / f"__snapshots__/gsm8k/Delta-3B_{LABEL}.gsm8k").exists()
    # Delta's release turns its first 8 problems wrong: its floor still passes (12 of 20)
    _configs(folder, {"Delta-3B.yaml": ("0.5", "0.1", '{"drop": 8}')})
    full = _run(pytester, folder, gsm8k_data, tmp_path / "full.jsonl")
    assert full.ret == 1, output(full)
    full_report = json.loads((pytester.path / "r.json").read_text())

    events = tmp_path / "early.jsonl"
    early_stop, page = "--gsm8k-early-stop=certain", "--gsm8k-html=page.html"
    result = _run(pytester, folder, gsm8k_data, events, early_stop, page)
    out = output(result)
    assert result.ret == 1, out
    report = json.loads((pytester.path / "r.json").read_text())
    assert (
        _verdicts(report)
        == _verdicts(full_report)
        == {
            "Alpha-1B": {"Alpha-1B:vllm-threshold": True, "Alpha-1B:baseline": True},
            "Delta-3B": {"Delta-3B:vllm-threshold": True, "Delta-3B:baseline": False},
        }
    )
    configs = {c["config"]["name"]: c for c in report["configs"]}
    # unchanged: p = 0.5^k falls below 0.01 at 7 newly failing problems, so PASS is certain
    # once at most 6 are left (after 14), whatever the order; the floor alone after 8
    alpha = configs["Alpha-1B"]["early_stop"]
    assert alpha["decided_after"] == 14
    assert alpha["verdicts"] == {"vllm-threshold": "PASS", "baseline": "PASS"}
    # Delta: FAIL is certain with 7 of its 8 wrong problems seen (in order: after 7); its
    # floor, open then, is no FAIL
    delta = configs["Delta-3B"]["early_stop"]
    assert delta["verdicts"] == {"vllm-threshold": None, "baseline": "FAIL"}
    assert delta["decided_after"] == 7
    gates = {g["name"]: g for g in configs["Delta-3B"]["gates"]}
    assert gates["Delta-3B:baseline"]["rule"] == "early-stop"
    assert "baseline verdict FAIL is certain" in gates["Delta-3B:baseline"]["detail"]
    assert gates["Delta-3B:vllm-threshold"]["detail"] == (
        "undecided: the config stopped early on another gate's FAIL"
    )
    # a moot gate was not decided: it never passes, in the JSON, the terminal or the page
    assert gates["Delta-3B:vllm-threshold"]["verdict"] == "UNDECIDED"
    assert "gate Delta-3B:vllm-threshold: UNDECIDED: undecided: the config stopped" in out
    html = (pytester.path / "page.html").read_text(encoding="utf-8")
    assert 'class="badge undecided">UNDECIDED</span></td><th>Delta-3B:vllm-threshold<' in html
    sent = _sent(events)
    assert 14 <= sent["org/Alpha-1B"] <= 14 + CONCURRENCY, sent
    assert 7 <= sent["org/Delta-3B"] <= 7 + CONCURRENCY, sent
    assert "gate Delta-3B:baseline: FAIL: stopped after" in out
    assert "Traceback" not in out


def test_a_config_stopped_early_writes_no_baseline(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    folder = _configs(tmp_path / "configs", {"Good-3B.yaml": CONFIGS["Good-3B.yaml"]})
    result = _run(
        pytester,
        folder,
        gsm8k_data,
        tmp_path / "events.jsonl",
        "--gsm8k-early-stop=certain",
        "--snapshot-update",
    )
    out = output(result)
    assert result.ret == 1, out
    assert (
        f"gate Good-3B:baseline: FAIL: not written to __snapshots__/gsm8k/Good-3B_{LABEL}.gsm8k: "
        "the run stopped early (--gsm8k-early-stop)"
    ) in out
    assert not list(pytester.path.rglob("*.gsm8k"))


def test_repeats_and_the_early_stop_together_stop_a_config_by_its_problems(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    """With --gsm8k-repeats 3 a problem's outcome is its most common answer's: the broken
    config is decided after 4 problems (12 asks), and no ask of a later problem is fetched
    beyond the concurrency."""
    folder = _configs(tmp_path / "configs", {"Broken-1B.yaml": CONFIGS["Broken-1B.yaml"]})
    events = tmp_path / "events.jsonl"
    args = ("--gsm8k-early-stop=certain", "--gsm8k-repeats=3")
    result = _run(pytester, folder, gsm8k_data, events, *args)
    out = output(result)
    assert result.ret == 1, out
    config = json.loads((pytester.path / "r.json").read_text())["configs"][0]
    assert config["early_stop"]["decided_after"] == 4
    assert config["repeats"]["per_problem"] == 3
    assert 12 <= _sent(events)["org/Broken-1B"] <= 12 + CONCURRENCY


@XDIST
def test_items_in_another_order_than_the_configs_never_hang_the_run(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """A later config's items first (``--ff``, a shuffling plugin): the config serving now
    fetches the rest of its own items instead of holding to the early stop's lookahead, which
    left its driver waiting for answers no test would ask for, and the test for the next
    config waiting for a server that never started. The verdicts stay the full run's."""
    configs = {k: CONFIGS[k] for k in ("Broken-1B.yaml", "Good-3B.yaml")}
    folder = _configs(tmp_path / "configs", configs)
    pytester.makeconftest(
        """
        import pytest

        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(items):
            items.reverse()  # the last config's items first
        """
    )
    result = pytester.runpytest_subprocess(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={config_serve(gsm8k_data, '--events-file', str(tmp_path / 'e.jsonl'))}",
        f"--gsm8k-data={gsm8k_data}",
        f"--gsm8k-concurrency={CONCURRENCY}",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "--gsm8k-early-stop=certain",
        *NOISE,
        *xdist,
        timeout=60,
    )
    assert result.ret == 1, output(result)
    report = json.loads((pytester.path / "r.json").read_text())
    assert _verdicts(report) == {
        "Broken-1B": {"Broken-1B:vllm-threshold": False},
        "Good-3B": {"Good-3B:vllm-threshold": True},
    }
