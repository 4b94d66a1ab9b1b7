"""Atomic writes never replace what is not a regular file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pytest_gsm8k.runtime.outputs import write_atomic


def test_write_atomic_never_renames_over_a_special_file(tmp_path: Path) -> None:
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    with pytest.raises(FileExistsError, match="not a regular file"):
        write_atomic(fifo, "data")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "d", "data")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "f"]  # no temporary left
