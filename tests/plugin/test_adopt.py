"""The gate in a repository that has tests of its own: the ``gsm8k`` marker, and the example
workflow's CPU job run as written in a repository set up as README's "In your repository" says
(README's ini block, verbatim), with the fake server in place of the model. The endpoint job
runs after README's steps 1-4 in tests/repo/test_adopt_readme.py, in the repository and
virtualenv they set up (its baseline is step 3's)."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_EXTRA_PLUGINS, REPO, WORKFLOW, GsmRun, job_command, output

README = (REPO / "README.md").read_text(encoding="utf-8")
SECTION = README.split("\n## In your repository\n", 1)[1].split("\n## ", 1)[0]

USER_TESTS = {
    "test_app": "def test_unrelated():\n    assert False\n",
    "test_mine": (
        "def test_mine(gsm8k_problem, gsm8k_outcome):\n    assert gsm8k_outcome.correct\n"
    ),
}


def _cases(path: Path) -> list[str]:
    """The problems' test cases a JUnit XML file lists, by name (the gates' own test cases,
    classname ``gsm8k.gates``, left out: :func:`_gates` reads those)."""
    return [
        str(case.get("name"))
        for case in ET.parse(path).getroot().iter("testcase")
        if case.get("classname") != "gsm8k.gates"
    ]


def _gates(path: Path) -> dict[str, bool]:
    """The gates' test cases of a JUnit XML file: name -> passed."""
    return {
        str(case.get("name")): case.find("failure") is None
        for case in ET.parse(path).getroot().iter("testcase")
        if case.get("classname") == "gsm8k.gates"
    }


def test_minus_m_gsm8k_runs_only_the_gsm8k_items(
    pytester: pytest.Pytester, gsm8k_run: GsmRun
) -> None:
    """The built-in test's items and a user's own test over ``gsm8k_problem`` carry the
    marker; an unrelated (failing) test beside them is deselected."""
    pytester.makepyfile(**USER_TESTS)
    args = ["--gsm8k-limit=5", "-m", "gsm8k", "--strict-markers", "--junitxml=junit.xml"]
    gsm8k_run(*args, report=None)
    names = _cases(pytester.path / "junit.xml")
    assert sorted(name.partition("[")[0] for name in names) == 5 * ["test_gsm8k"] + 5 * [
        "test_mine"
    ]


def test_minus_m_not_gsm8k_runs_only_the_other_tests(
    pytester: pytest.Pytester, gsm8k_run: GsmRun
) -> None:
    pytester.makepyfile(**USER_TESTS)
    gsm8k_run("--gsm8k-limit=5", "-m", "not gsm8k", "--junitxml=junit.xml", ret=1, report=None)
    assert _cases(pytester.path / "junit.xml") == ["test_unrelated"]


# -- the example workflow's CPU job, as written ---------------------------------------


def _cpu_job_command() -> list[str]:
    return job_command("gsm8k-cpu", "--gsm8k-model=local")


def _readme_ini() -> str:
    """README's ini block, as step 2 tells a user to write it into pytest.ini."""
    found = re.search(r"```ini\n(.*?)```", SECTION, flags=re.S)
    assert found is not None
    return found.group(1)


def _with_fake_model(argv: list[str], server: FakeOpenAIServer) -> list[str]:
    """The command's pytest arguments (after ``python -m pytest``: the test runs them in its
    own process, an interpreter start less per run) with the fake server in place of the
    packaged model; everything else exactly as the workflow has it."""
    out = argv[3:]
    at = out.index("--gsm8k-model=local")
    out[at : at + 1] = ["--gsm8k-model=fake-model", f"--gsm8k-base-url={server.base_url}"]
    return [*out, *NO_EXTRA_PLUGINS]


@pytest.fixture
def user_repo(pytester: pytest.Pytester) -> Path:
    """A fresh repository of a user, set up as README says: its pytest.ini is README's ini
    block (a floor of 0.85, a base URL where nothing listens), tests of its own under
    ``testpaths`` (a module that fails as soon as it is imported, and a failing test), and
    the workflow copied into .github/workflows."""
    root = pytester.path
    (root / "pyproject.toml").write_text(
        '[project]\nname = "app"\nversion = "1"\n', encoding="utf-8"
    )
    (root / "pytest.ini").write_text(_readme_ini(), encoding="utf-8")
    (root / "tests").mkdir()
    (root / "tests" / "test_app.py").write_text(IMPORT_FAILS, encoding="utf-8")
    (root / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(WORKFLOW, root / ".github" / "workflows" / WORKFLOW.name)
    return root


IMPORT_FAILS = (
    "raise RuntimeError('the gate collected the repository tests')\n\n"
    "def test_app():\n    assert False\n"
)

#: a model that scores near zero, as the packaged Gemma 3 270M does (a quarter right)
NEAR_ZERO = Script(default="wrong", behaviours={i: "correct" for i in range(0, 1319, 4)})


def test_the_cpu_job_command_gates_on_its_baseline_and_collects_only_the_gate(
    pytester: pytest.Pytester,
    user_repo: Path,
    server: FakeOpenAIServer,
    keyed_env: str,
) -> None:
    """No baseline: exit 1. Recorded with --snapshot-update as the workflow says: exit 0,
    50 items and nothing else. Answers that got worse: exit 1.

    The repository has README's ini, whose floor (0.85) a model near zero fails: the job
    clears it (``--gsm8k-min-acc=``), its gate is its baseline. Without README's ini this
    test passed while every run of the job in a repository set up as README says failed."""
    server.set_script(NEAR_ZERO)
    command = _with_fake_model(_cpu_job_command(), server)
    baseline_flag = next(a for a in command if a.startswith("--gsm8k-baseline="))
    baseline = user_repo / baseline_flag.partition("=")[2]

    def run() -> pytest.RunResult:
        shutil.rmtree(user_repo / ".pytest_cache", ignore_errors=True)  # a fresh checkout
        return pytester.runpytest(*command)

    baseline.parent.mkdir(parents=True)  # `mkdir -p .github/gsm8k`, as the workflow says
    missing = run()
    assert missing.ret == 1, output(missing)
    assert "gate baseline: FAIL" in output(missing)

    recorded = pytester.runpytest(*command, "--snapshot-update")
    assert recorded.ret == 0, output(recorded)
    assert baseline.is_file()

    passing = run()
    assert passing.ret == 0, output(passing)
    assert "gate baseline: PASS" in output(passing)
    assert "gate min-acc" not in output(passing)  # the ini's floor, cleared
    names = _cases(user_repo / "gsm8k-out" / "junit.xml")
    assert len(names) == 50
    assert all(name.startswith("test_gsm8k[test-") for name in names)
    assert _gates(user_repo / "gsm8k-out" / "junit.xml") == {"baseline": True}
    assert "test_app" not in output(passing)
    assert (user_repo / "gsm8k-out" / "report.json").is_file()
    assert (user_repo / "gsm8k-out" / "gsm8k.html").is_file()

    server.set_script(Script(default="wrong"))
    failing = run()
    assert failing.ret == 1, output(failing)
    assert "gate baseline: FAIL" in output(failing)
    assert len(_cases(user_repo / "gsm8k-out" / "junit.xml")) == 50
    assert _gates(user_repo / "gsm8k-out" / "junit.xml") == {"baseline": False}
