"""--gsm8k-config with baselines: ``--snapshot-update`` records one baseline per config (named
by the config and its protocol), a later run gates each config against its own with the
noise-aware gate beside vLLM's rule, and one config's baseline never gates another.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from helpers import NO_CACHEPROVIDER, NO_EXTRA_PLUGINS, XDIST, config_serve, output

NOISE = [*NO_EXTRA_PLUGINS, *NO_CACHEPROVIDER]
REPORT_SCHEMA = json.loads(
    resources.files("pytest_gsm8k").joinpath("schema/report.schema.json").read_text()
)
#: the label both configs share (same num_fewshot): only the config's name sets them apart
LABEL = "test@1_2-shot_CoT_completions_preset_vllm_extract_last-int"
ALPHA = f"__snapshots__/gsm8k/Alpha-1B_{LABEL}.gsm8k"
DELTA = f"__snapshots__/gsm8k/Delta-3B_{LABEL}.gsm8k"


def _config(model: str, script: str) -> str:
    # vLLM's rule is lenient here (0.5 - 0.1): a drop the baseline gate sees may pass it
    return (
        f'model_name: "org/{model}"\n'
        "accuracy_threshold: 0.5\n"
        "tolerance: 0.1\n"
        "num_questions: 20\n"
        "num_fewshot: 2\n"
        "env:\n"
        f"  FAKESERVER_SCRIPT: '{script}'\n"
    )


def _configs(folder: Path, delta_script: str = '{"default": "correct"}') -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Alpha-1B.yaml").write_text(_config("Alpha-1B", '{"default": "correct"}'), "utf-8")
    (folder / "Delta-3B.yaml").write_text(_config("Delta-3B", delta_script), "utf-8")
    return folder


def _run(
    pytester: pytest.Pytester, folder: Path, data: Path, *args: str, events: Path | None = None
) -> pytest.RunResult:
    extra = ("--events-file", str(events)) if events is not None else ()
    return pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={config_serve(data, *extra)}",
        f"--gsm8k-data={data}",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        *args,
        *NOISE,
    )


def _table(out: str) -> dict[str, list[str]]:
    """The verdict table's rows by config name."""
    lines = out[out.index("gsm8k vLLM configs:") :].splitlines()[2:4]
    return {line.split()[0]: line.split() for line in lines}


@XDIST
def test_each_config_is_gated_against_its_own_baseline(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    folder = _configs(tmp_path / "configs")
    recorded = _run(pytester, folder, gsm8k_data, "--snapshot-update", *xdist)
    out = output(recorded)
    assert recorded.ret == 0, out
    # one file per config, though both configs run one protocol
    for path, model in ((ALPHA, "org/Alpha-1B"), (DELTA, "org/Delta-3B")):
        document = json.loads((pytester.path / path).read_text("utf-8"))
        assert document["config"]["model_name"] == model
        assert len(document["problems"]) == 20
    assert f"baseline written: {ALPHA} (n=20," in out
    assert _table(out)["Delta-3B"][-2:] == ["written", "PASS"]

    # unchanged: each config passes its own baseline gate, the report holds each block
    again = _run(pytester, folder, gsm8k_data, *xdist)
    out = output(again)
    assert again.ret == 0, out
    assert "gate Alpha-1B:baseline: PASS" in out
    assert "gate Delta-3B:baseline: PASS" in out
    assert f"baseline {DELTA}: 1.0000 -> 1.0000 on 20 problems" in out
    assert _table(out)["Alpha-1B"][-2:] == ["PASS", "PASS"]
    report = json.loads((pytester.path / "r.json").read_text("utf-8"))
    jsonschema.validate(report, REPORT_SCHEMA)
    blocks = {c["config"]["name"]: c["baseline"] for c in report["configs"]}
    assert blocks["Delta-3B"]["shared"] == 20
    assert blocks["Delta-3B"]["path"] == DELTA
    assert {g["name"] for g in report["gates"]} >= {"Alpha-1B:baseline", "Delta-3B:baseline"}

    # Delta's server turns 8 of its 20 answers wrong: Delta alone fails its baseline gate,
    # while vLLM's rule (0.6 >= 0.5 - 0.1) still passes it
    _configs(folder, delta_script='{"drop": 8}')
    worse = _run(pytester, folder, gsm8k_data, *xdist)
    out = output(worse)
    assert worse.ret == 1, out
    assert "gate Delta-3B:baseline: FAIL" in out
    assert "gate Delta-3B:vllm-threshold: PASS" in out
    assert "gate Alpha-1B:baseline: PASS" in out
    assert _table(out)["Delta-3B"][-2:] == ["FAIL", "FAIL"]
    assert _table(out)["Alpha-1B"][-2:] == ["PASS", "PASS"]
    assert "gsm8k vLLM configs: 1 of 2 pass (every gate of each config)" in out


def test_one_configs_baseline_never_gates_another(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    folder = _configs(tmp_path / "configs")
    assert _run(pytester, folder, gsm8k_data, "--snapshot-update").ret == 0
    # Alpha's baseline copied over Delta's name: the same protocol, another config
    (pytester.path / DELTA).write_text((pytester.path / ALPHA).read_text("utf-8"), "utf-8")
    result = _run(pytester, folder, gsm8k_data)
    out = output(result)
    assert result.ret == 1, out
    assert (
        f"gate Delta-3B:baseline: FAIL: refused to compare with {DELTA}: config name is "
        "'Delta-3B' here but 'Alpha-1B' in the baseline"
    ) in out
    assert "gate Alpha-1B:baseline: PASS" in out
    assert "Traceback" not in out


def test_a_config_without_a_baseline_is_a_note_or_a_fail_when_required(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    folder = _configs(tmp_path / "configs")
    assert _run(pytester, folder, gsm8k_data, "--snapshot-update").ret == 0
    (pytester.path / DELTA).unlink()
    noted = _run(pytester, folder, gsm8k_data)
    out = output(noted)
    assert noted.ret == 0, out
    assert f"baseline: no baseline at {DELTA}; record one with" in out
    assert "the baselines beside it" not in out  # Alpha's is another config's, not a change
    assert _table(out)["Delta-3B"][-2:] == ["none", "PASS"]
    required = _run(pytester, folder, gsm8k_data, "--gsm8k-require-baseline")
    out = output(required)
    assert required.ret == 1, out
    assert f"gate Delta-3B:baseline: FAIL: no baseline at {DELTA}" in out
    assert "gate Alpha-1B:baseline: PASS" in out


def test_a_narrowed_config_records_its_baseline_only_when_told_it_is_partial(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    folder = _configs(tmp_path / "configs")
    narrowed = ["-k", "Alpha-1B and test-000"]  # Alpha's first 10 of 20, Delta none
    refused = _run(pytester, folder, gsm8k_data, "--snapshot-update", *narrowed)
    out = output(refused)
    assert refused.ret == 1, out
    assert (
        f"gate Alpha-1B:baseline: FAIL: not written to {ALPHA}: 10 of the 20 problems of its "
        "selection were deselected (-k)"
    ) in out
    assert not (pytester.path / ALPHA).exists()
    written = _run(
        pytester, folder, gsm8k_data, "--snapshot-update", "--gsm8k-baseline-partial", *narrowed
    )
    assert written.ret == 0, output(written)
    document = json.loads((pytester.path / ALPHA).read_text("utf-8"))
    assert document["partial"]["reason"].startswith("10 of the 20 problems")
    assert not (pytester.path / DELTA).exists()  # a config that did not run writes nothing


#: a noisy server: about 30% of the problems right with chance 0.5 in every request
NOISY = '{"noisy_rate": 0.3, "noise_seed": 5}'


def _sent(events: Path) -> dict[str, int]:
    """Completion requests each config's server received, by model (its stop event)."""
    seen = [json.loads(line) for line in events.read_text().splitlines() if line]
    models = {e["pid"]: e["model"] for e in seen if e["event"] == "start"}
    return {models[e["pid"]]: e["completions"] for e in seen if e["event"] == "stop"}


@XDIST
def test_calibrated_per_config_baselines_gate_each_config_beyond_its_noise(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """``--snapshot-update --gsm8k-repeats 5`` records each config's 5 runs per problem; a
    later single run gates each config with the noise-aware gate against its own: an
    unchanged config passes though its noisy problems flip, a true drop fails with its
    stable flips listed first."""
    from fakeserver import Script

    from pytest_gsm8k.core import baseline as bl

    folder = tmp_path / "configs"
    folder.mkdir()
    for name in ("Alpha-1B", "Delta-3B"):
        (folder / f"{name}.yaml").write_text(_config(name, NOISY), "utf-8")
    events = tmp_path / "record.jsonl"
    recorded = _run(
        pytester,
        folder,
        gsm8k_data,
        "--snapshot-update",
        "--gsm8k-repeats=5",
        *xdist,
        events=events,
    )
    out = output(recorded)
    assert recorded.ret == 0, out
    # each config's server was asked every problem 5 times, as separate requests
    assert _sent(events) == {"org/Alpha-1B": 100, "org/Delta-3B": 100}
    script = Script.from_json(NOISY)
    noisy = {f"test-{i:04d}" for i in range(20) if script.noisy(i)}
    assert 2 <= len(noisy) <= 12
    for path, name in ((ALPHA, "Alpha-1B"), (DELTA, "Delta-3B")):
        document = bl.loads((pytester.path / path).read_text("utf-8"), path)
        assert document["config"]["name"] == name
        assert document["calibration"]["repeats"] == 5
        problems = document["problems"]
        assert len(problems) == 20
        assert all(e["repeats"] == 5 for e in problems.values())
        seen_noisy = {pid.partition(":")[2] for pid, e in problems.items() if 0 < e["correct"] < 5}
        assert seen_noisy <= noisy  # a stable problem never looks noisy
    report = json.loads((pytester.path / "r.json").read_text("utf-8"))
    for config in report["configs"]:
        assert config["repeats"]["per_problem"] == 5
        assert config["repeats"]["answers"] == 100

    # unchanged, one run per problem: each config passes its calibrated gate
    again = _run(pytester, folder, gsm8k_data, *xdist)
    out = output(again)
    assert again.ret == 0, out
    for name in ("Alpha-1B", "Delta-3B"):
        gate = next(line for line in out.splitlines() if f"gate {name}:baseline:" in line)
        assert "PASS: p=" in gate, out
        assert "(noise-aware, baseline 5 runs per problem)" in gate
    assert "noise: baseline of 5 runs per problem:" in out

    # Delta's release turns 8 stable-correct problems wrong: Delta alone fails, its stable
    # flips listed
    drop = '{"noisy_rate": 0.3, "noise_seed": 5, "drop": 8}'
    (folder / "Delta-3B.yaml").write_text(_config("Delta-3B", drop), "utf-8")
    dropped = sorted(f"Delta-3B:test-{i:04d}" for i in Script.from_json(drop).dropped(20))
    assert len(dropped) == 8
    worse = _run(pytester, folder, gsm8k_data, *xdist)
    out = output(worse)
    assert worse.ret == 1, out
    assert "gate Delta-3B:baseline: FAIL: p=" in out
    assert "8 always-right problems failing now" in out
    assert "gate Alpha-1B:baseline: PASS" in out
    blocks = {
        c["config"]["name"]: c["baseline"]
        for c in json.loads((pytester.path / "r.json").read_text("utf-8"))["configs"]
    }
    assert blocks["Delta-3B"]["stable_flips"] == dropped
    assert blocks["Delta-3B"]["repeats"] == {"baseline": 5, "run": 1}
    assert blocks["Alpha-1B"]["stable_flips"] == []
