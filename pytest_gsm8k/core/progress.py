"""The progress line of a long run: answered of total, outcomes so far, rate and ETA. Pure.

A slow model takes hours over 1,319 problems; pytest's dots say neither how far the run
is nor how long it has left. The pytest layer feeds this the answered count and the time
since the test loop started, and shows :meth:`Progress.line` in place of the dots on a
terminal (never in a CI log unless asked).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

#: answers before an ETA is shown (or a twentieth of the run, if more): the first replies
#: arrive together (every request in flight left at once), so a rate read after one answer
#: is off by up to the concurrency ("ETA 1h10m" for a run of a few minutes)
ETA_AFTER = 20


def format_duration(seconds: float) -> str:
    """A duration in the shortest form that keeps the seconds a person cares about:
    ``42s``, ``8m05s``, ``2h03m`` (minutes rounded down past an hour)."""
    total = max(0, math.ceil(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


@dataclass(frozen=True)
class Progress:
    """Where a run stands: ``done`` of ``total`` problems answered after ``elapsed``
    seconds, with the outcomes counted so far (``correct``, ``wrong``, ... ; zeros left
    out of the line)."""

    done: int
    total: int
    elapsed: float
    counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        """Problems answered per second so far; None before the first answer or the first
        instant (no rate can be measured yet)."""
        if self.done <= 0 or self.elapsed <= 0:
            return None
        return self.done / self.elapsed

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far; 0 once every problem is answered, None while
        no rate is known: before :data:`ETA_AFTER` answers (or a twentieth of the run)."""
        if self.done >= self.total:
            return 0.0
        rate = self.rate
        if rate is None or self.done < max(ETA_AFTER, self.total // 20):
            return None
        return (self.total - self.done) / rate

    def line(self) -> str:
        """``gsm8k: 120/1319 answered (98 correct, 22 wrong)  2.40/s  ETA 8m20s``."""
        text = f"gsm8k: {self.done}/{self.total} answered"
        shown = [f"{count} {name}" for name, count in self.counts.items() if count]
        if shown:
            text += f" ({', '.join(shown)})"
        rate = self.rate
        text += f"  {rate:.2f}/s" if rate is not None else "  -/s"
        if self.done >= self.total:
            text += f"  done in {format_duration(self.elapsed)}"
        else:
            eta = self.eta
            text += f"  ETA {format_duration(eta)}" if eta is not None else "  ETA -"
        return text
