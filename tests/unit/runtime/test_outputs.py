"""Output streams: a FIFO whose reader stops reading ends the write instead of hanging it."""

from __future__ import annotations

import os
import subprocess
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


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="no /proc/self/fd")


@needs_proc
@pytest.mark.parametrize("streams", [True, False])
def test_another_process_s_descriptor_is_refused_and_its_file_untouched(
    tmp_path: Path, streams: bool
) -> None:
    """/proc/<pid>/fd/1 of another process leads to that process's open file: replacing it
    (or writing into it) would pull the file from under that process."""
    from pytest_gsm8k.runtime import outputs

    log = tmp_path / "log.txt"
    with log.open("w") as sink:
        other = subprocess.Popen(["sleep", "60"], stdout=sink)
    try:
        with pytest.raises(outputs.OutputError, match=r"^--gsm8k-report: /proc/"):
            outputs.prepare(f"/proc/{other.pid}/fd/1", "--gsm8k-report", streams=streams)
    finally:
        other.kill()
        other.wait()
    assert log.read_text() == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt"]


@needs_proc
@pytest.mark.parametrize("path", ["/dev/stdout", "/proc/self/fd/1", "link"])
def test_this_process_s_stdout_is_written_through_its_own_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """Whatever stdout is (a terminal, a pipe, or a file pytest captures into), a path to it
    is written at stdout's position, never replaced; a baseline is never written there."""
    from pytest_gsm8k.runtime import outputs

    monkeypatch.chdir(tmp_path)
    (tmp_path / "link").symlink_to("/proc/self/fd/1")
    out = outputs.prepare(path, "--gsm8k-report")
    try:
        assert out.fd is not None
        assert out.terminal
        assert os.path.samestat(os.fstat(out.fd), os.fstat(1))
    finally:
        out.close()
    with pytest.raises(outputs.OutputError):
        outputs.prepare(path, "--gsm8k-baseline", streams=False)
    assert (tmp_path / "link").is_symlink()


@needs_proc
def test_a_closed_descriptor_is_refused(tmp_path: Path) -> None:
    from pytest_gsm8k.runtime import outputs

    fd = os.open(tmp_path, os.O_RDONLY)
    os.close(fd)
    with pytest.raises(outputs.OutputError, match=f"^--gsm8k-report: /proc/self/fd/{fd} "):
        outputs.prepare(f"/proc/self/fd/{fd}", "--gsm8k-report")


def test_a_step_summary_whose_folder_is_a_file_says_so(tmp_path: Path) -> None:
    """The step summary's folder is never made: a missing one is "create it first", but a file
    in its place is named as not a folder (mkdir would say it exists)."""
    from pytest_gsm8k.runtime import outputs

    (tmp_path / "file").write_text("")
    what = "$GITHUB_STEP_SUMMARY"
    with pytest.raises(
        outputs.OutputError, match=r"^\$GITHUB_STEP_SUMMARY: .*/file is not a folder$"
    ):
        outputs.prepare(tmp_path / "file" / "summary.md", what, append=True)
    with pytest.raises(outputs.OutputError, match=r"gone/summary\.md does not exist; create it"):
        outputs.prepare(tmp_path / "gone" / "summary.md", what, append=True)
