"""A served server's log: its output copied through the run's scrubber, a secret cut in two
by the pipe or by the bound on a line without end included."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

from pytest_gsm8k.core.scrub import REDACTED, Scrubber
from pytest_gsm8k.runtime import serve

SECRET = "sk-SECRET-0123456789abcdef"


def test_the_log_holds_no_secret_however_the_pipe_cuts_it(tmp_path: Path) -> None:
    """Rule: nothing the run writes holds a secret, the server's log included (a server
    prints its arguments, ``--api-key`` among them, and the log stays after the run)."""
    path = tmp_path / "serve.log"
    source, sink = os.pipe()
    copier = threading.Thread(
        target=serve._copy_log,
        args=(
            os.fdopen(source, "rb", buffering=0),
            path.open("ab"),
            Scrubber(None, None, [SECRET]).command,
        ),
    )
    copier.start()
    key = SECRET.encode()
    # a secret across two writes; then a line with no end, longer than the copier holds,
    # with a secret where the pipe's 64 KiB reads would cut it; then one at the very end
    long_line = b"y" * (serve._LOG_LINE_LIMIT + 65536 - 4) + key + b" z\n"
    with os.fdopen(sink, "wb", buffering=0) as out:
        out.write(b"args: --api-key " + key[:5])
        out.write(key[5:] + b" --hf-token hidden\n")
        out.write(long_line)
        out.write(b"last " + key)
    copier.join(timeout=10)
    assert not copier.is_alive()
    assert path.read_text("utf-8") == (
        f"args: --api-key {REDACTED} --hf-token {REDACTED}\n"
        + "y" * (serve._LOG_LINE_LIMIT + 65536 - 4)
        + f"{REDACTED} z\nlast {REDACTED}"
    )


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (a full disk)")
def test_a_log_on_a_full_disk_is_drained_to_the_end_without_an_exception(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rule: a log that cannot be written never blocks the server nor ends its copier in a
    traceback (what a full disk kept in the writer's buffer is dropped when it closes)."""
    crashed: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: crashed.append(args.exc_value))
    source, sink = os.pipe()
    copier = threading.Thread(
        target=serve._copy_log,
        args=(os.fdopen(source, "rb", buffering=0), open("/dev/full", "ab"), str),  # noqa: SIM115
    )
    copier.start()
    with os.fdopen(sink, "wb", buffering=0) as out:
        for number in range(50):  # short lines, each its own read: the writer buffers them
            out.write(b"INFO request %d served\n" % number)
            time.sleep(0.001)
        out.write(b"x" * (1 << 20) + b"\n")  # a write past the buffer, all of it drained
    copier.join(timeout=10)
    assert not copier.is_alive()
    assert crashed == []
