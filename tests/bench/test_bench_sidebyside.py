"""benchmarks/bench_sidebyside.py runs each tool on a few problems and counts right.

The figures in README come from this script on the full split; these runs on 20 problems
keep it working (a tool's command line, its output format, the server's request count) as
the plugin and the tools change. A part whose tool is not installed here (vLLM's script and
lm-eval live outside the repository) is skipped with the line the bench prints about it.
No timing is asserted: timings belong to the bench itself.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import bench_sidebyside as bench

SCRIPT = REPO / "benchmarks" / "bench_sidebyside.py"
SMALL = ["--problems", "20", "--rounds", "1", "--no-warmup", "--latency", "0.01"]


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )


def _row(stdout: str, name: str) -> list[str]:
    """The cells of the table row of run ``name``."""
    for line in stdout.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if cells and cells[0] == name:
            return cells
    raise AssertionError(f"no row {name!r} in:\n{stdout}")


def _assert_counted(stdout: str, name: str) -> None:
    cells = _row(stdout, name)
    assert cells[6] == "20", cells  # the server's count: 20 requests, none twice
    assert cells[7] == "1.000", cells  # the tool scored the fake server's right answers


def _skip_unless(reason: str | None) -> None:
    if reason is not None:
        pytest.skip(reason)


def test_plugin_plain_and_xdist_send_each_problem_once_and_a_missing_tool_is_skipped(
    tmp_path: Path,
) -> None:
    """One bench run (each starts the server and the tools anew): lm-eval, absent from
    ``--venv``, is left out with ``--skip``, saying why; both plugin runs are counted."""
    runs = ["--runs", "lm-eval,plugin,plugin -n 2", "--skip"]
    result = _run(*SMALL, "--venv", str(tmp_path / "none"), *runs)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"skipped lm-eval: no virtualenv at {tmp_path / 'none'}" in result.stderr
    assert "| lm-eval" not in result.stdout
    _assert_counted(result.stdout, "plugin")
    _assert_counted(result.stdout, "plugin -n 2")
    assert "every run: 20 completion requests, none asked twice: OK" in result.stdout


def test_vllm_script_beside_the_plugin_gives_the_ratio() -> None:
    _skip_unless(
        bench.check_vllm_script(bench.BENCH_DIR / "gsm8k_eval.py")
        or bench.check_venv(bench.BENCH_DIR / "lm-eval-venv", "aiohttp")
    )
    result = _run(*SMALL, "--runs", "vllm script,plugin")
    assert result.returncode == 0, result.stdout + result.stderr
    _assert_counted(result.stdout, "vllm script")
    assert _row(result.stdout, "vllm script")[3] == "1.00"
    ratio = float(_row(result.stdout, "plugin")[3])
    assert ratio > 0
    assert "plugin: " in result.stdout
    assert "x the vLLM script" in result.stdout


def test_lm_eval_local_completions_runs_offline() -> None:
    _skip_unless(bench.check_venv(bench.BENCH_DIR / "lm-eval-venv", "lm_eval"))
    result = _run(*SMALL, "--runs", "lm-eval", timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    _assert_counted(result.stdout, "lm-eval")


def test_missing_script_is_one_line_saying_how_to_get_it(tmp_path: Path) -> None:
    absent = tmp_path / "gsm8k_eval.py"
    result = _run("--vllm-script", str(absent), "--runs", "vllm script")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert str(absent) in lines[0]
    assert bench.VLLM_COMMIT in lines[0]
    assert "curl" in lines[0]
    assert "Traceback" not in result.stderr


def test_another_script_is_refused_by_its_blob_hash(tmp_path: Path) -> None:
    other = tmp_path / "gsm8k_eval.py"
    other.write_text("print('not vLLM')\n")
    why = bench.check_vllm_script(other)
    assert why is not None
    assert "is not vLLM's" in why
    assert bench.VLLM_COMMIT[:12] in why
    # the same hash git computes, so the pinned value can be checked with git itself
    git = subprocess.run(
        ["git", "hash-object", str(other)], capture_output=True, text=True, check=True
    )
    assert bench.git_blob_hash(other.read_bytes()) == git.stdout.strip()
