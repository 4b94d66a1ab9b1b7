""".ci/run's lowest-releases step: the pins .ci/lowest.py prints reach pip, or CI stops."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run_lowest_step(tmp_path: Path, dependencies: str) -> subprocess.CompletedProcess[str]:
    """.ci/run from its ``python3 -m venv .venv-lowest`` on, under its own ``set -euo pipefail``,
    in a copy holding ``dependencies``: the venv's pip and python only note their calls."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    start = lines.index("python3 -m venv .venv-lowest")
    (tmp_path / ".ci").mkdir()
    shutil.copy(REPO / ".ci" / "lowest.py", tmp_path / ".ci" / "lowest.py")
    (tmp_path / "pyproject.toml").write_text(f"[project]\ndependencies = {dependencies}\n")
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "python3").write_text(
        "#!/usr/bin/env bash\n"
        'if [ "$1" = -m ] && [ "$2" = venv ]; then\n'
        '  mkdir -p "$3/bin"\n'
        "  for tool in pip python; do\n"
        """    printf '#!/bin/sh\\necho "$0 $*" >> calls\\n' > "$3/bin/$tool"\n"""
        '    chmod +x "$3/bin/$tool"\n'
        "  done\n"
        "  exit 0\n"
        "fi\n"
        f'exec {shlex.quote(sys.executable)} "$@"\n'
    )
    (shims / "python3").chmod(0o755)
    script = "set -euo pipefail\n" + "\n".join(lines[start:]) + "\n"
    env = {"PATH": f"{shims}:/usr/bin:/bin", "HOME": str(tmp_path)}
    return subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "spec", ["pyyaml>=6.0; python_version < '4'", "openai[aiohttp]>=3.57", "aiohttp>=3.9,<4"]
)
def test_a_dependency_lowest_cannot_pin_stops_ci(tmp_path: Path, spec: str) -> None:
    """A dependency without a plain ``>=`` bound (a marker, an extra, an upper bound too) makes
    .ci/lowest.py exit non-zero. Read by pip through a process substitution, that exit went
    unseen under ``set -e``: pip got no pins, installed the newest releases and the step passed,
    having tested no lower bound."""
    done = _run_lowest_step(tmp_path, f'["pytest>=8.4.1", "{spec}"]')
    assert done.returncode != 0
    assert f"dependency {spec!r} has no plain '>=' lower bound to pin" in done.stderr
    assert not (tmp_path / "calls").exists()  # neither pip nor the tests ran


def test_the_pins_reach_pip(tmp_path: Path) -> None:
    done = _run_lowest_step(tmp_path, '["pytest>=8.4.1", "pyyaml>=6.0"]')
    assert done.returncode == 0, done.stderr
    pip, python = (tmp_path / "calls").read_text().splitlines()
    assert " install " in pip
    assert "-m pytest" in python
    constraints = Path(pip.rpartition(" -c ")[2])
    assert (tmp_path / constraints).read_text() == "pytest==8.4.1\npyyaml==6.0\n"
