"""Where the run's outputs go: special files are written to, never replaced; an unusable
output path is one line before any request; the end of a run never crashes on an output.

Outputs are the JSON report, the HTML page, ``$GITHUB_STEP_SUMMARY`` and a baseline being
recorded. Evidence is the file types afterwards, what a reader received, the server's
request count and the exit code, never a wall clock.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer
from helpers import XDIST, GsmRun, output, report, sent, wait_until

from pytest_gsm8k.core import baseline as bl

USAGE_ERROR = int(pytest.ExitCode.USAGE_ERROR)


def null_device(folder: Path) -> Path:
    """A character device that discards what is written: a fresh node beside the test
    when this user may make one (so a regression cannot replace the system's), else
    /dev/null itself (which such a user cannot replace either)."""
    node = folder / "null"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
        with open(node, "wb") as probe:  # a file system mounted nodev refuses to open it
            probe.write(b"")
    except OSError:
        node.unlink(missing_ok=True)
        return Path(os.devnull)
    return node


def one_line(text: str, needle: str) -> str:
    """The single output line containing ``needle`` (fails on none or several)."""
    lines = [line for line in text.splitlines() if needle in line]
    assert len(lines) == 1, text
    return lines[0]


def no_crash(text: str) -> None:
    assert "INTERNALERROR" not in text, text
    assert "Traceback" not in text, text


class FifoReader:
    """Reads a FIFO until its writer closes it, on a thread; opened before the run (so the
    run finds a reader), bounded (a run that never writes fails the test, not hangs it)."""

    def __init__(self, path: Path, timeout: float = 120.0) -> None:
        self.fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        self.data = bytearray()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._read, args=(timeout,), daemon=True)
        self.thread.start()

    def _read(self, timeout: float) -> None:
        try:
            wait_until(self._read_to_the_end, timeout, interval=0.02)
        finally:
            os.close(self.fd)
            self.done.set()

    def _read_to_the_end(self) -> bool:
        """Read what is there; true once the writer closed after writing (the end of the
        report), false while there is no writer yet or nothing more to read yet."""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return False
            if not chunk:
                return bool(self.data)
            self.data += chunk

    def result(self, timeout: float = 30.0) -> bytes:
        """What was read, once the writer closed (waits at most ``timeout`` seconds: the
        run is over when this is called)."""
        assert self.done.wait(timeout), "the FIFO's reader never saw the end of the data"
        return bytes(self.data)


# -- special files are written to, never replaced ------------------------------------------


def test_report_and_page_to_a_character_device_leave_it_a_device(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    device = null_device(pytester.path)
    result, _ = gsm8k_run(
        "--gsm8k-limit=5", f"--gsm8k-report={device}", f"--gsm8k-html={device}", report=None
    )
    text = output(result)
    no_crash(text)
    assert stat.S_ISCHR(os.stat(device).st_mode)
    assert stat.S_ISCHR(os.lstat(device).st_mode)
    one_line(text, f"report: {device}")
    assert not list(pytester.path.glob(".null.*"))  # no temporary file left beside it


def test_fifo_with_a_reader_receives_the_report_and_stays_a_fifo(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    fifo = pytester.path / "report.fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    gsm8k_run("--gsm8k-limit=6", f"--gsm8k-report={fifo}", report=None)
    received = json.loads(reader.result())
    assert received["n"] == 6
    assert received["counts"]["correct"] == 6
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


@XDIST
def test_fifo_without_a_reader_is_refused_before_any_request(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    fifo = pytester.path / "page.fifo"
    os.mkfifo(fifo)
    result, _ = gsm8k_run("--gsm8k-limit=6", f"--gsm8k-html={fifo}", ret=USAGE_ERROR, report=None)
    text = output(result)
    no_crash(text)
    line = one_line(text, "gsm8k: --gsm8k-html:")
    assert "FIFO with no reader" in line
    assert str(fifo) in line
    assert sent(server) == 0
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_symlink_to_a_regular_file_stays_a_link_and_its_target_gets_the_report(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    (pytester.path / "keep").mkdir()
    target = pytester.path / "keep" / "real.json"
    target.write_text("{}\n")
    link = pytester.path / "r.json"
    link.symlink_to(target)
    page_target = pytester.path / "keep" / "page.html"  # a link to a file not there yet
    (pytester.path / "p.html").symlink_to(page_target)
    gsm8k_run("--gsm8k-limit=5", "--gsm8k-report=r.json", "--gsm8k-html=p.html", report=None)
    assert link.is_symlink()
    assert os.readlink(link) == str(target)
    assert (pytester.path / "p.html").is_symlink()
    assert json.loads(target.read_text())["n"] == 5
    assert page_target.read_text().startswith("<!DOCTYPE html>")


def test_report_to_stdout_through_a_symlink(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc/self/fd here")
    link = pytester.path / "out"
    link.symlink_to("/proc/self/fd/1")
    result = pytester.runpytest_subprocess(
        *gsm8k_args, "--gsm8k-limit=5", "--gsm8k-report=out", timeout=120
    )
    text = result.stdout.str()
    assert result.ret == 0, output(result)
    assert link.is_symlink()
    assert os.readlink(link) == "/proc/self/fd/1"
    start = text.index('{\n "schema"')
    end = text.index("\n}\n", start) + 2
    assert json.loads(text[start:end])["n"] == 5
    # in order with pytest's own output: the summary comes after the report
    assert text.index("gsm8k acc (test@1", end) > end
    one_line(text, "report: out")


# -- an unusable output path is one line before any request --------------------------------


@pytest.mark.parametrize("option", ["--gsm8k-report", "--gsm8k-html", "--gsm8k-markdown"])
def test_output_path_that_is_a_folder_is_refused_before_any_request(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    option: str,
) -> None:
    (pytester.path / "out").mkdir()
    result, _ = gsm8k_run("--gsm8k-limit=5", f"{option}=out", ret=USAGE_ERROR, report=None)
    text = output(result)
    no_crash(text)
    assert "is a folder" in one_line(text, f"gsm8k: {option}: out")
    assert sent(server) == 0


@pytest.mark.parametrize("path", ["/proc/r.json", "/proc/self/gsm8k/r.json", "/sys/r.json"])
def test_report_under_proc_is_refused_before_any_request(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    path: str,
) -> None:
    result, _ = gsm8k_run("--gsm8k-limit=5", f"--gsm8k-report={path}", ret=USAGE_ERROR, report=None)
    text = output(result)
    no_crash(text)
    one_line(text, "gsm8k: --gsm8k-report:")
    assert sent(server) == 0


def test_report_in_a_folder_that_cannot_be_made_is_refused(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    (pytester.path / "afile").write_text("a file, not a folder\n")
    result, _ = gsm8k_run(
        "--gsm8k-limit=5", "--gsm8k-report=afile/sub/r.json", ret=USAGE_ERROR, report=None
    )
    text = output(result)
    assert "not a folder" in one_line(text, "gsm8k: --gsm8k-report:")
    assert sent(server) == 0


def test_a_missing_report_folder_is_made(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    gsm8k_run("--gsm8k-limit=5", "--gsm8k-report=a/b/r.json", report=None)
    assert report(pytester, "a/b/r.json")["n"] == 5


@XDIST
@pytest.mark.parametrize(
    ("name", "why"),
    [("summary", "is a folder"), ("gone/summary.md", "does not exist")],
    ids=["folder", "in-a-missing-folder"],
)
def test_step_summary_that_cannot_be_appended_to_is_refused_before_any_request(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    why: str,
) -> None:
    """The step summary is appended to, its folder never made: a path the end could not
    write is one line before any request (the controller writes it under -n 2)."""
    (pytester.path / "summary").mkdir()
    step = pytester.path / name
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    result, _ = gsm8k_run("--gsm8k-limit=5", ret=USAGE_ERROR, report=None)
    text = output(result)
    no_crash(text)
    line = one_line(text, "gsm8k: $GITHUB_STEP_SUMMARY:")
    assert why in line
    assert str(step) in line
    assert sent(server) == 0


def test_long_param_gives_a_short_stable_baseline_name(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    # 7 problems: the fewest a single-run baseline gate can fail on at alpha 0.01 (rule 2)
    run = [*gsm8k_args, "--gsm8k-limit=7", f"--gsm8k-param=note={'x' * 300}"]
    result = pytester.runpytest(*run, "--snapshot-update")
    text = output(result)
    assert result.ret == 0, text
    no_crash(text)
    written = list((pytester.path / "__snapshots__" / "gsm8k").iterdir())
    assert len(written) == 1
    name = written[0].name
    assert len(name.encode()) <= bl.NAME_LIMIT + len(".gsm8k")
    assert name.startswith("test@1_0-shot_CoT_params_note_xxx")
    one_line(text, f"baseline written: __snapshots__/gsm8k/{name}")
    rerun = pytester.runpytest(*run)  # the same name again: compared, not "no baseline"
    assert rerun.ret == 0, output(rerun)
    assert "gate baseline: PASS" in one_line(output(rerun), "gate baseline:")


@pytest.mark.parametrize("option", ["--gsm8k-baseline-name", "--gsm8k-baseline"])
def test_explicit_baseline_name_too_long_is_refused_before_any_request(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    option: str,
) -> None:
    value = "b" * 300 if option.endswith("name") else f"base/{'b' * 300}.gsm8k"
    result, _ = gsm8k_run("--gsm8k-limit=5", f"{option}={value}", ret=USAGE_ERROR, report=None)
    text = output(result)
    no_crash(text)
    assert "bytes, more than the" in one_line(text, f"gsm8k: {option}:")
    assert sent(server) == 0


def test_snapshot_update_into_a_folder_that_cannot_be_made_is_refused(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_run: GsmRun
) -> None:
    (pytester.path / "__snapshots__").write_text("a file where the folder goes\n")
    result, _ = gsm8k_run("--gsm8k-limit=5", "--snapshot-update", ret=USAGE_ERROR, report=None)
    text = output(result)
    no_crash(text)
    assert "not a folder" in one_line(text, "gsm8k: --snapshot-update:")
    assert sent(server) == 0


LOW_LIMIT = """
import resource, sys
import pytest
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (40, hard))
sys.exit(pytest.main(sys.argv[1:]))
"""


def test_open_file_limit_below_the_concurrency_still_ends_with_a_summary(
    pytester: pytest.Pytester, server: FakeOpenAIServer, gsm8k_args: list[str], keyed_env: str
) -> None:
    result = pytester.run(
        sys.executable,
        "-c",
        LOW_LIMIT,
        *gsm8k_args,
        "--gsm8k-limit=60",
        "--gsm8k-concurrency=32",
        "--gsm8k-no-cache",
        "--gsm8k-report=r.json",
        "--gsm8k-html=p.html",
        timeout=300,
    )
    text = output(result)
    assert result.ret == 0, text
    no_crash(text)
    line = one_line(text, "gsm8k: --gsm8k-concurrency 32 needs more open files")
    assert "ulimit -n 40" in line
    one_line(text, "gsm8k acc (test@1, 0-shot CoT) = 1.0000")
    rep = report(pytester)
    assert rep["counts"]["correct"] == 60
    assert rep["complete"] is True
    assert (pytester.path / "p.html").read_text().startswith("<!DOCTYPE html>")


# -- the end of a run never crashes on an output -------------------------------------------

SPOIL = """
import os
from pathlib import Path

def test_spoil():
    for path in {paths!r}:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path)
"""


def spoil(pytester: pytest.Pytester, *paths: str | Path) -> None:
    """A test of the user's that turns ``paths`` into folders while the run goes on (after
    the session-start checks passed)."""
    pytester.makepyfile(test_spoil=SPOIL.format(paths=[str(p) for p in paths]))


def summary_printed(text: str) -> None:
    one_line(text, "gsm8k acc (test@1, 0-shot CoT) = 1.0000")


def test_report_and_page_unwritable_at_the_end_are_one_line_each(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    spoil(pytester, pytester.path / "r.json", pytester.path / "p.html")
    result, _ = gsm8k_run(
        "--gsm8k-limit=5", "--gsm8k-report=r.json", "--gsm8k-html=p.html", ret=1, report=None
    )
    text = output(result)
    no_crash(text)
    summary_printed(text)
    assert "is a folder" in one_line(text, "gsm8k: --gsm8k-report: cannot write r.json")
    assert "is a folder" in one_line(text, "gsm8k: --gsm8k-html: cannot write p.html")
    assert "report: r.json" not in text


def test_step_summary_unwritable_at_the_end_is_one_line_and_the_report_is_written(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    step = pytester.path / "step" / "summary.md"
    step.parent.mkdir()  # the runner makes the file's folder
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    spoil(pytester, step)
    result, _ = gsm8k_run("--gsm8k-limit=5", "--gsm8k-report=r.json", ret=1, report=None)
    text = output(result)
    no_crash(text)
    summary_printed(text)
    one_line(text, "gsm8k: $GITHUB_STEP_SUMMARY: cannot write")
    assert report(pytester)["n"] == 5


def test_baseline_unwritable_at_the_end_fails_its_gate_in_one_line(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    spoil(pytester, pytester.path / "__snapshots__" / "gsm8k" / "test@1_0-shot_CoT.gsm8k")
    result, _ = gsm8k_run(
        "--gsm8k-limit=5", "--gsm8k-report=r.json", "--snapshot-update", ret=1, report=None
    )
    text = output(result)
    no_crash(text)
    summary_printed(text)
    line = one_line(text, "gate baseline: FAIL")
    assert "cannot write" in line
    assert "is a folder" in line
    gates: list[dict[str, Any]] = report(pytester)["gates"]
    assert [g["name"] for g in gates if not g["passed"]] == ["baseline"]
