"""What the terminal says is plain and true: passing gates in green, no 0.0000 for rules that
found nothing, the baseline's own model when it differs, a callable model's dotted name,
where the rest of a long list is, and which protocol's baseline is beside a missing one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import GsmRun, output, report

BASELINE = Path("__snapshots__") / "gsm8k" / "test@1_0-shot_CoT.gsm8k"


def test_a_passing_gate_is_green_and_a_failing_one_red(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    gsm8k_run: GsmRun,
    keyed_env: str,
) -> None:
    passed, _ = gsm8k_run("--gsm8k-limit=3", "--gsm8k-min-acc=0.5", "--color=yes", report=None)
    line = next(x for x in passed.outlines if "gate min-acc: PASS" in x)
    assert "\x1b[32m" in line  # green
    server.set_script(Script(default="wrong"))
    failed = pytester.runpytest(
        *gsm8k_args, "--gsm8k-limit=3", "--gsm8k-min-acc=0.5", "--color=yes", "--gsm8k-no-cache"
    )
    line = next(x for x in output(failed).splitlines() if "gate min-acc:" in x)
    assert "\x1b[31m" in line  # red


def test_rules_that_found_no_number_are_named_not_printed_at_zero(
    pytester: pytest.Pytester, gsm8k_args: list[str], keyed_env: str
) -> None:
    """The fake model answers "#### N": no \\boxed{} anywhere, so boxed found nothing."""
    result = pytester.runpytest(*gsm8k_args, "--gsm8k-limit=3")
    line = next(x for x in result.outlines if "by extractor:" in x)
    assert "boxed 0.0000" not in line
    assert "no number found by boxed" in line
    assert "strict* 1.0000" in line


def test_the_baselines_model_is_shown_when_it_is_another(
    pytester: pytest.Pytester, gsm8k_run: GsmRun
) -> None:
    # 7 problems: the fewest a single-run baseline gate can fail on at alpha 0.01 (rule 2)
    gsm8k_run("--gsm8k-limit=7", "--snapshot-update", report=None)
    path = pytester.path / BASELINE
    data = json.loads(path.read_text())
    data["model"] = "release-41"
    path.write_text(json.dumps(data))
    result, _ = gsm8k_run("--gsm8k-limit=7", report=None)
    result.stdout.fnmatch_lines(
        ["*the baseline was recorded with model release-41 (this run: fake-model)*"]
    )
    gsm8k_run("--gsm8k-limit=7", "--snapshot-update", report=None)
    assert "recorded with model" not in output(gsm8k_run("--gsm8k-limit=7", report=None)[0])


def test_the_rest_of_the_newly_failing_list_is_where_the_run_put_it(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    args = ["--gsm8k-limit=30", "--gsm8k-no-cache"]
    gsm8k_run(*args, "--snapshot-update", report=None)
    server.set_script(Script(default="wrong"))
    without, _ = gsm8k_run(*args, ret=None, report=None)
    assert "more with --gsm8k-report PATH)" in output(without)
    assert "more in the JSON report" not in output(without)
    with_report, data = gsm8k_run(*args, ret=None)
    assert "more in the JSON report)" in output(with_report)
    assert len(data["baseline"]["newly_failing"]) == 30


def test_a_missing_baseline_names_the_protocol_beside_it_by_the_option_that_differs(
    gsm8k_run: GsmRun,
) -> None:
    """One rule: a baseline is found by the protocol's label and every other field must
    match; a protocol with no baseline names the one beside it and what differs, by the
    option a user sets (shots), not the hash of the exemplars that follow from it."""
    gsm8k_run("--gsm8k-limit=3", "--snapshot-update", report=None)
    result, _ = gsm8k_run("--gsm8k-limit=3", "--gsm8k-shots=1", ret=1, report=None)
    text = output(result)
    assert "no baseline of this protocol at __snapshots__/gsm8k/test@1_1-shot_CoT.gsm8k" in text
    assert f"{BASELINE} (protocol shots is 1 here but 0 there)" in text
    assert "fewshot_hash" not in text


CALLABLE_CONFTEST = """
import pytest

@pytest.fixture(scope="session")
def gsm8k_model():
    def answer(request):
        return "#### 1"
    return answer
"""


def test_a_callable_model_is_named_by_its_dotted_path(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CALLABLE_CONFTEST)
    pytester.makepyfile(test_mine="def test_mine(gsm8k_outcome):\n    assert gsm8k_outcome\n")
    result = pytester.runpytest("--gsm8k-limit=2", "--gsm8k-report=r.json", "-p", "no:randomly")
    assert result.ret == 0, output(result)
    data = report(pytester)
    assert data["problems"][0]["model"] == "conftest.gsm8k_model.answer"
    assert "<locals>" not in output(result)
