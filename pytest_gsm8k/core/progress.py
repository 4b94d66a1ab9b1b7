"""The progress line of a long run (answered of total, outcomes, rate, ETA), shown in place of
pytest's dots, which say neither how far a run of hours is nor how long it has left. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping

#: answers before an ETA (or a twentieth of the run): the first replies arrive together
ETA_AFTER = 20


def format_duration(seconds: float) -> str:
    """``42s``, ``8m05s``, ``2h03m`` (minutes rounded down past an hour)."""
    minutes, secs = divmod(max(0, math.ceil(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return (
        f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
    )


def progress_line(done: int, total: int, elapsed: float, counts: Mapping[str, int]) -> str:
    """``gsm8k: 120/1319 answered (98 correct, 22 wrong)  2.40/s  ETA 8m20s``: ``done`` of
    ``total`` answered after ``elapsed`` seconds, the outcomes counted so far (zeros left out)."""
    text = f"gsm8k: {done}/{total} answered"
    if shown := [f"{count} {name}" for name, count in counts.items() if count]:
        text += f" ({', '.join(shown)})"
    rate = done / elapsed if done > 0 and elapsed > 0 else None
    text += "  -/s" if rate is None else f"  {rate:.2f}/s"
    if done >= total:
        return text + f"  done in {format_duration(elapsed)}"
    if rate is None or done < max(ETA_AFTER, total // 20):
        return text + "  ETA -"
    return text + f"  ETA {format_duration((total - done) / rate)}"
