"""The Markdown summary's lists and its size bound (GitHub drops a step summary over
1 MiB entirely: a matrix of many configs must still show one)."""

from __future__ import annotations

from collections.abc import Callable

from pytest_gsm8k.core.markdown import LISTED, MAX_BYTES, fit, problem_list

QUESTIONS = {
    f"p{i}": f"Person {i} buys 12 boxes of 24 apples, gives away a third of them and eats "
    "5 a day for a week. How many apples are left?"
    for i in range(200)
}


def test_a_list_shows_at_most_listed_and_counts_the_rest() -> None:
    ids = [f"p{i}" for i in range(120)]
    lines = problem_list("newly failing", ids, QUESTIONS, "see the JSON report")
    assert lines[0] == "**newly failing (120):**"
    assert sum(line.startswith("- `p") for line in lines) == LISTED
    assert lines[-2] == f"- ... and {120 - LISTED} more (see the JSON report)"
    none = problem_list("newly failing", ids, QUESTIONS, "see the JSON report", listed=0)
    assert none == ["**newly failing (120):**", "", "- ... 120 (see the JSON report)", ""]
    assert problem_list("x", [], QUESTIONS, "r") == []


def _summary(configs: int) -> Callable[[int], str]:
    def build(listed: int) -> str:
        lines = ["### headline", ""]
        for c in range(configs):
            ids = [f"p{i}" for i in range(150)]
            lines += problem_list(f"config-{c}: newly failing", ids, QUESTIONS, "r", listed)
        return "\n".join(lines) + "\n"

    return build


def test_a_summary_that_fits_keeps_its_full_lists() -> None:
    build = _summary(3)
    assert fit(build) == build(LISTED)


def test_many_configs_shorten_the_lists_until_the_summary_fits() -> None:
    build = _summary(300)  # 300 configs x 50 problems: about 1.7 MB with full lists
    assert len(build(LISTED).encode()) > MAX_BYTES
    text = fit(build)
    assert len(text.encode()) <= MAX_BYTES
    assert text == build(20) or text == build(5)
    assert text.count("**config-") == 300  # every config still has its count


def test_a_summary_too_large_even_without_lists_is_cut_at_a_line_and_says_so() -> None:
    build = _summary(300)
    text = fit(build, limit=5_000)
    assert len(text.encode()) <= 5_000
    assert text.endswith("see the JSON report._\n")
    kept = text.rsplit("\n_... cut here", 1)[0]
    assert build(0).startswith(kept)  # whole lines of the shortest form, nothing invented
