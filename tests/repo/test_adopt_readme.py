"""README's "In your repository", followed as written: a wheel built from a copy of this
repository, installed into a fresh virtualenv of a repository that has tests of its own;
then step 5, the example workflow's endpoint job, in that repository and virtualenv.

The section's commands run verbatim through bash; the only change is the endpoint, the
fake server's URL in place of the ini's ``http://127.0.0.1:8000/v1`` (its model is the
section's ``my-model``, its key in ``OPENAI_API_KEY`` as the section says). pip talks to the
package index (the wheel's dependencies, the build backend) through the suite's pip cache.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import REPO, TEST_KEY, WORKFLOW, job_command

README = (REPO / "README.md").read_text(encoding="utf-8")
SECTION = README.split("\n## In your repository\n", 1)[1].split("\n## ", 1)[0]
EXAMPLE_URL = "http://127.0.0.1:8000/v1"
#: what the wheel is built from (the rest of the clone has no part in it)
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "pytest_gsm8k")

pytestmark = pytest.mark.slow


def _commands() -> list[str]:
    """The section's shell commands: its indented lines outside fenced blocks, in order."""
    text = re.sub(r"```.*?```", "", SECTION, flags=re.S)
    return [line[4:] for line in text.splitlines() if line.startswith("    ")]


def _ini() -> str:
    found = re.search(r"```ini\n(.*?)```", SECTION, flags=re.S)
    assert found is not None
    return found.group(1)


def test_the_section_has_the_commands_it_describes() -> None:
    commands = _commands()
    assert commands[0].startswith("python3 -m venv .venv")
    assert any("python -m build --wheel" in c for c in commands)
    assert any(c.startswith("pip install ") and c.endswith(".whl") for c in commands)
    assert commands[-1].startswith("pytest -m gsm8k ")
    assert EXAMPLE_URL in _ini()
    assert "gsm8k_model" not in _ini()  # it would put the gate in every run of the suite
    # the ini requires a baseline (a changed protocol fails anyway): the first is recorded
    assert "gsm8k_require_baseline = true" in _ini()
    assert commands[-2] == commands[-1] + " --snapshot-update"


def _clean_env() -> dict[str, str]:
    """The environment of a shell outside this suite: no virtualenv of ours on PATH, no
    endpoint or options from the environment."""
    venv = os.environ.get("VIRTUAL_ENV")
    entries = os.environ.get("PATH", "").split(os.pathsep)
    path = [p for p in entries if not (venv and p.startswith(venv))]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTEST_ADDOPTS", "PYTHONHOME"}
        and not k.startswith(("OPENAI_", "GITHUB_", "PYTEST_XDIST"))
    }
    env["PATH"] = os.pathsep.join(path)
    env["PIP_CACHE_DIR"] = str(Path.home() / ".cache" / "pytest-gsm8k" / "pip")
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def test_the_section_works_from_a_wheel_in_a_fresh_virtualenv(
    tmp_path: Path, gsm8k_data: Path
) -> None:
    clone = tmp_path / "pytest-gsm8k"  # "a clone next to your repository"
    clone.mkdir()
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, clone / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, clone / name)
    repo = tmp_path / "your-repo"
    (repo / "tests").mkdir(parents=True)
    (repo / "tests" / "test_app.py").write_text("def test_app():\n    assert False\n")
    env = {**_clean_env(), "OPENAI_API_KEY": TEST_KEY}
    with FakeOpenAIServer(gsm8k_data / "test.jsonl", model="my-model", api_key=TEST_KEY) as server:
        (repo / "pytest.ini").write_text(_ini().replace(EXAMPLE_URL, server.base_url))
        script = "set -e -o pipefail\n" + "\n".join(_commands()) + "\n"
        proc = subprocess.run(
            ["bash", "-c", script],
            cwd=repo,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        shown = proc.stdout[-6000:] + proc.stderr[-6000:]
        assert proc.returncode == 0, shown
        assert "gsm8k acc (test@1, 0-shot CoT) = 1.0000" in proc.stdout, shown
        assert "gate min-acc: PASS" in proc.stdout, shown
        assert "baseline written: __snapshots__/gsm8k/test@1_0-shot_CoT.gsm8k" in proc.stdout
        assert "gate baseline: PASS" in proc.stdout, shown
        assert "1 deselected, 1319 correct" in proc.stdout, shown
        assert "test_app" not in proc.stdout
        _endpoint_job(repo, env, server)

    # The local extra is missing from this install: the error names a command that adds
    # it to the wheel it came from, which pip resolves (no clone, no index entry needed).
    python = repo / ".venv" / "bin" / "python"
    empty = tmp_path / "empty"
    empty.mkdir()
    local = subprocess.run(
        [str(python), "-m", "pytest", "--gsm8k-model=local"],
        cwd=empty,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert local.returncode == int(pytest.ExitCode.USAGE_ERROR), local.stdout + local.stderr
    line = next(x for x in local.stderr.splitlines() if "'local' extra" in x)
    hint = line.rpartition("): ")[2]
    argv = shlex.split(hint)
    assert argv[:2] == ["pip", "install"]
    assert argv[2].startswith("pytest-gsm8k[local] @ file://"), hint
    assert argv[2].endswith(".whl"), hint
    downloads = tmp_path / "downloads"
    fetched = subprocess.run(
        [str(python), "-m", "pip", "download", "--no-deps", "-d", str(downloads), *argv[2:]],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert [p.name for p in downloads.glob("pytest_gsm8k-*.whl")]


IMPORT_FAILS = (
    "raise RuntimeError('the gate collected the repository tests')\n\n"
    "def test_app():\n    assert False\n"
)


def _endpoint_job(repo: Path, env: dict[str, str], server: FakeOpenAIServer) -> None:
    """Step 5 continues steps 1-4 (the workflow copied into .github/workflows, the wheel in
    .github/gsm8k, step 3's baseline at the root): the endpoint job's command, as written,
    with the URL from its repository secret and the key from the environment, through the
    virtualenv's ``python`` (the plugin installed from the wheel, as the job installs it),
    gates on step 3's file and the ini's floor, and collects only the gate (the
    repository's tests now fail at import). A drop fails it."""
    (repo / ".github" / "workflows").mkdir(parents=True)
    shutil.copy(WORKFLOW, repo / ".github" / "workflows" / WORKFLOW.name)
    (repo / "tests" / "test_app.py").write_text(IMPORT_FAILS)
    command = job_command("gsm8k-endpoint", "--gsm8k-base-url", {"GSM8K_BASE_URL": server.base_url})
    assert "--gsm8k-model=my-model" in command  # README's model, the job's GSM8K_MODEL
    command = [str(repo / ".venv" / "bin" / "python"), *command[1:]]

    def run() -> subprocess.CompletedProcess[str]:
        shutil.rmtree(repo / ".pytest_cache", ignore_errors=True)  # a fresh checkout
        return subprocess.run(
            command, cwd=repo, env=env, capture_output=True, text=True, timeout=600
        )

    passing = run()
    text = passing.stdout + passing.stderr
    assert passing.returncode == 0, text[-6000:]
    assert "baseline __snapshots__/gsm8k/test@1_0-shot_CoT.gsm8k:" in text
    assert "gate baseline: PASS" in text
    assert "gate min-acc: PASS" in text  # the ini's 0.85, as README's step 4 says
    assert "test_app" not in text
    cases = ET.parse(repo / "gsm8k-out" / "junit.xml").getroot().iter("testcase")
    assert sum(1 for c in cases if c.get("classname") != "gsm8k.gates") == 1319

    server.set_script(Script(drop=100))
    failing = run()
    assert failing.returncode == 1, (failing.stdout + failing.stderr)[-6000:]
    assert "gate baseline: FAIL" in failing.stdout + failing.stderr
