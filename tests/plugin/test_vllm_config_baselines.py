"""--gsm8k-config with baselines: ``--snapshot-update`` records one baseline per config (named
by the config and its protocol), a later run gates each config against its own with the
noise-aware gate beside vLLM's rule, and one config's baseline never gates another. The page
and the Markdown summary show each config's comparison and its changed problems.
"""

from __future__ import annotations

import json
import re
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from browser import NEEDS_CHROMIUM, Browser
from helpers import NO_CACHEPROVIDER, NO_EXTRA_PLUGINS, config_serve, made_once, output

from pytest_gsm8k.runtime.data import load_split

NOISE = [*NO_EXTRA_PLUGINS, *NO_CACHEPROVIDER]
REPORT_SCHEMA = json.loads(
    resources.files("pytest_gsm8k").joinpath("schema/report.schema.json").read_text()
)
#: the label both configs share (same num_fewshot): only the config's name sets them apart
LABEL = "test@1_2-shot_CoT_completions_preset_vllm_extract_last-int"
ALPHA = f"__snapshots__/gsm8k/Alpha-1B_{LABEL}.gsm8k"
DELTA = f"__snapshots__/gsm8k/Delta-3B_{LABEL}.gsm8k"


def _config(model: str, script: str, questions: int = 20, shots: int = 2) -> str:
    # vLLM's rule is lenient here (0.5 - 0.1): a drop the baseline gate sees may pass it
    return (
        f'model_name: "org/{model}"\n'
        "accuracy_threshold: 0.5\n"
        "tolerance: 0.1\n"
        f"num_questions: {questions}\n"
        f"num_fewshot: {shots}\n"
        "env:\n"
        f"  FAKESERVER_SCRIPT: '{script}'\n"
    )


def _configs(
    folder: Path, delta_script: str = '{"default": "correct"}', delta_shots: int = 2
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Alpha-1B.yaml").write_text(_config("Alpha-1B", '{"default": "correct"}'), "utf-8")
    delta = _config("Delta-3B", delta_script, shots=delta_shots)
    (folder / "Delta-3B.yaml").write_text(delta, "utf-8")
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


def _recorded(pytester: pytest.Pytester, folder: Path, data: Path) -> None:
    """Both configs' baselines as ``--snapshot-update`` records them on ``_configs``' defaults
    (recorded once per process: the tests that start from them read only the files)."""

    def record() -> None:
        assert _run(pytester, folder, data, "--snapshot-update").ret == 0

    made_once("configs' baselines", pytester.path, [ALPHA, DELTA], record)


def _table(out: str) -> dict[str, list[str]]:
    """The verdict table's rows by config name (cells apart by two spaces or more)."""
    lines = out[out.index("gsm8k vLLM configs:") :].splitlines()[2:4]
    return {line.split()[0]: re.split(r" {2,}", line.strip()) for line in lines}


def test_each_config_is_gated_against_its_own_baseline(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    folder = _configs(tmp_path / "configs")
    recorded = _run(pytester, folder, gsm8k_data, "--snapshot-update")
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
    again = _run(pytester, folder, gsm8k_data)
    out = output(again)
    assert again.ret == 0, out
    assert "gate Alpha-1B:baseline: PASS" in out
    assert "gate Delta-3B:baseline: PASS" in out
    assert f"  baseline {DELTA}:\n    accuracy: 1.0000 -> 1.0000 on 20 problems" in out
    assert _table(out)["Alpha-1B"][-2:] == ["PASS 1.0000 -> 1.0000", "PASS"]
    report = json.loads((pytester.path / "r.json").read_text("utf-8"))
    jsonschema.validate(report, REPORT_SCHEMA)
    blocks = {c["config"]["name"]: c["baseline"] for c in report["configs"]}
    assert blocks["Delta-3B"]["shared"] == 20
    assert blocks["Delta-3B"]["path"] == DELTA
    assert {g["name"] for g in report["gates"]} >= {"Alpha-1B:baseline", "Delta-3B:baseline"}

    # Delta's server turns 8 of its 20 answers wrong: Delta alone fails its baseline gate,
    # while vLLM's rule (0.6 >= 0.5 - 0.1) still passes it
    _configs(folder, delta_script='{"drop": 8}')
    worse = _run(pytester, folder, gsm8k_data)
    out = output(worse)
    assert worse.ret == 1, out
    assert "gate Delta-3B:baseline: FAIL" in out
    assert "gate Delta-3B:vllm-threshold: PASS" in out
    assert "gate Alpha-1B:baseline: PASS" in out
    assert _table(out)["Delta-3B"][-2:] == ["FAIL 1.0000 -> 0.6000", "FAIL"]
    assert _table(out)["Alpha-1B"][-2:] == ["PASS 1.0000 -> 1.0000", "PASS"]
    assert "gsm8k vLLM configs: 1 of 2 pass (every gate of each config)" in out


def test_one_configs_baseline_never_gates_another(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    folder = _configs(tmp_path / "configs")
    _recorded(pytester, folder, gsm8k_data)
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
    _recorded(pytester, folder, gsm8k_data)
    (pytester.path / DELTA).unlink()
    noted = _run(pytester, folder, gsm8k_data)
    out = output(noted)
    assert noted.ret == 0, out
    assert f"baseline: no baseline at {DELTA}; record one with" in out
    assert "another protocol" not in out  # Alpha's is another config's, not a change
    assert _table(out)["Delta-3B"][-2:] == ["none", "PASS"]
    required = _run(pytester, folder, gsm8k_data, "--gsm8k-require-baseline")
    out = output(required)
    assert required.ret == 1, out
    assert f"gate Delta-3B:baseline: FAIL: no baseline at {DELTA}" in out
    assert "gate Alpha-1B:baseline: PASS" in out


def test_a_configs_protocol_change_fails_its_gate_naming_its_baseline(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    """Rule, per config: a config whose protocol changed (its num_fewshot) has no baseline
    under its new label, and its baseline of the old protocol beside it fails its gate,
    named with the field that differs; the other config still passes its own (issue 34.2)."""
    folder = _configs(tmp_path / "configs")
    _recorded(pytester, folder, gsm8k_data)
    _configs(folder, delta_shots=3)
    changed = _run(pytester, folder, gsm8k_data)
    out = output(changed)
    assert changed.ret == 1, out
    moved = DELTA.replace("2-shot", "3-shot")
    assert (
        f"gate Delta-3B:baseline: FAIL: no baseline of this protocol at {moved}, but one of "
        f"another protocol on the same data: {DELTA} (protocol shots is 3 here but 2 there); "
        "record this protocol's with: pytest <same options> --snapshot-update"
    ) in out
    assert "gate Alpha-1B:baseline: PASS" in out
    assert _table(out)["Delta-3B"][-2:] == ["FAIL", "FAIL"]


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


def test_calibrated_per_config_baselines_gate_each_config_beyond_its_noise(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
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
    again = _run(pytester, folder, gsm8k_data)
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
    worse = _run(pytester, folder, gsm8k_data)
    out = output(worse)
    assert worse.ret == 1, out
    assert "gate Delta-3B:baseline: FAIL: p=" in out
    assert "newly failing: 8 stable (right in all" in out
    assert "gate Alpha-1B:baseline: PASS" in out
    blocks = {
        c["config"]["name"]: c["baseline"]
        for c in json.loads((pytester.path / "r.json").read_text("utf-8"))["configs"]
    }
    assert blocks["Delta-3B"]["stable_flips"] == dropped
    assert blocks["Delta-3B"]["repeats"] == {"baseline": 5, "run": 1}
    assert blocks["Alpha-1B"]["stable_flips"] == []


def _regressed_matrix(pytester: pytest.Pytester, data: Path, folder: Path) -> pytest.RunResult:
    """Baselines recorded for Alpha (test-0003 wrong then) and Delta (60 problems, all right);
    then Alpha answers all 20 (one newly passing), Delta turns 55 of its 60 wrong, and
    Gamma, a config added since, has no baseline. The run writes page.html and summary.md."""
    folder.mkdir(parents=True)

    def write(name: str, script: str, questions: int = 20) -> None:
        (folder / f"{name}.yaml").write_text(_config(name, script, questions), "utf-8")

    write("Alpha-1B", '{"behaviours": {"3": "wrong"}}')
    write("Delta-3B", '{"default": "correct"}', 60)
    recorded = _run(pytester, folder, data, "--snapshot-update")
    assert recorded.ret == 0, output(recorded)
    write("Alpha-1B", '{"default": "correct"}')
    write("Delta-3B", '{"drop": 55}', 60)
    write("Gamma-7B", '{"default": "correct"}')
    outputs = ("--gsm8k-html=page.html", "--gsm8k-markdown=summary.md")
    return _run(pytester, folder, data, *outputs)


def _embedded(page: str) -> dict[str, Any]:
    found = re.search(r'<script type="application/json" id="gsm8k-data">(.*?)</script>', page)
    assert found, "the page holds no data block"
    return dict(json.loads(found.group(1)))


def _ids(config: str, indexes: range | list[int]) -> list[str]:
    return [f"{config}:test-{i:04d}" for i in indexes]


def test_the_page_and_the_markdown_show_each_configs_comparison(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    result = _regressed_matrix(pytester, gsm8k_data, tmp_path / "configs")
    out = output(result)
    assert result.ret == 1, out
    assert "gate Delta-3B:baseline: FAIL" in out
    assert "gate Alpha-1B:baseline: PASS" in out
    page = (pytester.path / "page.html").read_text("utf-8")

    # one card per compared config: the gate's verdict and rule, the accuracy before and now
    assert 'Delta-3B: against its baseline <span class="badge fail">FAIL</span>' in page
    assert 'Alpha-1B: against its baseline <span class="badge pass">PASS</span>' in page
    assert "Gamma-7B: against its baseline" not in page
    assert "<dt>gate</dt><dd>noise-aware: p=" in page
    assert "&lt; --gsm8k-alpha 0.01 (exact McNemar): 55 newly failing, " in page
    assert "1.0000 -&gt; 0.0833 on 60 problems" in page
    assert "0.9500 -&gt; 1.0000 on 20 problems" in page
    # single-run baselines: newly failing and passing, never "stable" (issue 32, point 5)
    assert "55 newly failing, 0 newly passing" in page
    assert "stable (right in" not in page
    # the configs card: each config's baseline column, as the terminal's table says it
    assert "<td>FAIL 1.0000 -&gt; 0.0833</td>" in page
    assert "<td>PASS 0.9500 -&gt; 1.0000</td>" in page
    assert "<td>none</td>" in page  # Gamma
    assert 'newly failing (55)</option><option value="passing">newly passing (1)' in page
    assert '<select id="f-config">' in page

    # the problems: Delta's newly failing first, Alpha's newly passing, then the unchanged,
    # config by config, and Gamma's (no baseline) last
    rows = _embedded(page)["problems"]
    assert [r["id"] for r in rows] == [
        *_ids("Delta-3B", range(55)),
        "Alpha-1B:test-0003",
        *_ids("Alpha-1B", [i for i in range(20) if i != 3]),
        *_ids("Delta-3B", range(55, 60)),
        *_ids("Gamma-7B", range(20)),
    ]
    by_id = {r["id"]: r for r in rows}
    assert [by_id[i]["ch"] for i in ("Delta-3B:test-0000", "Alpha-1B:test-0003")] == [
        "failing",
        "passing",
    ]
    assert {by_id[i]["ch"] for i in _ids("Gamma-7B", range(20))} == {"none"}
    assert {by_id[i]["ch"] for i in _ids("Delta-3B", range(55, 60))} == {""}
    # the baseline's own outcome, read from the config's file (the flips alone would say
    # "not correct"); none for a config without a baseline
    assert by_id["Alpha-1B:test-0003"]["b"] == "wrong"
    assert by_id["Delta-3B:test-0000"]["b"] == "correct"
    assert by_id["Gamma-7B:test-0000"]["b"] is None
    assert by_id["Delta-3B:test-0000"]["c"] == "Delta-3B"

    # the Markdown: each config's newly failing problems, bounded like a single run's list
    markdown = (pytester.path / "summary.md").read_text("utf-8")
    assert markdown.startswith("### gsm8k vLLM configs: 2 of 3 pass")
    title = "**Delta-3B: newly failing (55):**"
    assert title in markdown
    listed = markdown[markdown.index(title) :].split("\n\n")[1].splitlines()
    question = " ".join(load_split(None, "test", "main").problems[0].question.split())[:40]
    assert listed[0].startswith(f"- `Delta-3B:test-0000`: {question}")
    assert len(listed) == 51
    assert listed[-1] == "- ... and 5 more (see the JSON report)"
    assert "Delta-3B: newly failing, noisy" not in markdown  # no noisy problem fails
    assert "Alpha-1B: newly failing" not in markdown
    assert "Gamma-7B: newly failing" not in markdown
    # each config's accuracy before and now with their intervals, as its report block says
    # (issue 34, point 8); Gamma has no baseline: no comparison
    blocks = {
        c["config"]["name"]: c["baseline"]
        for c in json.loads((pytester.path / "r.json").read_text("utf-8"))["configs"]
        if "baseline" in c
    }
    for name, before, now in (("Delta-3B", "1.0000", "0.0833"), ("Alpha-1B", "0.9500", "1.0000")):
        section = markdown[markdown.index(f"**{name}: against its baseline** `__snapshots__/") :]
        (low, high), (c_low, c_high) = blocks[name]["baseline_ci95"], blocks[name]["current_ci95"]
        assert f"- accuracy: {before} -\\> {now} on " in section
        assert (
            f"- 95% CI: baseline {low:.4f}-{high:.4f}, this run {c_low:.4f}-{c_high:.4f}" in section
        )
    assert "Delta-3B: against its baseline** `__snapshots__/gsm8k/Delta-3B_" in markdown
    assert "55 newly failing, 0 newly passing; p=" in markdown
    assert "**Alpha-1B: newly passing (1):**\n\n- `Alpha-1B:test-0003`: " in markdown
    assert "Gamma-7B: against its baseline" not in markdown


@NEEDS_CHROMIUM
def test_the_matrix_page_in_chromium(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, browser: Browser
) -> None:
    result = _regressed_matrix(pytester, gsm8k_data, tmp_path / "configs")
    assert result.ret == 1, output(result)
    browser.open((pytester.path / "page.html").as_uri())
    assert browser.evaluate("document.documentElement.dataset.ready") == "100"
    groups = "[...document.querySelectorAll('#rows > h3')].filter(e => !e.hidden)"
    assert browser.evaluate(f"{groups}.map(e => e.textContent)") == [
        "Newly failing: Delta-3B (55)",
        "Newly passing: Alpha-1B (1)",
        "Unchanged: Alpha-1B (19)",
        "Unchanged: Delta-3B (5)",
        "No baseline: Gamma-7B (20)",
    ]
    # one config's rows alone, then its newly failing ones
    browser.evaluate(
        "(() => { const e = document.getElementById('f-config'); e.value = 'Alpha-1B'; "
        "e.dispatchEvent(new Event('change')); })()"
    )
    assert browser.evaluate("document.getElementById('f-count').textContent") == "20 of 100 shown"
    assert browser.evaluate(f"{groups}.length") == 2
    browser.evaluate(
        "(() => { const e = document.getElementById('f-change'); e.value = 'passing'; "
        "e.dispatchEvent(new Event('change')); })()"
    )
    shown = "[...document.querySelectorAll('#rows > details')].filter(e => !e.hidden)"
    assert browser.evaluate(f"{shown}.map(e => e.id)") == ["p-Alpha-1B:test-0003"]
    row = "document.getElementById('p-Alpha-1B:test-0003')"
    browser.evaluate(f"{row}.open = true")
    browser.evaluate("new Promise(r => setTimeout(r, 50))")
    text = browser.evaluate(f"{row}.textContent")
    assert "baseline: wrong" in text
    assert "newly passing" in text
    # a config with no baseline says nothing of one
    gamma = "document.getElementById('p-Gamma-7B:test-0000')"
    browser.evaluate(f"{gamma}.open = true")
    browser.evaluate("new Promise(r => setTimeout(r, 50))")
    assert "baseline" not in browser.evaluate(f"{gamma}.textContent")
    assert browser.errors() == []


def test_configs_whose_baseline_files_would_clash_are_refused_before_any_request(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    """Rule: two configs never share one baseline file. ``a b``, ``a\\nb`` and ``a_b`` all
    name ``a_b_<protocol>.gsm8k``: --snapshot-update said "baseline written" three times
    and kept one. Refused in one line naming the configs and the file, no server started."""
    folder = tmp_path / "configs"
    folder.mkdir()
    for name in ("a b", "a_b"):
        (folder / f"{name}.yaml").write_text(_config("Alpha-1B", '{"default": "correct"}'), "utf-8")
    events = tmp_path / "events.jsonl"
    result = _run(pytester, folder, gsm8k_data, "--snapshot-update", events=events)
    out = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    lines = [line for line in out.splitlines() if "one baseline file" in line]
    assert len(lines) == 1, out
    head = "ERROR: gsm8k: --gsm8k-config: configs 'a b' and 'a_b' would share"
    assert lines[0].startswith(head), out
    assert f"a_b_{LABEL}.gsm8k" in lines[0], out
    assert "baseline written" not in out
    assert not events.exists()  # no server started, no request sent
    assert not (pytester.path / "__snapshots__").exists()
    # a name holding a newline reads as "a b" once escaped (core.scrub.printable): the two
    # are one name, refused as such before the baseline files are even named
    (folder / "a\nb.yaml").write_text(_config("Alpha-1B", '{"default": "correct"}'), "utf-8")
    result = _run(pytester, folder, gsm8k_data, "--snapshot-update", events=events)
    out = output(result)
    assert result.ret == pytest.ExitCode.USAGE_ERROR, out
    lines = [line for line in out.splitlines() if "two configs are named 'a b'" in line]
    assert len(lines) == 1, out
    assert "baseline written" not in out
    assert not events.exists()
    assert not (pytester.path / "__snapshots__").exists()
