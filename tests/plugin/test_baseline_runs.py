"""The release gate against a stored baseline (syrupy snapshot), end to end."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import XDIST, GsmRun, made_once, output, read_json

from pytest_gsm8k.core import baseline as bl

LIMIT = "--gsm8k-limit=50"
BASELINE = Path("__snapshots__") / "gsm8k" / "test@1_0-shot_CoT.gsm8k"


def _ids(report: dict[str, Any]) -> list[int]:
    return sorted(p["index"] for p in report["problems"])


@pytest.fixture
def recorded(pytester: pytest.Pytester, gsm8k_run: GsmRun) -> list[int]:
    """A baseline recorded from an all-correct run of the 50-problem subset (once per
    process); its problems' indices."""

    def record() -> None:
        result, _ = gsm8k_run(LIMIT, "--snapshot-update", xdist=())
        result.stdout.fnmatch_lines([f"*baseline written: {BASELINE} (n=50, accuracy 1.0000)*"])

    made_once("baseline", pytester.path, [BASELINE, "r.json"], record)
    return _ids(read_json(pytester.path / "r.json"))


def test_baseline_file_is_stable_sorted_json(
    pytester: pytest.Pytester, recorded: list[int]
) -> None:
    text = (pytester.path / BASELINE).read_text()
    data = bl.loads(text, "baseline")
    assert data["protocol"]["name"] == "test@1"
    assert data["protocol"]["shots"] == 0
    assert data["dataset"]["fingerprint"]
    assert data["dataset"]["split"] == "test"
    assert list(data["problems"]) == sorted(data["problems"])
    assert set(data["problems"].values()) == {"correct"}
    assert len(data["problems"]) == 50
    assert text == bl.dumps(data)  # canonical formatting: a re-dump is byte-identical
    assert "sk-test" not in text


def test_identical_rerun_passes(recorded: list[int], gsm8k_run: GsmRun) -> None:
    result, _ = gsm8k_run(LIMIT, "--gsm8k-no-cache")
    result.stdout.fnmatch_lines(
        [
            "*1.0000 -> 1.0000 on 50 problems*",
            "*0 newly failing, 0 newly passing; p=1*",
            "*gate baseline: PASS*",
        ]
    )


def test_seven_flips_fail_the_default_gate_as_exact_mcnemar(
    pytester: pytest.Pytester,
    recorded: list[int],
    gsm8k_run: GsmRun,
    server: FakeOpenAIServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A single-run baseline (every format recorded before --gsm8k-repeats) gates by the
    noise-aware test, which for one run a side is exact one-sided McNemar at alpha 0.01."""
    flipped = recorded[5:12]
    server.set_script(Script(behaviours={i: "wrong" for i in flipped}))
    summary_md = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary_md))
    result, report = gsm8k_run(LIMIT, "--gsm8k-no-cache", "--junitxml=junit.xml", ret=1)
    ids = ", ".join(f"test-{i:04d}" for i in flipped)
    # exact one-sided McNemar: 7 newly failing, 0 newly passing -> P(X >= 7 | Bin(7, 1/2)) = 1/128
    result.stdout.fnmatch_lines(
        [
            # one estimate, one interval, on the baseline line and the gate's (issue 32)
            "*1.0000 -> 0.8600 on 50 problems; diff -14.00 points ?95% CI -26.19, -3.97?",
            "*flips: 7 newly failing, 0 newly passing; p=0.007812 (one-sided: the gate's test)*",
            "*noise: a single-run baseline cannot tell noisy problems from stable ones*",
            # a single run cannot tell stable from noisy: no "always-right", no "stable flip"
            f"*newly failing: {ids}",
            "*gate baseline: FAIL: p=0.00781 < --gsm8k-alpha 0.01 (exact McNemar): 7 newly "
            "failing, 0 newly passing; diff -14.00 points ?95% CI -26.19, -3.97?",
        ]
    )
    base = report["baseline"]
    assert base["newly_failing"] == [f"test-{i:04d}" for i in flipped]
    assert base["stable_flips"] == []
    assert base["noisy_failing"] == []
    assert base["mcnemar_p"] == pytest.approx(1 / 128)
    assert base["p_value"] == pytest.approx(1 / 128)
    assert base["repeats"] == {"baseline": 1, "run": 1}
    assert [g["name"] for g in report["gates"] if not g["passed"]] == ["baseline"]

    markdown = summary_md.read_text()
    assert "### gsm8k acc (test@1, 0-shot CoT) = 0.8600" in markdown
    assert "| baseline | FAIL |" in markdown
    assert "**Newly failing (7):**" in markdown  # a single run: no "stable"
    for i in flipped:
        assert f"- `test-{i:04d}`: " in markdown

    cases = ET.parse(pytester.path / "junit.xml").getroot().iter("testcase")
    props = {
        case.get("name"): {p.get("name"): p.get("value", "") for p in case.iter("property")}
        for case in cases
    }
    wrong = props[f"test_gsm8k[test-{flipped[0]:04d}]"]
    assert wrong["gsm8k_outcome"] == "wrong"
    assert int(wrong["gsm8k_extracted"]) == int(wrong["gsm8k_gold"]) + 1

    # --gsm8k-max-drop is an allowed drop on top: 14 points <= 0.2 passes
    result, _ = gsm8k_run(LIMIT, "--gsm8k-no-cache", "--gsm8k-max-drop=0.2")
    result.stdout.fnmatch_lines(
        [
            "*gate baseline: PASS: p=0.00781 < --gsm8k-alpha 0.01, drop 14.00 points <= "
            "--gsm8k-max-drop 0.2 (exact McNemar)*"
        ]
    )


def test_three_flips_are_within_the_noise_at_alpha_001(
    recorded: list[int], gsm8k_run: GsmRun, server: FakeOpenAIServer
) -> None:
    """Three always-right problems failing once: p = 1/8, no evidence at 0.01 (the old
    default, any drop fails, failed this; a stricter level still can)."""
    server.set_script(Script(behaviours={i: "wrong" for i in recorded[5:8]}))
    result, _ = gsm8k_run(LIMIT, "--gsm8k-no-cache")
    result.stdout.fnmatch_lines(["*gate baseline: PASS: p=0.125 >= --gsm8k-alpha 0.01*"])
    result, _ = gsm8k_run(LIMIT, "--gsm8k-no-cache", "--gsm8k-alpha=0.2", ret=1)
    result.stdout.fnmatch_lines(["*gate baseline: FAIL: p=0.125 < --gsm8k-alpha 0.2*"])


def test_subset_run_is_compared_on_its_subset(recorded: list[int], gsm8k_run: GsmRun) -> None:
    result, report = gsm8k_run("--gsm8k-limit=20")
    shared = set(_ids(report)) & set(recorded)  # limit 20 is a subset of limit 50
    assert len(shared) == 20
    result.stdout.fnmatch_lines(["*on the 20 problems shared with the baseline's 50 (subset)*"])


def test_protocol_mismatch_is_refused(recorded: list[int], gsm8k_run: GsmRun) -> None:
    result, _ = gsm8k_run(
        LIMIT, "--gsm8k-max-tokens=512", f"--gsm8k-baseline={BASELINE}", ret=1, report=None
    )
    result.stdout.fnmatch_lines(
        [
            f"*gate baseline: FAIL: refused to compare with {BASELINE}: protocol max_tokens is 512 "
            "here but 1024 in the baseline*"
        ]
    )


def test_corrupt_baseline_is_named(
    pytester: pytest.Pytester, recorded: list[int], gsm8k_run: GsmRun
) -> None:
    path = pytester.path / BASELINE
    path.write_text(path.read_text()[:200])
    result, _ = gsm8k_run(LIMIT, ret=1, report=None)
    result.stdout.fnmatch_lines([f"*gate baseline: FAIL: {BASELINE}: corrupt baseline (line *"])
    assert "Traceback" not in result.stdout.str()


def test_missing_baseline_is_a_note_unless_required(gsm8k_run: GsmRun) -> None:
    result, _ = gsm8k_run("--gsm8k-limit=5")
    result.stdout.fnmatch_lines(
        [f"*baseline: no baseline at {BASELINE}; record one with: *--snapshot-update"]
    )
    result, _ = gsm8k_run("--gsm8k-limit=5", "--gsm8k-require-baseline", ret=1)
    result.stdout.fnmatch_lines(["*gate baseline: FAIL: no baseline at*--gsm8k-require-baseline*"])


def test_a_protocol_change_fails_the_gate_naming_the_baseline_it_moved_from(
    gsm8k_run: GsmRun,
) -> None:
    """Rule: a protocol with no baseline of its own, beside a baseline of another protocol on
    the same data, fails the baseline gate (without --gsm8k-require-baseline too), naming
    that file and the field that differs, until its own baseline is recorded (issue 34.2)."""
    gsm8k_run("--gsm8k-limit=10", "--snapshot-update")
    result, _ = gsm8k_run("--gsm8k-limit=10", "--gsm8k-shots=5", ret=1)
    result.stdout.fnmatch_lines(
        [
            "*gate baseline: FAIL: no baseline of this protocol at "
            "__snapshots__/gsm8k/test@1_5-shot_CoT.gsm8k, but one of another protocol on the "
            f"same data: {BASELINE} (protocol shots is 5 here but 0 there); record this "
            "protocol's with: pytest <same options> --snapshot-update"
        ]
    )
    # recorded as the line says, the new protocol gates against its own baseline
    gsm8k_run("--gsm8k-limit=10", "--gsm8k-shots=5", "--snapshot-update")
    again, _ = gsm8k_run("--gsm8k-limit=10", "--gsm8k-shots=5")
    again.stdout.fnmatch_lines(["*gate baseline: PASS*"])
    # a baseline chosen by name is the one the user named: a missing one stays a note
    named, _ = gsm8k_run("--gsm8k-limit=10", "--gsm8k-shots=2", "--gsm8k-baseline-name=explore")
    assert "no baseline at __snapshots__/gsm8k/explore.gsm8k; record one with" in output(named)


def test_update_after_errors_refuses_to_write(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    _, report = gsm8k_run("--gsm8k-limit=10", ret=None)
    first = _ids(report)[0]
    server.set_script(Script(behaviours={first: "error500"}))
    result, _ = gsm8k_run(
        "--gsm8k-limit=10",
        "--gsm8k-no-cache",
        "--gsm8k-max-retries=0",
        "--snapshot-update",
        ret=1,
        report=None,
    )
    result.stdout.fnmatch_lines(
        [f"*gate baseline: FAIL: not written to {BASELINE}: 1 problems ended in an error*"]
    )
    assert not (pytester.path / BASELINE).exists()


def test_both_gates_listed_and_named_baselines_side_by_side(
    pytester: pytest.Pytester, recorded: list[int], gsm8k_run: GsmRun
) -> None:
    result, _ = gsm8k_run(LIMIT, "--gsm8k-min-acc=0.99")
    result.stdout.fnmatch_lines(["*gate min-acc: PASS*", "*gate baseline: PASS*"])
    gsm8k_run(LIMIT, "--gsm8k-baseline-name=release-41", "--snapshot-update", ret=None)
    assert (pytester.path / "__snapshots__" / "gsm8k" / "release-41.gsm8k").is_file()
    assert (pytester.path / BASELINE).is_file()


def test_syrupy_never_reports_or_deletes_the_baseline(
    pytester: pytest.Pytester, recorded: list[int], gsm8k_run: GsmRun
) -> None:
    # an ordinary amber snapshot test living in the same __snapshots__ folder
    pytester.makepyfile(test_amber="def test_amber(snapshot):\n    assert snapshot == {'a': 1}\n")
    result = pytester.runpytest("test_amber.py", "--snapshot-update")
    assert result.ret == 0, result.stdout.str()
    assert (pytester.path / BASELINE).is_file()
    result = pytester.runpytest("test_amber.py")
    assert result.ret == 0, result.stdout.str()
    assert "unused" not in result.stdout.str().lower()
    gsm8k_run(LIMIT, "test_amber.py", "--snapshot-update", report=None)
    assert (pytester.path / BASELINE).is_file()


@XDIST
def test_syrupy_keeps_the_baseline_beside_a_test_file_without_snapshots(
    pytester: pytest.Pytester, gsm8k_run: GsmRun
) -> None:
    """Rule: the baseline is the gate's file, never one of syrupy's snapshot collections.
    A test file that does not use ``snapshot`` beside the run made syrupy scan the
    rootdir's __snapshots__ folder: --snapshot-update deleted the baseline it had just
    written ("Deleted unknown snapshot collection"), a plain run called it unused, and the
    next run found "no baseline" and had no baseline gate at all."""
    pytester.makepyfile(test_x="def test_placeholder():\n    pass\n")
    result, _ = gsm8k_run("--gsm8k-limit=10", "--snapshot-update")
    result.stdout.fnmatch_lines([f"*baseline written: {BASELINE} (n=10*"])
    assert "unknown snapshot" not in output(result)
    assert (pytester.path / BASELINE).is_file()
    # recorded again over an existing baseline, it is kept as well
    result, _ = gsm8k_run("--gsm8k-limit=10", "--snapshot-update")
    assert "unknown snapshot" not in output(result)
    assert (pytester.path / BASELINE).is_file()
    # a later run without --snapshot-update gates on it and does not call it unused
    result, _ = gsm8k_run("--gsm8k-limit=10")
    result.stdout.fnmatch_lines(["*gate baseline: PASS*"])
    assert "unused" not in output(result).lower()
    # --snapshot-update with -k selecting only the ordinary test leaves it alone, and so
    # does the ordinary suite's --snapshot-update with no gsm8k option at all
    for args, model in ((("-k", "placeholder"), True), ((), False)):
        result, _ = gsm8k_run("--snapshot-update", *args, model=model, report=None)
        assert "unknown snapshot" not in output(result)
        assert (pytester.path / BASELINE).is_file()


def test_the_flipped_problems_are_the_newly_failing_ones_in_order(
    recorded: list[int], gsm8k_run: GsmRun, server: FakeOpenAIServer
) -> None:
    """(The same baseline block and gates under -n 2: test_acceptance.py's baseline_flips
    compares the whole report, plain and -n 2.)"""
    flipped = recorded[:7]
    server.set_script(Script(behaviours={i: "wrong" for i in flipped}))
    _, report = gsm8k_run(LIMIT, "--gsm8k-no-cache", ret=1)
    assert report["baseline"]["newly_failing"] == [f"test-{i:04d}" for i in flipped]


@pytest.mark.parametrize(
    ("update", "said"),
    [([], f"{BASELINE}: not a regular file"), (["--snapshot-update"], "is a FIFO, not a file")],
    ids=["gate", "record"],
)
def test_a_fifo_at_the_baseline_path_is_one_line_not_a_hang(
    pytester: pytest.Pytester, gsm8k_args: list[str], keyed_env: str, update: list[str], said: str
) -> None:
    """Reading the baseline opened a FIFO placed at its path and waited for a writer that
    never came: the run hung before its first request. It is read without blocking and,
    not being a regular file, refused in one line naming it."""
    import os

    (pytester.path / BASELINE).parent.mkdir(parents=True)
    os.mkfifo(pytester.path / BASELINE)
    result = pytester.runpytest_subprocess(
        *gsm8k_args, "--gsm8k-limit=5", "--gsm8k-no-cache", *update, timeout=120
    )
    text = output(result)
    assert result.ret != 0, text
    assert said in text
    assert "Traceback" not in text
