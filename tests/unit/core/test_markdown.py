"""The Markdown summary's lists and its size bound (GitHub drops a step summary over
1 MiB entirely: a matrix of many configs must still show one)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pytest_gsm8k.core.baseline import noise_block
from pytest_gsm8k.core.calibrated import Pair, difference, evidence
from pytest_gsm8k.core.gates import failing_words, points_words
from pytest_gsm8k.core.render import LISTED, MAX_BYTES, against_baseline, fit, problem_list
from pytest_gsm8k.core.scrub import md_text
from pytest_gsm8k.core.stats import wilson_interval

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


def _block(pairs: list[Pair], path: str = "__snapshots__/gsm8k/b.gsm8k") -> dict[str, Any]:
    """A baseline block as the JSON report holds it, made by the functions the run's gate uses
    from a baseline and a run of single answers holding ``pairs``."""

    def entry(p: Pair) -> Any:  # a single-run baseline's outcome, a calibrated one's counts
        outcome = "correct" if p.base_correct else "wrong"
        calibrated = {"correct": p.base_correct, "outcome": outcome, "repeats": p.base_runs}
        return calibrated if p.base_runs > 1 else outcome

    problems = {p.problem_id: entry(p) for p in pairs}
    records = [{"id": p.problem_id, "correct": p.now_correct > 0} for p in pairs]
    ids = [p.problem_id for p in pairs]
    assert all(p.now_runs == 1 for p in pairs)
    return {
        "path": path,
        **noise_block({"problems": problems}, records, ids, 0.01, evidence(pairs)),
    }


#: a single-run baseline: p0 wrong then, right now; p1-p9 right then, wrong now; p10-p39 right
SINGLE = [
    Pair("p0", 0, 1, 1, 1),
    *(Pair(f"p{i}", 1, 1, 0, 1) for i in range(1, 10)),
    *(Pair(f"p{i}", 1, 1, 1, 1) for i in range(10, 40)),
]


def test_the_summary_shows_before_and_after_with_intervals_and_the_terminals_words() -> None:
    """Issue 34 (8): what a reviewer reads holds the baseline's accuracy and this run's, each
    with its interval, the one difference estimate and the flips, in the terminal's words."""
    base = _block(SINGLE)
    lines = against_baseline(base, QUESTIONS)
    text = "\n".join(lines)
    assert lines[0] == "**Against the baseline** `__snapshots__/gsm8k/b.gsm8k`:"
    b_low, b_high = base["baseline_ci95"]
    c_low, c_high = base["current_ci95"]
    assert (
        f"- 95% CI: baseline {b_low:.4f}-{b_high:.4f}, this run {c_low:.4f}-{c_high:.4f}" in lines
    )
    # the run's interval over all its problems is the headline's (one rule, core/stats.py)
    c_wilson = wilson_interval(31, 40)
    assert (c_low, c_high) == c_wilson
    # the terminal's baseline line and gate say these, from the pairs themselves
    said = md_text(f"0.9750 -> 0.7750 on 40 problems; {points_words(*difference(SINGLE))}")
    assert said.startswith("0.9750 -\\> 0.7750 on 40 problems; diff -20.00 points \\[95% CI ")
    assert f"- accuracy: {said}" in lines
    assert f"- flips: {failing_words(SINGLE)}; p=" in text
    assert "9 newly failing, 1 newly passing;" in text
    assert "**Newly failing (9):**" in lines
    assert "**Newly passing (1):**" in lines
    assert text.index("**Newly failing (9):**") < text.index("**Newly passing (1):**")
    assert "- `p0`: Person 0 buys" in text
    # one run cannot tell stable from noisy: no such counts or lists
    assert "stable (" not in text
    assert "noisy (" not in text


def test_against_a_calibrated_baseline_the_flips_are_stable_or_noisy() -> None:
    pairs = [
        Pair("p0", 5, 5, 0, 1),  # a stable flip
        Pair("p1", 3, 5, 0, 1),  # noisy, failing now
        Pair("p2", 2, 5, 1, 1),  # noisy, right now
        *(Pair(f"p{i}", 5, 5, 1, 1) for i in range(3, 30)),
    ]
    text = "\n".join(against_baseline(_block(pairs), QUESTIONS))
    assert "- 95% CI: baseline (5 runs per problem) " in text
    assert md_text(failing_words(pairs)) in text
    assert "2 newly failing: 1 stable (right in all 5 baseline runs), 1 noisy" in text
    stable = text.index("**Newly failing, stable (right in all 5 baseline runs) (1):**")
    noisy = text.index("**Newly failing, noisy (right in some baseline runs) (1):**")
    passing = text.index("**Newly passing (wrong in some baseline runs) (1):**")
    assert stable < noisy < passing


def test_a_configs_comparison_is_named_and_a_path_outside_the_repository_is_its_name() -> None:
    """A path of this machine (a baseline outside the rootdir) never reaches the summary."""
    base = _block(SINGLE, path="/home/ci/work/baselines/release.gsm8k")
    text = "\n".join(against_baseline(base, QUESTIONS, config="Qwen3-8B"))
    assert "/home/ci" not in text
    assert text.startswith("**Qwen3-8B: against its baseline** `release.gsm8k`:")
    assert "**Qwen3-8B: newly failing (9):**" in text
    assert "**Qwen3-8B: newly passing (1):**" in text


def test_a_subset_comparison_says_on_what() -> None:
    base = {**_block(SINGLE), "subset": True, "baseline_n": 50, "not_in_baseline": 3}
    accuracy = against_baseline(base, QUESTIONS)[2]
    assert accuracy.startswith(
        "- accuracy: 0.9750 -\\> 0.7750 on the 40 problems shared with the baseline's 50 (subset); "
        "3 of this run's problems are not in it; diff "
    )


def test_a_written_baseline_is_one_line_and_no_comparison_is_none() -> None:
    written = {"path": "__snapshots__/gsm8k/b.gsm8k", "written": True, "partial": False}
    assert against_baseline(written, QUESTIONS) == [
        "Baseline written: `__snapshots__/gsm8k/b.gsm8k`.",
        "",
    ]
    assert against_baseline({}, QUESTIONS) == []
    refused = {"path": "b.gsm8k", **_block(SINGLE), "shared": 0}
    assert against_baseline(refused, QUESTIONS) == []  # the gate says why
