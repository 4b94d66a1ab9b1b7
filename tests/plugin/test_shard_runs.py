"""--gsm8k-shard I/N (#35): each CI job runs its stride slice of the run's selection against
the scripted server, decides no gate (a shard cannot see the others), and writes a report
that carries what the merge needs: its place, its ids, the run's plan."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import (
    ANSWERS_ZERO,
    NO_CACHEPROVIDER,
    NO_EXTRA_PLUGINS,
    OWN_TEST,
    XDIST,
    config_serve,
    output,
    report,
    sent,
)

SCHEMA = json.loads(
    resources.files("pytest_gsm8k").joinpath("schema/report.schema.json").read_text()
)
LIMIT = "--gsm8k-limit=30"


def shard_run(
    pytester: pytest.Pytester, args: list[str], index: int, count: int, *extra: str
) -> dict[str, Any]:
    result = pytester.runpytest(
        *args, f"--gsm8k-shard={index}/{count}", f"--gsm8k-report=s{index}.json", *extra
    )
    assert result.ret == 0, output(result)  # its gates wait: no word, no exit code of theirs
    text = output(result)
    if "--gsm8k-min-acc=0.5" in args:
        assert f"shard {index} of {count}: verdict at the merge" in text, text
    assert "gate min-acc: PASS" not in text
    assert "gate min-acc: FAIL: 0." not in text
    return report(pytester, f"s{index}.json")


@XDIST
def test_the_shards_partition_the_selection_and_leave_the_verdict_to_the_merge(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    xdist: list[str],
) -> None:
    server.set_script(Script(behaviours={i: "wrong" for i in range(0, 1319, 3)}))
    args = [*gsm8k_args, LIMIT, "--gsm8k-min-acc=0.5", "--gsm8k-no-cache"]
    # the selection, from a plain run (test_acceptance: plain and -n 2 select the same)
    whole = pytester.runpytest(*args, "--gsm8k-report=whole.json")
    selection = [p["id"] for p in report(pytester, "whole.json")["problems"]]
    assert len(selection) == 30, output(whole)
    server.reset()
    # under -n 2, shard 2 (its report the controller's, from the workers' answers); 1 and 3
    # plain, as in the full-split merge (SHARD_XDIST): the slice is the plan's, in any process
    reports = [shard_run(pytester, [*args, *(xdist if i == 2 else ())], i, 3) for i in (1, 2, 3)]
    assert sent(server) == 30  # every problem asked once, by one shard
    for index, shard in enumerate(reports, start=1):
        jsonschema.validate(shard, SCHEMA)
        block = shard["shard"]
        assert (block["index"], block["count"]) == (index, 3)
        # a stride slice of the run's selection: spread over it, balanced, in run order
        assert block["ids"] == selection[index - 1 :: 3]
        assert [p["id"] for p in shard["problems"]] == block["ids"]
        assert block["plan"] == reports[0]["shard"]["plan"]  # one run's plan in every shard
        assert block["plan"]["selection"]["size"] == 30
        # a shard's gates wait for the merge: no word on a slice
        [gate] = shard["gates"]
        assert (gate["name"], gate["rule"]) == ("min-acc", "shard")
        assert gate["detail"].endswith(f"shard {index} of 3: verdict at the merge")
    assert sorted(i for s in reports for i in s["shard"]["ids"]) == sorted(selection)


def test_a_shard_of_a_baseline_update_writes_no_baseline(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    """--snapshot-update on the shards: the merge writes the baseline, from every shard's
    answers, under a single run's coverage rules; a shard's slice never becomes one."""
    shard = shard_run(pytester, [*gsm8k_args, LIMIT], 1, 2, "--snapshot-update")
    assert not (pytester.path / "__snapshots__").exists()
    assert shard["shard"]["plan"]["update_baseline"] is True
    assert "baseline" not in shard  # neither written nor compared with


def test_repeats_and_samples_of_a_problem_stay_in_its_shard(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    shard = shard_run(pytester, [*gsm8k_args, LIMIT, "--gsm8k-repeats=3"], 2, 4)
    ids = shard["shard"]["ids"]
    assert len(ids) == 8  # 30 = 8 + 8 + 7 + 7: shards 1 and 2 hold one more
    assert sent(server) == 3 * len(ids)
    assert all(len(p["repeats"]) == 3 for p in shard["problems"])
    assert shard["shard"]["plan"]["settings"]["repeats"] == 3


CONFIG = """\
model_name: "org/{name}"
accuracy_threshold: 0.5
num_questions: {n}
num_fewshot: 0
"""


def test_each_shard_runs_a_slice_of_every_config(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    for name, n in (("Alpha", 5), ("Beta", 4)):
        (folder / f"{name}.yaml").write_text(CONFIG.format(name=name, n=n), encoding="utf-8")
    args = [
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={config_serve(gsm8k_data)}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        *NO_EXTRA_PLUGINS,
        *NO_CACHEPROVIDER,
    ]
    reports = [shard_run(pytester, args, i, 2) for i in (1, 2)]
    for shard in reports:
        jsonschema.validate(shard, SCHEMA)
        names = {p["id"].partition(":")[0] for p in shard["problems"]}
        assert names == {"Alpha", "Beta"}  # every shard runs every config
        assert [c["name"] for c in shard["shard"]["plan"]["configs"]] == ["Alpha", "Beta"]
        assert {g["rule"] for g in shard["gates"]} == {"shard"}
    ids = [i for s in reports for i in s["shard"]["ids"]]
    assert sorted(ids) == sorted(
        [f"Alpha:test-{i:04d}" for i in range(5)] + [f"Beta:test-{i:04d}" for i in range(4)]
    )


@XDIST
def test_a_shards_gates_are_undecided_in_every_output(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path, xdist: list[str]
) -> None:
    """A gate that was not decided never passes, in any output: a shard's gates wait for the
    merge, and the JSON, the terminal (gate lines, verdict table, headline), the page (gates,
    header, configs table) and JUnit all say UNDECIDED, never PASS."""
    folder = tmp_path / "configs"
    folder.mkdir()
    for name, n in (("Alpha", 5), ("Beta", 4)):
        (folder / f"{name}.yaml").write_text(CONFIG.format(name=name, n=n), encoding="utf-8")
    result = pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={config_serve(gsm8k_data)}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        "--gsm8k-shard=1/2",
        "--gsm8k-report=s1.json",
        "--gsm8k-html=page.html",
        "--junitxml=junit.xml",
        *xdist,
        *NO_EXTRA_PLUGINS,
        *NO_CACHEPROVIDER,
    )
    out = output(result)
    assert result.ret == 0, out  # undecided, not blocking: the merge decides
    gates = report(pytester, "s1.json")["gates"]
    names = ["Alpha:vllm-threshold", "Beta:vllm-threshold"]
    assert [(g["name"], g["verdict"], g["passed"]) for g in gates] == [
        (name, "UNDECIDED", True) for name in names
    ]
    for name in names:
        assert f"gate {name}: UNDECIDED: shard 1 of 2: verdict at the merge" in out
    assert "gsm8k vLLM configs: 0 of 2 pass, 2 undecided" in out
    table = out[out.index("gsm8k vLLM configs: 0 of 2") :].splitlines()[1:4]
    assert [row.split()[-1] for row in table] == ["verdict", "UNDECIDED", "UNDECIDED"]
    page = (pytester.path / "page.html").read_text(encoding="utf-8")
    assert 'class="verdict undecided">UNDECIDED<' in page
    assert page.count('class="badge undecided">UNDECIDED<') == 4  # gates card, configs card
    assert 'class="badge pass"' not in page
    assert 'class="verdict pass"' not in page
    suite = ET.parse(pytester.path / "junit.xml").getroot()
    cases = [c for c in suite.iter("testcase") if c.get("classname") == "gsm8k.gates"]
    assert [c.get("name") for c in cases] == names
    for case in cases:
        [skipped] = list(case)
        assert (skipped.tag, skipped.get("message")) == (
            "skipped",
            "shard 1 of 2: verdict at the merge",
        )


def merge(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """``python -m pytest_gsm8k merge``, as a CI job runs it, in the shards' folder."""
    return pytester.run(sys.executable, "-m", "pytest_gsm8k", "merge", *args)


def test_a_merge_of_part_of_a_run_or_of_two_runs_is_no_verdict(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    args = [*gsm8k_args, "--gsm8k-limit=12", "--gsm8k-min-acc=0.5"]
    for index in (1, 2, 3):
        shard_run(pytester, args, index, 3)
    pytester.runpytest(
        *args[:-1], "--gsm8k-min-acc=0.6", "--gsm8k-shard=3/3", "--gsm8k-report=o.json"
    )
    cases = {
        ("s1.json", "s2.json"): "gsm8k: shard 3 of 3 missing: no verdict on part of a run "
        "(given: 1, 2)",
        ("s1.json", "s2.json", "s2.json"): "gsm8k: shard 2 of 3 given twice: s2.json and s2.json",
        ("s1.json", "s2.json", "o.json"): "gsm8k: shards of different runs: s1.json and o.json "
        "differ in plan.gates.min_acc.threshold",
        ("s1.json", "s2.json", "missing.json"): "gsm8k: missing.json: cannot read it (No such "
        "file or directory)",
    }
    for given, line in cases.items():
        result = merge(pytester, *given, "--report=m.json")
        assert result.ret == 2, output(result)
        assert result.stderr.lines == [line]
        assert not (pytester.path / "m.json").exists()
    # merged where the run's baseline is not the one the shards read: another run
    snapshots = pytester.path / "__snapshots__" / "gsm8k"
    snapshots.mkdir(parents=True)
    (snapshots / "test@1_0-shot_CoT.gsm8k").write_text("{}", encoding="utf-8")
    result = merge(pytester, "s1.json", "s2.json", "s3.json", "--report=m.json")
    assert result.ret == 2, output(result)
    assert result.stderr.lines == [
        "gsm8k: the merge here does not plan what the shards planned: plan.baseline.error "
        "differs (run it at the root of the checkout the shards ran in, with the same data "
        "and baseline)"
    ]


def test_more_shards_than_problems_is_one_line(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    """An empty shard would report nothing, and the merge would then miss it."""
    result = pytester.runpytest(*gsm8k_args, "--gsm8k-limit=2", "--gsm8k-shard=3/4")
    assert result.ret == 4, output(result)
    assert (
        "ERROR: gsm8k: --gsm8k-shard 3/4: the selection has 2 problems; cut it into at most 2 "
        "shards" in result.stderr.lines
    )
    assert sent(server) == 0


#: what must be the single run's to the last digit (timings, endpoints and the shard block
#: are each run's own)
VERDICT_FIELDS = (
    "accuracy",
    "ci95",
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
)


def _verdict_of(report: dict[str, Any]) -> dict[str, Any]:
    kept = {key: report[key] for key in VERDICT_FIELDS}
    kept["ids"] = [p["id"] for p in report["problems"]]
    kept["outcomes"] = [p["outcome"] for p in report["problems"]]
    baseline = dict(report.get("baseline") or {})
    kept["baseline"] = baseline
    return kept


#: the shards of the full-split merge: shard 2 under -n 2 (its report is the controller's,
#: from the workers' answers), 1 and 3 plain; the merge takes them together
SHARD_XDIST = {1: (), 2: ("-n", "2"), 3: ()}


def test_three_shards_merged_are_the_unsharded_run(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    """#35's target: three shards of the full split against one endpoint, merged, give the
    unsharded run's accuracy, problem ids, gate verdicts and p-values, and its exit code;
    --snapshot-update on the shards writes the single run's baseline, byte for byte.

    One shard of each three runs under -n 2 (``SHARD_XDIST``): a shard's report written by
    the xdist controller merges with plain ones into the single run's verdict and baseline
    (this test ran once plain and once with all three shards under -n 2 on 300 problems)."""
    base = [*gsm8k_args, "--gsm8k-no-cache", "--gsm8k-min-acc=0.5", "--gsm8k-max-unparsed=0.1"]
    snapshot = pytester.path / "__snapshots__" / "gsm8k" / "test@1_0-shot_CoT.gsm8k"
    # the baseline: recorded by one machine, then again by three shards and their merge
    pytester.runpytest(*base, "--snapshot-update")
    recorded = snapshot.read_bytes()
    snapshot.unlink()
    for index, xdist in SHARD_XDIST.items():
        shard_run(pytester, [*base, *xdist, "--snapshot-update"], index, 3)
    assert not snapshot.exists()
    result = merge(pytester, "s1.json", "s2.json", "s3.json")
    assert result.ret == 0, output(result)
    assert snapshot.read_bytes() == recorded

    # a later build: flips, unparsed answers; gated against that baseline
    server.set_script(
        Script(
            behaviours={
                **{i: "wrong" for i in range(0, 1319, 37)},
                **{i: "unparsed" for i in range(5, 1319, 101)},
            }
        )
    )
    whole = pytester.runpytest(*base, "--gsm8k-report=whole.json", "--junitxml=whole.xml")
    for index, xdist in SHARD_XDIST.items():
        shard_run(pytester, [*base, *xdist], index, 3)
    merged = merge(
        pytester, "s3.json", "s1.json", "s2.json", "--report=m.json", "--junitxml=junit.xml"
    )
    assert merged.ret == whole.ret == 1, output(merged)  # the baseline gate fails
    one, many = report(pytester, "whole.json"), report(pytester, "m.json")
    jsonschema.validate(many, SCHEMA)
    assert _verdict_of(many) == _verdict_of(one)
    assert many["baseline"]["p_value"] == one["baseline"]["p_value"]
    assert [g["passed"] for g in many["gates"]] == [True, True, False]
    assert "shard" not in many
    # the terminal block is the single run's, the gates are JUnit test cases
    for line in ("gate baseline: FAIL", "gate min-acc: PASS", one["headline"]):
        assert line in merged.stdout.str()
    junit = (pytester.path / "junit.xml").read_text()
    assert 'name="baseline"' in junit
    assert "<failure" in junit
    # the merge writes its JUnit XML without pytest: the gates' cases are the run's
    cases = _gate_cases(pytester.path / "junit.xml")
    assert [case[0] for case in cases] == ["min-acc", "max-unparsed", "baseline"]
    assert cases == _gate_cases(pytester.path / "whole.xml")


def _gate_cases(path: Path) -> list[tuple[str | None, str | None, str | None]]:
    """The gates' test cases in a JUnit XML file: (name, "failure"/"skipped" or None, its
    message)."""
    cases = ET.parse(path).getroot().iter("testcase")
    out: list[tuple[str | None, str | None, str | None]] = []
    for case in cases:
        if case.get("classname") == "gsm8k.gates":
            mark = next((c for c in case if c.tag in ("failure", "skipped")), None)
            tag, message = (None, None) if mark is None else (mark.tag, mark.get("message"))
            out.append((case.get("name"), tag, message))
    return out


def test_a_calibrated_baseline_is_written_at_the_merge_as_one_machine_writes_it(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    server.set_script(Script(behaviours={i: "wrong" for i in range(0, 1319, 7)}))
    args = [*gsm8k_args, LIMIT, "--gsm8k-repeats=3", "--snapshot-update"]
    pytester.runpytest(*args)
    snapshot = pytester.path / "__snapshots__" / "gsm8k" / "test@1_0-shot_CoT.gsm8k"
    recorded = snapshot.read_text()
    assert '"calibration"' in recorded
    snapshot.unlink()
    server.set_script(Script(behaviours={i: "wrong" for i in range(0, 1319, 7)}))
    for index in (1, 2, 3):
        shard_run(pytester, args, index, 3)
    result = merge(pytester, "s1.json", "s2.json", "s3.json")
    assert result.ret == 0, output(result)
    assert snapshot.read_text() == recorded


def test_a_narrowed_selection_is_no_verdict_at_the_merge_as_in_one_run(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    """The coverage rule: problems a shard deselected (-k) leave the merged gates undecided,
    in the single run's words."""
    args = [*gsm8k_args, LIMIT, "--gsm8k-min-acc=0.5", "-k", "not test-0117"]
    whole = pytester.runpytest(*args, "--gsm8k-report=whole.json")
    for index in (1, 2, 3):
        shard_run(pytester, args, index, 3)
    merged = merge(pytester, "s1.json", "s2.json", "s3.json", "--report=m.json")
    assert merged.ret == whole.ret == 1, output(merged)
    one, many = report(pytester, "whole.json"), report(pytester, "m.json")
    assert _verdict_of(many) == _verdict_of(one)
    assert "not a verdict: 1 of the 30 problems of its selection were deselected" in str(
        many["gates"]
    )


def test_the_shards_of_a_config_matrix_merge_into_the_matrix(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "configs"
    folder.mkdir()
    wrong = 'env:\n  FAKESERVER_SCRIPT: \'{"behaviours": {"1": "wrong", "3": "wrong"}}\'\n'
    (folder / "Alpha.yaml").write_text(CONFIG.format(name="Alpha", n=5), encoding="utf-8")
    (folder / "Beta.yaml").write_text(CONFIG.format(name="Beta", n=4) + wrong, encoding="utf-8")
    args = [
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={config_serve(gsm8k_data)}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        *NO_EXTRA_PLUGINS,
        *NO_CACHEPROVIDER,
    ]
    whole = pytester.runpytest(*args, "--gsm8k-report=whole.json")
    for index in (1, 2):
        shard_run(pytester, args, index, 2)
    merged = merge(pytester, "s1.json", "s2.json", "--report=m.json", "--html=m.html")
    assert merged.ret == whole.ret == 0, output(merged)  # Beta: 0.5 >= 0.5 - 0.05
    one, many = report(pytester, "whole.json"), report(pytester, "m.json")
    jsonschema.validate(many, SCHEMA)
    assert _verdict_of(many) == _verdict_of(one)
    keep = ("name", "accuracy", "ci95", "gates", "subset")
    assert [{k: c.get(k) for k in keep} for c in many["configs"]] == [
        {k: c.get(k) for k in keep} for c in one["configs"]
    ]
    assert "<html" in (pytester.path / "m.html").read_text()


def test_a_shard_whose_config_server_was_refused_merges_in_one_piece(
    pytester: pytest.Pytester, gsm8k_data: Path, tmp_path: Path
) -> None:
    """A config whose server was refused (it does not list the config's model) has no
    ``served`` entry in the shard's report; the merge read it by key and ended in a KeyError
    traceback. Its errors make the merged run fail as the run itself did (exit 1)."""
    folder = tmp_path / "configs"
    folder.mkdir()
    (folder / "Alpha.yaml").write_text(CONFIG.format(name="Alpha", n=4), encoding="utf-8")
    args = [
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={config_serve(gsm8k_data, '--model=org/Other')}",
        f"--gsm8k-data={gsm8k_data}",
        "--gsm8k-no-cache",
        *NO_EXTRA_PLUGINS,
        *NO_CACHEPROVIDER,
    ]
    run = pytester.runpytest(*args, "--gsm8k-shard=1/1", "--gsm8k-report=s1.json")
    assert run.ret == pytest.ExitCode.TESTS_FAILED, output(run)
    [config] = report(pytester, "s1.json")["configs"]
    assert config["counts"]["error"] == 4
    merged = merge(pytester, "s1.json", "--report=m.json")
    assert "Traceback" not in output(merged), output(merged)
    assert merged.ret == 1, output(merged)
    assert report(pytester, "m.json")["configs"][0]["counts"]["error"] == 4


def test_two_tests_that_answer_a_problem_differently_are_no_verdict_at_the_merge_either(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    """Rule: a verdict never rests on a coin toss (test_undecided.py: the built-in test and a
    user's test with a model of its own answer the same problems differently). Each shard
    kept one record per problem and said nothing of the other: the merge decided on them."""
    pytester.makepyfile(test_mine=OWN_TEST.format(model=ANSWERS_ZERO))
    args = [*gsm8k_args, "--gsm8k-limit=6", "--gsm8k-min-acc=0.5"]
    whole = pytester.runpytest(*args, "--gsm8k-report=whole.json")
    for index in (1, 2):
        pytester.runpytest(*args, f"--gsm8k-shard={index}/2", f"--gsm8k-report=s{index}.json")
    merged = merge(pytester, "s1.json", "s2.json", "--report=m.json")
    assert merged.ret == whole.ret == 1, output(merged)
    one, many = report(pytester, "whole.json"), report(pytester, "m.json")
    assert _verdict_of(many) == _verdict_of(one)
    assert many["gates"][0]["detail"].startswith("not a verdict: 6 problems were answered")
