"""--gsm8k-config: a folder of vLLM's GSM8K configs run under one pytest, each config's
server (the scripted one, through --gsm8k-serve) started in turn and stopped before the
next, each config gated as vLLM's test gates it: accuracy >= accuracy_threshold - tolerance.
"""

from __future__ import annotations

import json
import os
import re
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers import (
    NO_CACHEPROVIDER,
    NO_EXTRA_PLUGINS,
    VLLM_RECORDING,
    XDIST,
    config_serve,
    output,
    output_of,
    spawn_pytest,
)

NOISE = [*NO_EXTRA_PLUGINS, *NO_CACHEPROVIDER]
REPORT_SCHEMA = json.loads(
    resources.files("pytest_gsm8k").joinpath("schema/report.schema.json").read_text()
)

#: three configs in vLLM's format: the fake server answers per FAKESERVER_SCRIPT (env)
CONFIGS = {
    # 5 of 5 correct: 1.0 >= 0.9 - 0.08
    "Alpha-1B.yaml": """\
model_name: "org/Alpha-1B"
accuracy_threshold: 0.9
num_questions: 5
num_fewshot: 2
server_args: "--enforce-eager --max-model-len 4096"
env:
  FAKESERVER_SCRIPT: '{"default": "correct"}'
""",
    # 3 of 5: 0.6 < 0.75 - 0.08 = 0.67 -> FAIL (default tolerance)
    "Beta-7B-FP8.yaml": """\
model_name: "org/Beta-7B-FP8"
accuracy_threshold: 0.75
num_questions: 5
num_fewshot: 0
server_args: >-
  --enforce-eager
  --speculative-config '{"method":"mtp","num_speculative_tokens":1}'
env:
  VLLM_USE_DEEP_GEMM: "1"
  FAKESERVER_SCRIPT: '{"behaviours": {"1": "wrong", "3": "wrong"}}'
""",
    # 3 of 4: 0.75 >= 0.9 - 0.2 = 0.7 -> PASS only thanks to its tolerance
    "Gamma-3B.yaml": """\
model_name: "org/Gamma-3B"
accuracy_threshold: 0.9
tolerance: 0.2
num_questions: 4
num_fewshot: 1
startup_max_wait_seconds: 60
env:
  FAKESERVER_SCRIPT: '{"behaviours": {"0": "wrong"}}'
""",
}


def _configs(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in CONFIGS.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def _serve(data: Path, events: Path, *extra: str) -> str:
    return config_serve(data, "--events-file", str(events), *extra)


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@XDIST
def test_a_folder_of_vllm_configs_runs_in_sequence_and_gates_each(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """Beside README's ini (a URL and a floor): the run was once refused for a flag never
    passed, and the ini's floor gated every config. The configs' own floors decide (Beta
    fails its own, Alpha and Gamma pass theirs, not the ini's 0.99), and each key set aside
    is named once."""
    pytester.makeini("[pytest]\ngsm8k_base_url = http://127.0.0.1:9/v1\ngsm8k_min_acc = 0.99\n")
    folder = _configs(tmp_path / "configs")
    events = tmp_path / "events.jsonl"
    result = pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={_serve(gsm8k_data, events)}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "--gsm8k-html=page.html",
        "-v",
        *NOISE,
        *xdist,
    )
    out = output(result)
    assert result.ret == 1, out  # Beta fails its floor
    assert "cannot be combined" not in out
    assert out.count("ini gsm8k_base_url set aside: --gsm8k-config runs") == 1, out
    assert out.count("ini gsm8k_min_acc set aside: --gsm8k-config runs") == 1, out
    # items: one group per config, ids carry the config's name
    for item in ("Alpha-1B:test-0004", "Beta-7B-FP8:test-0003", "Gamma-3B:test-0000"):
        assert f"test_gsm8k[{item}]" in out, out
    assert "Gamma-3B:test-0004" not in out  # num_questions 4: the first four only

    # servers: one per config, in file order, each stopped before the next started
    seen = _events(events)
    assert [(e["event"], e["model"] if e["event"] == "start" else "") for e in seen] == [
        ("start", "org/Alpha-1B"),
        ("stop", ""),
        ("start", "org/Beta-7B-FP8"),
        ("stop", ""),
        ("start", "org/Gamma-3B"),
        ("stop", ""),
    ]
    starts = [e for e in seen if e["event"] == "start"]
    assert [e["pid"] for e in seen[1::2]] == [e["pid"] for e in starts]
    assert not [e["pid"] for e in starts if _alive(int(e["pid"]))]
    # vLLM's test's flags after the config's server_args, the config's env
    assert starts[1]["unknown"] == [
        "--enforce-eager",
        "--speculative-config",
        '{"method":"mtp","num_speculative_tokens":1}',
        "--trust-remote-code",
        "--disable-uvicorn-access-log",
        "--seed",
        "0",
    ]
    assert starts[1]["env"]["VLLM_USE_DEEP_GEMM"] == "1"
    assert starts[1]["env"]["VLLM_ENGINE_READY_TIMEOUT_S"] == "1200"
    assert starts[2]["env"]["VLLM_ENGINE_READY_TIMEOUT_S"] == "60"
    assert "VLLM_USE_DEEP_GEMM" not in starts[2]["env"]

    # verdicts: accuracy >= threshold - tolerance, per config
    report = json.loads((pytester.path / "r.json").read_text())
    jsonschema.Draft202012Validator(REPORT_SCHEMA).validate(report)
    verdicts = {
        c["config"]["name"]: (c["correct"], c["n"], [g["passed"] for g in c["gates"]])
        for c in report["configs"]
    }
    assert verdicts == {
        "Alpha-1B": (5, 5, [True]),
        "Beta-7B-FP8": (3, 5, [False]),
        "Gamma-3B": (3, 4, [True]),
    }
    gates = {g["name"]: (g["passed"], g["threshold"]) for g in report["gates"]}
    assert gates == {
        "Alpha-1B:vllm-threshold": (True, 0.9 - 0.08),
        "Beta-7B-FP8:vllm-threshold": (False, 0.75 - 0.08),
        "Gamma-3B:vllm-threshold": (True, 0.9 - 0.2),
    }
    assert report["accuracy"] is None  # no pooled accuracy across models
    assert len(report["problems"]) == 14
    # the page: every config's row in its own card, every problem's question
    page = (pytester.path / "page.html").read_text()
    card = page[page.index("vLLM configs (accuracy") :]
    for name, floor in (("Alpha-1B", "0.8200"), ("Beta-7B-FP8", "0.6700"), ("Gamma-3B", "0.7000")):
        assert f"<th>{name}</th>" in card
        assert f"<td>{floor}</td>" in card
    assert "Beta-7B-FP8:test-0003" in page
    # the terminal: a headline per config, then one verdict table
    assert "gsm8k vLLM configs: 2 of 3 pass" in out
    assert "gate Beta-7B-FP8:vllm-threshold: FAIL: accuracy 0.6000" in out
    table = out[out.index("gsm8k vLLM configs: 2 of 3 pass") :].splitlines()[1:5]
    cells = [re.split(r" {2,}", line.strip()) for line in table]
    assert cells[0] == [
        "config",
        "model",
        "n",
        "accuracy, 95% interval",
        "floor",
        "baseline",
        "verdict",
    ]
    row = ["Beta-7B-FP8", "org/Beta-7B-FP8", "5", "0.6000 [0.2307-0.8824]", "0.6700"]
    assert cells[2] == [*row, "none", "FAIL"]
    # the protocol: in each config's headline above the table (a CI log's width), and the card
    protocol = "test@1, 0-shot CoT, completions, preset vllm, extract last-int"
    assert f"gsm8k acc (Beta-7B-FP8: {protocol}) = 0.6000" in out
    assert f"<td>{protocol}</td>" in card


def test_a_models_list_names_the_configs_in_its_order(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    folder = _configs(tmp_path / "configs")
    (folder / "models-ci.txt").write_text("# CI\nGamma-3B.yaml\nAlpha-1B.yaml\n", "utf-8")
    events = tmp_path / "events.jsonl"
    result = pytester.runpytest(
        f"--gsm8k-config={folder / 'models-ci.txt'}",
        f"--gsm8k-serve={_serve(gsm8k_data, events)}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        *NOISE,
    )
    assert result.ret == 0, output(result)
    models = [e["model"] for e in _events(events) if e["event"] == "start"]
    assert models == ["org/Gamma-3B", "org/Alpha-1B"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gsm8k-limit=3"], "--gsm8k-limit cannot be combined with --gsm8k-config: each"),
        (["--gsm8k-model=x"], "--gsm8k-model cannot be combined with --gsm8k-config"),
        (["--gsm8k-early-stop=sequential"], "--gsm8k-early-stop sequential cannot be combined"),
        (["--gsm8k-baseline-name=x"], "each config's baseline is named by the config"),
        (["--gsm8k-preset=lm-eval"], "every config runs --gsm8k-preset vllm"),
    ],
)
def test_what_a_matrix_cannot_honour_is_one_line(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, args: list[str], message: str
) -> None:
    folder = _configs(tmp_path / "configs")
    result = pytester.runpytest(f"--gsm8k-config={folder}", *args, *NOISE)
    err = result.stderr.str()
    assert result.ret == 4, output(result)
    assert message in err
    assert "Traceback" not in output(result)


def test_a_bad_config_names_its_file_and_line(pytester: pytest.Pytester, tmp_path: Path) -> None:
    folder = _configs(tmp_path / "configs")
    (folder / "Broken.yaml").write_text(CONFIGS["Alpha-1B.yaml"] + "toleranse: 0.1\n", "utf-8")
    result = pytester.runpytest(f"--gsm8k-config={folder}", *NOISE)
    assert result.ret == 4, output(result)
    assert f"{folder / 'Broken.yaml'}:8: toleranse: unknown field" in result.stderr.str()
    assert "Traceback" not in output(result)


@XDIST
def test_a_config_whose_server_cannot_start_fails_alone_and_a_part_run_is_no_verdict(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """A config whose server cannot start fails alone and the next config runs. And vLLM's
    floor holds for a config's first num_questions: with its one wrong question deselected,
    Gamma's 3 of 3 must not PASS (it once did, exit 0). A config selected whole (Alpha)
    keeps its verdict; one deselected whole (Beta) is not gated, and is named."""
    folder = _configs(tmp_path / "configs")
    # sorts between Alpha and Beta; its script is not JSON: the fake server exits at start
    (folder / "Another.yaml").write_text(
        CONFIGS["Alpha-1B.yaml"]
        .replace("Alpha-1B", "Another")
        .replace('\'{"default": "correct"}\'', "'{not json'"),
        "utf-8",
    )
    events = tmp_path / "events.jsonl"
    result = pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={_serve(gsm8k_data, events)}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "-k",
        "Alpha or Another or (Gamma and not test-0000)",
        *NOISE,
        *xdist,
    )
    out = output(result)
    assert result.ret == 1, out
    # none of the run's own (Another's server's, quoted from its log, is indented)
    assert not [line for line in out.splitlines() if line.lstrip() == line and "Traceback" in line]
    assert "INTERNALERROR" not in out
    models = [e["model"] for e in _events(events) if e["event"] == "start"]
    assert models == ["org/Alpha-1B", "org/Gamma-3B"]  # Beta deselected: never started
    report = json.loads((pytester.path / "r.json").read_text())
    configs = {c["config"]["name"]: c for c in report["configs"]}
    assert sorted(configs) == ["Alpha-1B", "Another", "Gamma-3B"]
    assert configs["Another"]["counts"]["error"] == 5
    errors = [p for p in report["problems"] if p["id"].startswith("Another:")]
    assert {p["outcome"] for p in errors} == {"error"}
    # said in full once; the config's other items point to it
    assert sum("exited with exit code 1" in str(p["error"]) for p in errors) == 1
    before_summary = out.split("short test summary info")[0]
    assert before_summary.count("exited with exit code 1 before it was ready") == 1, out
    # said once: the config's other items are errors in its counts, skipped quietly by pytest
    assert out.count("its server failed (its first item says why)") == 0
    outcomes = result.parseoutcomes()
    assert outcomes.get("errors", outcomes.get("error")) == 1
    assert outcomes["skipped"] == 4
    assert "gsm8k vLLM configs: 1 of 3 pass" in out  # Another fails, Gamma is no verdict

    # the part-run config
    gates = {g["name"]: g for g in report["gates"]}
    assert {name: g["passed"] for name, g in gates.items()} == {
        "Alpha-1B:vllm-threshold": True,
        "Another:vllm-threshold": False,
        "Gamma-3B:vllm-threshold": False,
    }
    detail = gates["Gamma-3B:vllm-threshold"]["detail"]
    assert detail.startswith(
        "not a verdict: 1 of the 4 problems of its selection were deselected (-k)"
    ), detail
    assert "accuracy 1.0000" in detail
    assert "n=3" in detail
    assert report["not_run"] == ["Beta-7B-FP8"]  # deselected whole: named, under xdist too
    assert "not run (deselected whole): Beta-7B-FP8" in out, out


@XDIST
def test_a_config_runs_sends_the_bytes_of_vllms_script(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """Each config's requests are --gsm8k-preset vllm's with its num_fewshot over its first
    num_questions problems: the bytes vLLM's gsm8k_eval.py sent (tests/data/vllm_requests.json,
    recorded from the script itself), once each.

    And each config's "serving ..." line stands on its own line: it is written while the
    dots of the previous config are on the current line, and was spliced into them
    (``..gsm8k: config ...``)."""
    recorded = json.loads(VLLM_RECORDING.read_text(encoding="utf-8"))["runs"]
    runs = ("completions", "completions_3shot", "completions_0shot")
    folder = tmp_path / "configs"
    folder.mkdir()
    for run in runs:
        kwargs = recorded[run]["kwargs"]
        (folder / f"{run}.yaml").write_text(
            # 0.5 - 0.08: a floor the all-correct answers pass (one at or below 0 is no verdict)
            f'model_name: "org/{run}"\naccuracy_threshold: 0.5\n'
            f"num_questions: {kwargs['num_questions']}\nnum_fewshot: {kwargs['num_shots']}\n",
            encoding="utf-8",
        )
    raw = tmp_path / "raw.jsonl"
    result = pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={_serve(gsm8k_data, tmp_path / 'events.jsonl', '--raw-file', str(raw))}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        *NOISE,
        *xdist,
    )
    out = output(result)
    assert result.ret == 0, out
    sent = [json.loads(line) for line in raw.read_text().splitlines()]
    expected = [r["raw"] for run in runs for r in recorded[run]["requests"]]
    assert len(sent) == len(expected) == 8 + 3 + 2
    assert sorted(sent) == sorted(expected)
    serving = [line for line in out.splitlines() if ": serving " in line]
    assert len(serving) == 3, out
    assert all(line.startswith("gsm8k: config ") for line in serving), out


def test_our_gates_apply_to_each_config_beside_vllms(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    folder = _configs(tmp_path / "configs")
    result = pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={_serve(gsm8k_data, tmp_path / 'events.jsonl')}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        "--gsm8k-min-acc=0.8",
        "--gsm8k-max-error=0",
        "--gsm8k-report=r.json",
        "-k",
        "Alpha or Gamma",
        *NOISE,
    )
    assert result.ret == 1, output(result)
    report = json.loads((pytester.path / "r.json").read_text())
    gates = {g["name"]: g["passed"] for g in report["gates"]}
    assert gates == {
        "Alpha-1B:vllm-threshold": True,
        "Alpha-1B:min-acc": True,
        "Alpha-1B:max-error": True,
        "Gamma-3B:vllm-threshold": True,  # 0.75 >= 0.9 - 0.2
        "Gamma-3B:min-acc": False,  # 0.75 < 0.8
        "Gamma-3B:max-error": True,
    }
    assert "gsm8k vLLM configs: 1 of 2 pass" in output(result)


@XDIST
def test_a_server_that_dies_mid_config_fails_that_config_and_the_next_runs(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    folder = _configs(tmp_path / "configs")
    alpha = folder / "Alpha-1B.yaml"
    alpha.write_text(alpha.read_text() + '  FAKESERVER_DIE_AFTER: "2"\n', "utf-8")
    events = tmp_path / "events.jsonl"
    result = pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={_serve(gsm8k_data, events)}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        "--gsm8k-concurrency=1",
        "--gsm8k-report=r.json",
        "-k",
        "Alpha or Gamma",
        *NOISE,
        *xdist,
    )
    out = output(result)
    assert result.ret == 1, out
    models = [e["model"] for e in _events(events) if e["event"] == "start"]
    assert models == ["org/Alpha-1B", "org/Gamma-3B"]
    report = json.loads((pytester.path / "r.json").read_text())
    configs = {c["config"]["name"]: c for c in report["configs"]}
    assert configs["Alpha-1B"]["counts"]["correct"] == 2
    assert configs["Alpha-1B"]["counts"]["error"] == 3
    assert configs["Gamma-3B"]["n"] == 4  # the next config ran whole
    assert configs["Gamma-3B"]["counts"]["error"] == 0
    errors = [str(p["error"]) for p in report["problems"] if p["outcome"] == "error"]
    assert sum("its server failed (its first item says why)" in e for e in errors) == 2, errors


def test_a_config_resumes_only_its_unfinished_run_and_only_with_the_same_env(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    """A config's server is the thing under test. A run that errored resumes with
    --gsm8k-resume (the answers it has are kept); a config whose ``env`` changed is
    another server (once, a changed backend variable reran on the old answers and passed);
    a finished run's answers are never reused by the next run."""
    folder = tmp_path / "configs"
    folder.mkdir()
    yaml = folder / "Alpha-1B.yaml"
    text = CONFIGS["Alpha-1B.yaml"]
    yaml.write_text(text.replace('{"default": "correct"}', '{"behaviours": {"2": "error500"}}'))
    bodies = tmp_path / "bodies.jsonl"
    args = [
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={_serve(gsm8k_data, tmp_path / 'e.jsonl', '--record-file', str(bodies))}",
        f"--gsm8k-data={gsm8k_data}",
        f"--gsm8k-cache-dir={tmp_path / 'cache'}",
        "--gsm8k-resume",
        "--gsm8k-max-retries=0",
        *NOISE,
    ]

    def sent() -> int:
        return len(bodies.read_text().splitlines()) if bodies.exists() else 0

    assert pytester.runpytest(*args).ret == 1  # one error: unfinished
    assert sent() == 5
    yaml.write_text(text.replace('{"default": "correct"}', '{"default": "wrong"}'))
    changed = pytester.runpytest(*args)  # another env: nothing of the first run is reused
    assert changed.ret == 1, output(changed)
    assert sent() == 10
    changed.stdout.fnmatch_lines(["*answers from cache: 0 of 5*"])
    again = pytester.runpytest(*args)  # the same env, but that run finished: asked again
    assert again.ret == 1, output(again)
    assert sent() == 15


def test_a_configs_request_timeout_is_not_a_stall(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    """vLLM's test waits request_timeout_seconds for an answer; a slow config (8-shot on
    CPU) must not be cut by the shorter --gsm8k-stall-timeout (once a spurious FAIL)."""
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "Alpha-1B.yaml").write_text(
        CONFIGS["Alpha-1B.yaml"] + "request_timeout_seconds: 30\n", encoding="utf-8"
    )
    result = pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={_serve(gsm8k_data, tmp_path / 'e.jsonl', '--latency', '1.5')}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        "--gsm8k-stall-timeout=0.5",
        *NOISE,
    )
    out = output(result)
    assert result.ret == 0, out
    assert "no answer from" not in out


def test_a_config_deselected_whole_is_named_as_not_run(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    """A config deselected whole gates nothing (by design), but the log said "1 of 1 pass"
    and named the others nowhere (the hostile review): the headline names them as not run.
    (-k under xdist: the run where a config's server cannot start, which deselects Beta
    whole too.)"""
    folder = _configs(tmp_path / "configs")
    result = pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={_serve(gsm8k_data, tmp_path / 'events.jsonl')}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "-k",
        "Alpha",
        *NOISE,
    )
    out = output(result)
    assert result.ret == 0, out
    assert (
        "gsm8k vLLM configs: 1 of 1 pass (accuracy >= accuracy_threshold - tolerance each); "
        "not run (deselected whole): Beta-7B-FP8, Gamma-3B"
    ) in out, out
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["not_run"] == ["Beta-7B-FP8", "Gamma-3B"]
    jsonschema.validate(report, REPORT_SCHEMA)


#: a conftest that hands on the plugin's own protocol (to add a marker, say): in a matrix each
#: config's protocol is asked, whatever the fixture gives
PROTOCOL_HANDED_ON = """
import pytest

@pytest.fixture(scope="session")
def gsm8k_protocol(gsm8k_protocol):
    return gsm8k_protocol
"""


@XDIST
def test_a_conftest_gsm8k_protocol_does_not_leave_the_workers_waiting_on_the_configs(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """A conftest's ``gsm8k_protocol`` makes a worker offer its plan without a fetch; in a
    matrix its items still read the configs' answers from the controller, which then never
    fetched them: each worker waited out its whole bound (timeout x tries + 120 s, half an
    hour by default) before an error, where the plain run passes. The first item that asks
    has the controller fetch the plan, as for the plugin's own client handed on."""
    pytester.makeconftest(PROTOCOL_HANDED_ON)
    folder = _configs(tmp_path / "configs")
    proc = spawn_pytest(
        pytester,
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={_serve(gsm8k_data, tmp_path / 'events.jsonl')}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        *NOISE,
        *xdist,
    )
    out = output_of(proc, 90)  # ~10 s; the workers' bound is 2,000 s
    assert proc.returncode == 1, out  # Beta fails its floor, as in the run without the conftest
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["counts"]["error"] == 0, out
    assert report["n"] == 14, out
