"""A served command never outlives pytest: its supervisor stops it when pytest is gone, also
when pytest dies before the supervisor has started and a child pytest forked holds the
supervisor's stdin open (no end of file comes then)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from helpers import wait_until

# "pytest": starts a server, forks a child that keeps every descriptor (a multiprocessing
# worker does), and is SIGKILLed at once, before its supervisor has read who its parent is
PYTEST = """
import os, signal, sys, time
from pathlib import Path
from pytest_gsm8k.runtime import serve
argv = [sys.executable, "-c", "import time; time.sleep(60)", os.environ["MARKER"]]
serve.ServedProcess(argv=argv, env=dict(os.environ), scrub=str, log_path=Path(sys.argv[1]),
                    base_url="http://127.0.0.1:9/v1", model="m", what="the model server (x)")
if os.fork() == 0:
    Path(sys.argv[2]).write_text(str(os.getpid()))
    time.sleep(40)
    os._exit(0)
while not Path(sys.argv[2]).exists():
    time.sleep(0.001)
os.kill(os.getpid(), signal.SIGKILL)
"""


def _running(marker: str) -> list[int]:
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            if marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                found.append(int(name))
        except OSError:
            pass
    return found


def test_a_server_ends_when_pytest_dies_before_its_supervisor_starts(tmp_path: Path) -> None:
    """Rule: no process of a served command outlives pytest, however pytest ends."""
    marker = f"gsm8k-parent-{uuid.uuid4().hex}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MARKER": marker}
    child = tmp_path / "child.pid"
    proc = subprocess.run(
        [sys.executable, "-c", PYTEST, str(tmp_path / "serve.log"), str(child)], env=env, timeout=60
    )
    assert proc.returncode == -9
    try:
        assert wait_until(lambda: bool(_running(marker)), 10, interval=0.05)  # it started
        assert wait_until(lambda: not _running(marker), 15, interval=0.1), (
            "the server outlived pytest"
        )
    finally:
        for pid in [int(child.read_text()), *_running(marker)]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
