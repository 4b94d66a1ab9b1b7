"""``python -m pytest_gsm8k compare`` on JSON reports the suite's own runs wrote (the
scripted server behind them): a worse run exits 1 with its flips listed, an identical one
exits 0, reports of different protocols are refused in one line with exit 2. compare applies
the gate's own rules: a --gsm8k-config matrix config by config, errors never hide a drop,
a report is untrusted input checked against the schema's bounds."""

from __future__ import annotations

import json
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import (
    NO_CACHEPROVIDER,
    NO_EXTRA_PLUGINS,
    GsmRun,
    config_serve,
    made_once,
    output,
    report,
)

from pytest_gsm8k.core.calibrated import MAX_REPEATS
from pytest_gsm8k.core.compare import MAX_CONFIGS, MAX_ID, MAX_PROBLEMS, load_report
from pytest_gsm8k.core.records import OUTCOMES

LIMIT = "--gsm8k-limit=20"
SCHEMA = json.loads(
    resources.files("pytest_gsm8k").joinpath("schema/report.schema.json").read_text()
)


def compare(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """The command, as a user runs it, in the runs' folder."""
    return pytester.run(sys.executable, "-m", "pytest_gsm8k", "compare", *args)


@pytest.fixture
def first(pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun) -> list[int]:
    """a.json: an all-correct run of 20 problems (made once per process: compare reads only
    the file); its problems' indices."""
    made_once(
        "compare a.json",
        pytester.path,
        ["a.json"],
        lambda: gsm8k_run(LIMIT, "--gsm8k-report=a.json", report=None, xdist=()),
    )
    return [p["index"] for p in report(pytester, "a.json")["problems"]]


def test_a_worse_run_exits_1_with_its_flips_listed(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun, first: list[int]
) -> None:
    flipped = first[3:9]
    server.set_script(Script(behaviours={i: "wrong" for i in flipped}))
    # plain: a report written under xdist is the same report (test_engine_runs.py's xdist
    # report, test_plugin.py's full split); a matrix's under -n 2 is compared below
    gsm8k_run(LIMIT, "--gsm8k-no-cache", report="b.json")  # exit 0: no gate in the run itself
    shown = compare(pytester, "a.json", "b.json")
    text = shown.stdout.str()
    assert shown.ret == 1, text + shown.stderr.str()
    assert shown.stderr.str() == ""
    lines = text.splitlines()
    assert lines[0] == "### gsm8k compare (test@1, 0-shot CoT): B 0.7000 vs A 1.0000 on 20 problems"
    assert "Paired on the 20 problems both reports hold (A holds 20, B holds 20)." in lines
    assert any(
        line.startswith(
            "- accuracy: 1.0000 -\\> 0.7000 on 20 problems; diff -30.00 points \\[95% CI "
        )
        for line in lines
    ), text
    flips = "- flips: 6 newly failing, 0 newly passing; p=0.01562 (one-sided: the gate's test), "
    assert flips + "McNemar p=0.01562" in lines
    assert any(
        line.startswith(
            "| compare | FAIL | p=0.0156 \\< --alpha 0.05 (exact McNemar): 6 newly failing, 0 "
            "newly passing"
        )
        for line in lines
    )
    assert "**Newly failing in B (6):**" in lines
    listed = [line for line in lines if line.startswith("- `test-")]
    assert [line[3:12] for line in listed] == [f"test-{i:04d}" for i in sorted(flipped)]
    assert all(len(line) > len("- `test-0000`: ") + 20 for line in listed)  # with the question

    lenient = compare(pytester, "a.json", "b.json", "--alpha", "0.01")
    assert lenient.ret == 0
    lenient.stdout.fnmatch_lines(["| compare | PASS | p=0.0156 \\>= --alpha 0.01 (exact McNemar)*"])
    better = compare(pytester, "b.json", "a.json")
    assert better.ret == 0
    better.stdout.fnmatch_lines(["**Newly passing in B (6):**"])


def test_identical_runs_exit_0(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun, first: list[int]
) -> None:
    gsm8k_run(LIMIT, "--gsm8k-no-cache", report="b.json")
    shown = compare(pytester, "a.json", "b.json")
    assert shown.ret == 0, shown.stdout.str() + shown.stderr.str()
    shown.stdout.fnmatch_lines(
        [
            "### gsm8k compare (test@1, 0-shot CoT): B 1.0000 vs A 1.0000 on 20 problems",
            "| compare | PASS | p=1 \\>= --alpha 0.05 (exact McNemar): 0 newly failing, 0 newly "
            "passing; diff +0.00 points *",
            "- flips: 0 newly failing, 0 newly passing; p=1 (one-sided: the gate's test)*",
        ]
    )
    assert "Newly" not in shown.stdout.str()


def test_a_subset_is_compared_on_the_ids_both_hold(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun, first: list[int]
) -> None:
    gsm8k_run("--gsm8k-limit=5", report="b.json")
    shown = compare(pytester, "a.json", "b.json")
    assert shown.ret == 0
    shown.stdout.fnmatch_lines(
        ["Paired on the 5 problems both reports hold (A holds 20, B holds 5; 15 only in A)."]
    )


def test_reports_of_different_protocols_are_refused(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun, first: list[int]
) -> None:
    gsm8k_run(LIMIT, "--gsm8k-max-tokens=512", report="c.json")
    shown = compare(pytester, "a.json", "c.json")
    assert shown.ret == 2
    assert shown.stdout.str() == ""
    assert shown.stderr.lines == [
        "gsm8k: refused to compare a.json with c.json: protocol max_tokens is 512 in B (c.json) "
        "but 1024 in A (a.json)"
    ]


def test_a_missing_file_or_a_bad_alpha_is_refused(
    pytester: pytest.Pytester, first: list[int]
) -> None:
    missing = compare(pytester, "a.json", "nowhere.json")
    assert missing.ret == 2
    assert missing.stderr.lines == [
        "gsm8k: nowhere.json: cannot read it (No such file or directory)"
    ]
    bad = compare(pytester, "a.json", "a.json", "--alpha", "1.5")
    assert bad.ret == 2
    assert "--alpha: must be > 0 and < 1, got 1.5" in bad.stderr.str()


def _config(questions: int, wrong: range, shots: int = 0) -> str:
    """A vLLM config whose fake server answers the problems of ``wrong`` wrong."""
    script = json.dumps({"behaviours": {str(i): "wrong" for i in wrong}})
    return (
        'model_name: "org/M"\naccuracy_threshold: 0.5\n'
        f"num_questions: {questions}\nnum_fewshot: {shots}\nenv:\n  FAKESERVER_SCRIPT: '{script}'\n"
    )


def _matrix(
    pytester: pytest.Pytester, data: Path, name: str, configs: dict[str, str], *extra: str
) -> dict[str, Any]:
    """A --gsm8k-config run of ``configs`` (file stem -> YAML) writing report ``name``."""
    folder = pytester.path / f"configs-{name}"
    folder.mkdir()
    for stem, text in configs.items():
        (folder / f"{stem}.yaml").write_text(text, encoding="utf-8")
    result = pytester.runpytest(
        f"--gsm8k-config={folder}",
        f"--gsm8k-serve={config_serve(data)}",
        f"--gsm8k-data={data}",
        "--gsm8k-no-cache",
        f"--gsm8k-report={name}",
        *NO_EXTRA_PLUGINS,
        *NO_CACHEPROVIDER,
        *extra,
    )
    assert (pytester.path / name).exists(), output(result)
    return report(pytester, name)


def test_a_matrix_is_compared_config_by_config_each_with_its_verdict(
    pytester: pytest.Pytester, gsm8k_data: Path
) -> None:
    """Rule: compare applies the gate's own rules, and a matrix's gate is per config (its
    configs are different models and protocols, never pooled). alpha fell from 0.90 to 0.56,
    beta rose from 0.56 to 0.90: pooled, the 17 flips each way gave p=0.54, PASS, exit 0."""
    _matrix(
        pytester,
        gsm8k_data,
        "a.json",
        {"alpha": _config(50, range(5)), "beta": _config(50, range(22))},
    )
    _matrix(
        pytester,
        gsm8k_data,
        "b.json",
        {"alpha": _config(50, range(22)), "beta": _config(50, range(5))},
        "-n",
        "2",
    )
    shown = compare(pytester, "a.json", "b.json")
    text = shown.stdout.str()
    assert shown.ret == 1, text + shown.stderr.str()
    lines = text.splitlines()
    shown.stdout.fnmatch_lines(
        [
            "### gsm8k compare (alpha: test@1, *): B 0.5600 vs A 0.9000 on 50 problems",
            "| compare | FAIL | p=7.63e-06 \\< --alpha 0.05 (exact McNemar): 17 *",
            "### gsm8k compare (beta: test@1, *): B 0.9000 vs A 0.5600 on 50 problems",
            "| compare | PASS | p=1 \\>= --alpha 0.05 *",
        ]
    )
    verdicts = [line.split(" | ")[1] for line in lines if line.startswith("| compare | ")]
    assert verdicts == ["FAIL", "PASS"], text
    assert "**Newly failing in B (17):**" in lines
    assert "**Newly passing in B (17):**" in lines
    # each config's own verdict: b.json against itself passes every config
    assert compare(pytester, "b.json", "b.json").ret == 0


def test_a_config_of_another_protocol_is_refused_on_its_own(
    pytester: pytest.Pytester, gsm8k_data: Path
) -> None:
    """Rule: reports of different protocols are refused, config by config as for a whole
    report. beta asked 0-shot in A and 5-shot in B: compared pooled, PASS."""
    _matrix(
        pytester,
        gsm8k_data,
        "a.json",
        {"alpha": _config(10, range(0)), "beta": _config(10, range(0))},
    )
    _matrix(
        pytester,
        gsm8k_data,
        "b.json",
        {"alpha": _config(10, range(0)), "beta": _config(10, range(0), shots=5)},
    )
    shown = compare(pytester, "a.json", "b.json")
    assert shown.ret == 2, shown.stdout.str() + shown.stderr.str()
    (line,) = shown.stderr.lines
    assert line.startswith(
        "gsm8k: config beta: refused to compare a.json with b.json: protocol "
    ), line
    shown.stdout.fnmatch_lines(
        [
            "### gsm8k compare (alpha: test@1, *): B 1.0000 vs A 1.0000 on 10 problems",
            "| compare | PASS | *",
            "### gsm8k compare: config beta: refused to compare a.json with b.json: protocol *",
        ]
    )
    # a report of one run is not a matrix: refused whole
    single = _matrix(pytester, gsm8k_data, "c.json", {"alpha": _config(10, range(0))})
    (pytester.path / "d.json").write_text(
        json.dumps({k: v for k, v in single.items() if k != "configs"})
    )
    whole = compare(pytester, "a.json", "d.json")
    assert whole.ret == 2
    assert whole.stdout.str() == ""
    assert whole.stderr.lines == [
        "gsm8k: refused to compare a.json with d.json: a.json is a --gsm8k-config report "
        "(one comparison per config), d.json is not"
    ]


def test_errors_that_could_hide_a_drop_leave_the_comparison_undecided(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun, first: list[int]
) -> None:
    """Rule: a gate that was not decided never passes. B's server answered 500 for exactly
    the problems B gets wrong: with errors left out compare said "B 1.0000 vs A 1.0000",
    PASS, exit 0. Any problem that ended in an error makes the comparison undecided."""
    server.set_script(Script(behaviours={i: "error500" for i in first[3:9]}))
    result, b = gsm8k_run(
        LIMIT, "--gsm8k-no-cache", "--gsm8k-max-retries=0", ret=None, report="b.json"
    )
    assert b["counts"]["error"] == 6, output(result)
    shown = compare(pytester, "a.json", "b.json")
    assert shown.ret == 1, shown.stdout.str() + shown.stderr.str()
    assert shown.stderr.lines == [
        "gsm8k: compare undecided: 6 of the 20 problems both reports hold ended in an error "
        "(0 in A, 6 in B), and unanswered they could hide a drop: rerun until every problem "
        "has an answer"
    ]
    shown.stdout.fnmatch_lines(["| compare | FAIL | not a verdict: 6 of the 20 problems *"])
    # the other way round: errors in A hide B's drop as well
    assert compare(pytester, "b.json", "a.json").ret == 1


@pytest.mark.parametrize("how", ["deselect", "conftest-skip"])
def test_problems_a_report_left_out_leave_the_comparison_undecided(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    first: list[int],
    how: str,
) -> None:
    """Rule: a gate that was not decided never passes. B's run left out exactly the problems
    it gets wrong (``--deselect`` them, or a conftest skips them): compare paired the rest,
    "B 1.0000 vs A 1.0000", PASS, exit 0. A report that does not hold its whole selection
    leaves the comparison undecided (the hostile review's finding)."""
    wrong = first[3:9]
    server.set_script(Script(behaviours={i: "wrong" for i in wrong}))
    ids = [p["id"] for p in report(pytester, "a.json")["problems"] if p["index"] in wrong]
    if how == "deselect":
        extra = [f"--deselect=gsm8k::test_gsm8k[{pid}]" for pid in ids]
    else:
        pytester.makeconftest(
            "import pytest\n"
            f"WRONG = {ids!r}\n"
            "def pytest_collection_modifyitems(items):\n"
            "    for item in items:\n"
            "        if any(f'[{pid}]' in item.nodeid for pid in WRONG):\n"
            "            item.add_marker(pytest.mark.skip(reason='hidden'))\n"
        )
        extra = []
    _, b = gsm8k_run(LIMIT, "--gsm8k-no-cache", *extra, ret=None, report="b.json")
    assert b["n"] == 14
    shown = compare(pytester, "a.json", "b.json")
    assert shown.ret == 1, shown.stdout.str() + shown.stderr.str()
    [line] = shown.stderr.lines
    assert line.startswith("gsm8k: compare undecided: B "), line
    assert line.endswith("rerun until every problem has an answer"), line
    shown.stdout.fnmatch_lines(["| compare | FAIL | not a verdict: B *"])
    # the other way round: A's left-out problems could hide B's drop as well
    assert compare(pytester, "b.json", "a.json").ret == 1


def test_a_shard_of_a_matrix_leaves_each_configs_comparison_undecided(
    pytester: pytest.Pytester, gsm8k_data: Path
) -> None:
    """Rule: a gate that was not decided never passes. B is shard 1 of 2 of a --gsm8k-config
    run whose config gets the other shard's problems wrong: compared config by config, the
    slice paired "B 1.0000 vs A 1.0000" on 5 problems, PASS, exit 0 (a single run's shard was
    already undecided; a config's entry of the matrix report does not carry the shard)."""
    _matrix(pytester, gsm8k_data, "a.json", {"alpha": _config(10, range(0))})
    b = _matrix(
        pytester,
        gsm8k_data,
        "b.json",
        {"alpha": _config(10, range(1, 10, 2))},
        "--gsm8k-shard=1/2",
    )
    assert len(b["problems"]) == 5
    assert all(p["outcome"] == "correct" for p in b["problems"])  # the wrong ones: shard 2's
    shown = compare(pytester, "a.json", "b.json")
    assert shown.ret == 1, shown.stdout.str() + shown.stderr.str()
    [line] = shown.stderr.lines
    assert line.startswith("gsm8k: config alpha: compare undecided: B is shard 1 of 2 of a run"), (
        line
    )
    shown.stdout.fnmatch_lines(["| compare | FAIL | not a verdict: B is shard 1 of 2 *"])


def _forged(pytester: pytest.Pytester, name: str, change: Any) -> str:
    data = report(pytester, "a.json")
    change(data)
    (pytester.path / name).write_text(json.dumps(data), encoding="utf-8")
    return name


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (
            lambda d: d["problems"][0].update(repeats=["correct", "wrong"] * 10_000),
            "problems[0].repeats",
        ),
        (
            lambda d: [p.update(repeats=["correct", "wrong"] * 500_000) for p in d["problems"][:1]],
            "problems[0].repeats",
        ),
        (
            lambda d: d["problems"][2].update(repeats=["correct", "banana"]),
            "problems[2].repeats[1]",
        ),
        (lambda d: d["problems"][1].update(outcome="banana"), "problems[1].outcome"),
        (lambda d: d["problems"][1].update(correct=True, outcome="wrong"), "problems[1].correct"),
        (lambda d: d["problems"][1].update(id="x" * (MAX_ID + 1)), "problems[1].id"),
        (lambda d: d["problems"].extend({"id": str(i)} for i in range(MAX_PROBLEMS)), "problems"),
    ],
    ids=[
        "repeats-20k",
        "repeats-1M",
        "banana-repeat",
        "banana",
        "correct-wrong",
        "long-id",
        "many",
    ],
)
def test_a_forged_report_is_refused_in_one_line_naming_the_field(
    pytester: pytest.Pytester, first: list[int], change: Any, field: str
) -> None:
    """Rule: a report is untrusted input, checked against the schema's bounds before any
    comparison. A forged repeats list of 20,000 entries took 46 s, of 1,000,000 it hung; an
    outcome "banana" was accepted. The shipped schema refuses the same report."""
    name = _forged(pytester, "forged.json", change)
    started = time.monotonic()
    shown = pytester.run(
        sys.executable, "-m", "pytest_gsm8k", "compare", "a.json", name, timeout=60
    )
    assert time.monotonic() - started < 30
    assert shown.ret == 2, shown.stdout.str() + shown.stderr.str()
    (line,) = shown.stderr.lines
    assert line.startswith(f"gsm8k: forged.json: corrupt JSON report ({field}: "), line
    assert len(line) < 300
    data = json.loads((pytester.path / name).read_text())
    assert not jsonschema.Draft202012Validator(SCHEMA).is_valid(data)


def test_a_forged_dataset_field_is_refused_in_one_line_naming_the_file_and_key(
    pytester: pytest.Pytester, first: list[int]
) -> None:
    """Rule: a report is untrusted input: a key the pairing reads (the split's config, a list
    in both reports) is refused in one line naming the file and the key (exit 2), never a
    traceback (exit 1, "worse"), never compared (exit 0, the schema says a string)."""

    def forge(data: dict[str, Any]) -> None:
        data["dataset"]["config"] = ["main"]

    a, b = _forged(pytester, "forged_a.json", forge), _forged(pytester, "forged_b.json", forge)
    shown = compare(pytester, a, b)
    assert shown.ret == 2, shown.stdout.str() + shown.stderr.str()
    (line,) = shown.stderr.lines
    assert line.startswith("gsm8k: forged_a.json: corrupt JSON report (dataset.config: "), line
    assert not jsonschema.Draft202012Validator(SCHEMA).is_valid(report(pytester, a))


def test_the_schema_carries_the_bounds_compare_checks(
    pytester: pytest.Pytester, first: list[int]
) -> None:
    """Rule: one set of bounds: what compare refuses the shipped schema refuses, and a real
    report passes both."""
    data = report(pytester, "a.json")
    jsonschema.Draft202012Validator(SCHEMA).validate(data)
    load_report(json.dumps(data), "a.json")
    problems = SCHEMA["properties"]["problems"]
    problem = SCHEMA["$defs"]["problem"]["properties"]
    assert problems["maxItems"] == MAX_PROBLEMS
    assert SCHEMA["properties"]["configs"]["maxItems"] == MAX_CONFIGS
    assert problem["id"]["maxLength"] == MAX_ID
    assert problem["repeats"]["maxItems"] == MAX_REPEATS
    assert problem["repeats"]["items"]["enum"] == problem["outcome"]["enum"] == list(OUTCOMES)
