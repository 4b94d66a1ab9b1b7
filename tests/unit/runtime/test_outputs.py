"""Output streams: a FIFO whose reader stops reading ends the write instead of hanging it."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest


def test_a_fifo_whose_reader_stops_reading_ends_the_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_gsm8k.runtime import outputs

    monkeypatch.setattr(outputs, "STREAM_WAIT", 0.3)
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # opened, never read
    try:
        out = outputs.prepare(fifo, "--gsm8k-report")
        done: list[BaseException] = []

        def write() -> None:
            try:
                out.write(b"x" * 1_000_000)  # far beyond a pipe's buffer
            except BaseException as exc:
                done.append(exc)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        writer.join(60)
        assert not writer.is_alive(), "the write to a stalled FIFO did not end"
        assert len(done) == 1
        assert isinstance(done[0], TimeoutError)
        out.close()
    finally:
        os.close(reader)
