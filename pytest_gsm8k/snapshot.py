"""The syrupy side of baselines.

The baseline is a syrupy single-file snapshot: :class:`GSM8KBaselineExtension`
serializes it (sorted keys, one problem per line) and gives it its own file
extension, ``.gsm8k``. syrupy (7.x) discovers unused snapshots per extension,
so an amber snapshot beside it never claims the baseline as its own
(tests/plugin/test_baseline_runs.py checks that it is neither reported nor deleted).
The baseline is written once, on the controller, after
all items: not from a test item, so syrupy's per-item assertion machinery
(which needs a test location) is not involved.
"""

from __future__ import annotations

from typing import Any

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

from pytest_gsm8k.core.baseline import dumps

FILE_EXTENSION = "gsm8k"


class GSM8KBaselineExtension(SingleFileSnapshotExtension):
    """Single-file JSON snapshots with the ``.gsm8k`` extension."""

    file_extension = FILE_EXTENSION
    _write_mode = WriteMode.TEXT

    def serialize(self, data: Any, **_: Any) -> str:
        return dumps(data)


def serialize(baseline: dict[str, Any]) -> str:
    """The baseline text, through the extension (one serializer for files and tests)."""
    return GSM8KBaselineExtension().serialize(baseline)
