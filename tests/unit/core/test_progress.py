"""The progress line's numbers (core/progress.py): answered of total, rate, ETA, as text."""

from __future__ import annotations

import pytest

from pytest_gsm8k.core.progress import format_duration, progress_line


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.2, "1s"),
        (42, "42s"),
        (60, "1m00s"),
        (485, "8m05s"),
        (3600, "1h00m"),
        (7380.5, "2h03m"),
        (-5, "0s"),
    ],
)
def test_durations_read_in_the_largest_units_that_matter(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


def line(done: int, total: int, elapsed: float, counts: dict[str, int] | None = None) -> str:
    return progress_line(done, total, elapsed, counts or {})


def test_rate_and_eta_come_from_the_answers_so_far() -> None:
    # 120 in 50 s: 2.4/s; 1199 left at 2.4/s: 499.58 s, shown rounded up
    assert line(120, 1319, 50.0).endswith("answered  2.40/s  ETA 8m20s")


def test_the_line_names_answered_outcomes_rate_and_eta() -> None:
    counts = {"correct": 98, "wrong": 22, "unparsed": 0, "truncated": 0, "error": 0}
    assert line(120, 1319, 50.0, counts) == (
        "gsm8k: 120/1319 answered (98 correct, 22 wrong)  2.40/s  ETA 8m20s"
    )


def test_before_the_first_answer_no_rate_or_eta_is_made_up() -> None:
    for elapsed in (0.0, 3.0):
        assert line(0, 50, elapsed) == "gsm8k: 0/50 answered  -/s  ETA -"
    assert line(3, 50, 0.0) == "gsm8k: 3/50 answered  -/s  ETA -"  # no time has passed yet


def test_a_finished_run_says_how_long_it_took() -> None:
    finished = line(50, 50, 125.0, {"correct": 50})
    assert finished == "gsm8k: 50/50 answered (50 correct)  0.40/s  done in 2m05s"


def test_no_eta_until_the_rate_stands_for_the_run() -> None:
    """The first replies arrive together: an ETA after one of them said "1h10m" for a run
    of minutes. None until 20 answers, or a twentieth of the run if that is more."""
    assert line(1, 1319, 2.0).endswith("ETA -")
    assert line(64, 1319, 10.0).endswith("ETA -")
    assert line(65, 1319, 10.0).endswith("6.50/s  ETA 3m13s")  # 1254 / 6.5 = 192.9 s
    assert line(19, 100, 10.0).endswith("ETA -")
    assert line(20, 100, 10.0).endswith("ETA 40s")
