"""The progress line's numbers (core/progress.py): answered of total, rate, ETA, as text."""

from __future__ import annotations

import pytest

from pytest_gsm8k.core.progress import Progress, format_duration


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


def test_rate_and_eta_come_from_the_answers_so_far() -> None:
    progress = Progress(done=120, total=1319, elapsed=50.0)
    assert progress.rate == pytest.approx(2.4)
    assert progress.eta == pytest.approx((1319 - 120) / 2.4)


def test_the_line_names_answered_outcomes_rate_and_eta() -> None:
    counts = {"correct": 98, "wrong": 22, "unparsed": 0, "truncated": 0, "error": 0}
    line = Progress(done=120, total=1319, elapsed=50.0, counts=counts).line()
    # 1199 left at 2.4/s: 499.58 s, shown rounded up
    assert line == "gsm8k: 120/1319 answered (98 correct, 22 wrong)  2.40/s  ETA 8m20s"


def test_before_the_first_answer_no_rate_or_eta_is_made_up() -> None:
    for elapsed in (0.0, 3.0):
        progress = Progress(done=0, total=50, elapsed=elapsed)
        assert progress.rate is None
        assert progress.eta is None
        assert progress.line() == "gsm8k: 0/50 answered  -/s  ETA -"
    assert Progress(done=3, total=50, elapsed=0.0).rate is None  # no time has passed yet


def test_a_finished_run_says_how_long_it_took() -> None:
    progress = Progress(done=50, total=50, elapsed=125.0, counts={"correct": 50})
    assert progress.eta == 0.0
    assert progress.line() == "gsm8k: 50/50 answered (50 correct)  0.40/s  done in 2m05s"


def test_no_eta_until_the_rate_stands_for_the_run() -> None:
    """The first replies arrive together: an ETA after one of them said "1h10m" for a run
    of minutes. None until 20 answers, or a twentieth of the run if that is more."""
    assert Progress(done=1, total=1319, elapsed=2.0).eta is None
    assert Progress(done=64, total=1319, elapsed=10.0).eta is None
    assert Progress(done=65, total=1319, elapsed=10.0).eta == pytest.approx(1254 / 6.5)
    assert Progress(done=19, total=100, elapsed=10.0).line().endswith("ETA -")
    assert Progress(done=20, total=100, elapsed=10.0).line().endswith("ETA 40s")
