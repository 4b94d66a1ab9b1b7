"""The progress line of a long run (answered of total, outcomes, rate, ETA), shown in place of
pytest's dots, which say neither how far a run of hours is nor how long it has left. Pure."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

#: answers before an ETA (or a twentieth of the run): the first replies arrive together
ETA_AFTER = 20


def format_duration(seconds: float) -> str:
    """``42s``, ``8m05s``, ``2h03m`` (minutes rounded down past an hour)."""
    minutes, secs = divmod(max(0, math.ceil(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return (
        f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"
    )


@dataclass(frozen=True)
class Progress:
    """``done`` of ``total`` problems answered after ``elapsed`` seconds, with the outcomes
    counted so far (zeros left out of the line)."""

    done: int
    total: int
    elapsed: float
    counts: Mapping[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float | None:
        """Problems answered per second; None before the first answer or instant."""
        return self.done / self.elapsed if self.done > 0 and self.elapsed > 0 else None

    @property
    def eta(self) -> float | None:
        """Seconds left at the rate so far (0 when done; None before :data:`ETA_AFTER`)."""
        if self.done >= self.total:
            return 0.0
        if (rate := self.rate) is None or self.done < max(ETA_AFTER, self.total // 20):
            return None
        return (self.total - self.done) / rate

    def line(self) -> str:
        """``gsm8k: 120/1319 answered (98 correct, 22 wrong)  2.40/s  ETA 8m20s``."""
        text = f"gsm8k: {self.done}/{self.total} answered"
        if shown := [f"{count} {name}" for name, count in self.counts.items() if count]:
            text += f" ({', '.join(shown)})"
        text += "  -/s" if self.rate is None else f"  {self.rate:.2f}/s"
        if self.done >= self.total:
            return text + f"  done in {format_duration(self.elapsed)}"
        return text + ("  ETA -" if self.eta is None else f"  ETA {format_duration(self.eta)}")
