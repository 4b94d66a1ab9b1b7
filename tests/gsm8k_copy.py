"""The embedded GSM8K copy written out as plain files, for tests that need files.

Tests need nothing beside the repository: the fake server and the file-loading
tests read JSONL files, and these are unpacked from the copy the package ships
(checked against its pinned hashes) into a temporary folder, once per process.
"""

from __future__ import annotations

import atexit
import functools
import lzma
import shutil
import tempfile
from importlib import resources
from pathlib import Path

from pytest_gsm8k.runtime.data import EMBEDDED

#: the file names of openai/grade-school-math's data folder
FILE_NAMES = {
    ("main", "test"): "test.jsonl",
    ("main", "train"): "train.jsonl",
    ("socratic", "test"): "test_socratic.jsonl",
}


def write_copy(folder: Path) -> Path:
    """Unpack the embedded splits into ``folder`` as test.jsonl, train.jsonl, ..."""
    folder.mkdir(parents=True, exist_ok=True)
    for key in EMBEDDED:
        packed = "{}-{}.jsonl.xz".format(*key)
        raw = resources.files("pytest_gsm8k").joinpath("data").joinpath(packed).read_bytes()
        (folder / FILE_NAMES[key]).write_bytes(lzma.decompress(raw))
    return folder


@functools.cache
def data_dir() -> Path:
    """A process-wide temporary folder holding the unpacked copy (removed at exit)."""
    root = Path(tempfile.mkdtemp(prefix="gsm8k-data-"))
    atexit.register(shutil.rmtree, root, True)
    return write_copy(root / "gsm8k")
