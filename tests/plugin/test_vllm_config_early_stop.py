"""--gsm8k-config with --gsm8k-early-stop certain: each config stops once every gate of it
is certain (vLLM's floor, --gsm8k-min-acc and the health gates when asked, its baseline
gate), its items left are skipped with one line, its server stops and the next config's
starts. The verdicts are the full run's, exactly: each test runs the matrix both ways.

The evidence of what was not asked is each config's own fake server: it counts the
completion requests it received in its stop event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import NO_CACHEPROVIDER, NO_EXTRA_PLUGINS, XDIST, config_serve, output

NOISE = [*NO_EXTRA_PLUGINS, *NO_CACHEPROVIDER]
#: the run's concurrency: what a config's engine may fetch ahead of the outcomes back
CONCURRENCY = 2

CONFIGS = {
    # every answer wrong: 0.82 of 20 needs 17 correct, out of reach after 4 wrong
    "Broken-1B.yaml": ("0.9", "0.08", '{"default": "wrong"}'),
    # every answer right: 0.5 - 0.1 of 20 needs 8 correct, certain after 8
    "Good-3B.yaml": ("0.5", "0.1", '{"default": "correct"}'),
    # every answer right against a floor of 1.0: open until its last problem
    "Tight-7B.yaml": ("1.0", "0.0", '{"default": "correct"}'),
}


def _configs(folder: Path, configs: dict[str, tuple[str, str, str]] = CONFIGS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, (threshold, tolerance, script) in configs.items():
        (folder / name).write_text(
            f'model_name: "org/{name.removesuffix(".yaml")}"\n'
            f"accuracy_threshold: {threshold}\n"
            f"tolerance: {tolerance}\n"
            "num_questions: 20\n"
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
    rows = {line.split()[0]: line.split() for line in lines[: len(CONFIGS) + 1]}
    return rows


@XDIST
def test_each_config_stops_once_its_verdict_is_certain_and_the_verdicts_are_the_full_runs(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    folder = _configs(tmp_path / "configs")
    full_events = tmp_path / "full.jsonl"
    full = _run(pytester, folder, gsm8k_data, full_events, *xdist)
    assert full.ret == 1, output(full)
    full_report = json.loads((pytester.path / "r.json").read_text())
    assert _sent(full_events) == {"org/Broken-1B": 20, "org/Good-3B": 20, "org/Tight-7B": 20}

    events = tmp_path / "early.jsonl"
    early = _run(pytester, folder, gsm8k_data, events, "--gsm8k-early-stop=certain", *xdist)
    out = output(early)
    assert early.ret == full.ret, out
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
    assert configs["Broken-1B"]["early_stop"]["decided_after"] == 4
    assert configs["Good-3B"]["early_stop"]["decided_after"] == 8
    assert configs["Tight-7B"]["early_stop"]["decided_after"] == 20  # open to its last
    assert configs["Tight-7B"]["n"] == 20
    # what each server was asked: the decision, plus what was under way or fetched ahead
    # (the concurrency) and, under xdist, what each worker had asked for already
    sent = _sent(events)
    slack = CONCURRENCY + (2 if xdist else 0)
    assert 4 <= sent["org/Broken-1B"] <= 4 + slack, sent
    assert 8 <= sent["org/Good-3B"] <= 8 + slack, sent
    assert sent["org/Tight-7B"] == 20
    # servers in sequence, each stopped before the next started, the stopped ones early
    assert [e["event"] for e in _events(events)] == ["start", "stop"] * 3
    # the summary says per config that it stopped and after how many problems
    assert (
        "early stop (certain): stopped after 4 of 20 problems: vllm-threshold verdict FAIL "
        "is certain (at most 0.8000 reachable)" in out
    )
    assert "early stop (certain): stopped after 8 of 20 problems: vllm-threshold verdict" in out
    assert (
        "early stop (certain): not stopped early: its verdicts were open until the last of "
        "its 20 problems" in out
    )
    table = _table(out)
    assert table["config"][-2:] == ["stopped", "verdict"]
    assert table["Broken-1B"][-2:] == ["4/20", "FAIL"]
    assert table["Good-3B"][-2:] == ["8/20", "PASS"]
    assert table["Tight-7B"][-2:] == ["-", "PASS"]
    # the items left are skipped, said in one line per config (pytest folds them)
    short = out[out.index("short test summary info") :]
    skipped = [line for line in short.splitlines() if line.startswith("SKIPPED")]
    assert len(skipped) == 2, short
    assert "not run: config Broken-1B stopped early (--gsm8k-early-stop certain)" in skipped[0]
    assert "not run: config Good-3B stopped early" in skipped[1]
    counts = early.parseoutcomes()
    assert counts["skipped"] == 60 - report["n"]
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
