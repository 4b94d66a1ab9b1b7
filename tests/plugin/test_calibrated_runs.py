"""The calibrated baseline and the noise-aware gate, end to end.

Real runs (pytester), plain and under ``-n 2``, against the loopback fake server in its noisy
mode: 10% of the selected problems answer right with probability 0.5 in every request, the
rest always the same. A baseline recorded with ``--gsm8k-repeats 5`` knows which problems are
noisy; an unchanged rerun passes, a true drop (stable-correct problems turned wrong) fails
with the stable flips listed first. The test itself: tests/unit/core/test_calibrated.py.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import GsmRun, made_once, output, report

from pytest_gsm8k.core import baseline as bl
from pytest_gsm8k.core.dataset import select
from pytest_gsm8k.runtime.data import load_split

LIMIT = 200
BASELINE = Path("__snapshots__") / "gsm8k" / "test@1_0-shot_CoT.gsm8k"


def _selected() -> list[int]:
    """The indices of the problems ``--gsm8k-limit=200`` runs (the default seed)."""
    return [p.index for p in select(load_split(None, "test", "main").problems, LIMIT, 1234)]


def _validate(data: dict[str, object]) -> None:
    """``data`` is a JSON report as its schema says (the baseline block's new fields too)."""
    text = resources.files("pytest_gsm8k").joinpath("schema/report.schema.json").read_text()
    jsonschema.Draft202012Validator(json.loads(text)).validate(data)


def _noisy(seed: int = 5, drop: int = 0) -> Script:
    """10% of the problems noisy at p = 0.5; ``drop`` stable-correct ones of the run wrong."""
    return Script(noisy_rate=0.1, noise_seed=seed, drop=drop, drop_pool=_selected())


def _record(pytester: pytest.Pytester, args: list[str]) -> dict[str, object]:
    result = pytester.runpytest(
        *args, "--gsm8k-repeats=5", "--snapshot-update", "--gsm8k-report=base.json"
    )
    assert result.ret == 0, output(result)
    document = bl.loads((pytester.path / BASELINE).read_text(), "baseline")
    return document


#: the noise draws ``_record_noisy``'s recording took in this process
_DRAWS: dict[int, int] = {}


def _record_noisy(
    pytester: pytest.Pytester, server: FakeOpenAIServer, args: list[str]
) -> dict[str, object]:
    """``_record`` of ``_noisy()`` (1,000 answers), made once per process: a later test gets
    its baseline and report files, and its server the draws the recording took, so that its
    runs get the answers they got after a recording of their own."""

    def record() -> None:
        _record(pytester, args)
        _DRAWS.update(server.noise_draws())

    if not made_once("calibrated K=5", pytester.path, [BASELINE, "base.json"], record):
        server.take_noise_draws(_DRAWS)
    return bl.loads((pytester.path / BASELINE).read_text(), "baseline")


def test_calibrated_baseline_passes_an_unchanged_rerun_and_fails_a_true_drop(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    server.set_script(_noisy())
    args = [*gsm8k_args, f"--gsm8k-limit={LIMIT}", "--gsm8k-no-cache"]
    document = _record_noisy(pytester, server, args)
    selected = _selected()
    noisy = {f"test-{i:04d}" for i in selected if server.script.noisy(i)}
    # the baseline: K=5 per problem, one line per problem, and its calibration
    calibration = document["calibration"]
    assert isinstance(calibration, dict)
    assert calibration["repeats"] == 5
    problems = document["problems"]
    assert isinstance(problems, dict)
    assert len(problems) == LIMIT
    entries = list(problems.values())
    assert all(set(e) == {"correct", "outcome", "repeats"} for e in entries)
    assert all(e["repeats"] == 5 for e in entries)
    seen_noisy = {pid for pid, e in problems.items() if 0 < e["correct"] < 5}
    assert seen_noisy <= noisy  # a stable problem never looks noisy
    assert len(seen_noisy) >= len(noisy) - 3  # a noisy one looks stable with chance 1/16
    assert calibration["noisy"] == len(seen_noisy)
    assert calibration["stable_correct"] + calibration["stable_wrong"] + len(seen_noisy) == LIMIT
    text = (pytester.path / BASELINE).read_text()
    assert text == bl.dumps(document)
    assert len(text.splitlines()) < LIMIT + 60  # one line per problem, small and diffable
    base_report = report(pytester, "base.json")
    assert all(len(p["repeats"]) == 5 for p in base_report["problems"])
    # the per-answer rate (the test@1 estimate) beside the most-common-answer accuracy
    right = sum(e["correct"] for e in entries)
    repeats = base_report["repeats"]
    assert repeats["per_problem"] == 5
    assert repeats["answers"] == 5 * LIMIT
    assert repeats["mean_accuracy"] == pytest.approx(right / (5 * LIMIT), abs=1e-6)
    low, high = repeats["ci95"]
    assert low <= repeats["mean_accuracy"] <= high
    _validate(base_report)

    # an unchanged rerun (one run per problem): its noisy problems flip, the gate passes
    result = pytester.runpytest(*args, "--gsm8k-report=r.json", "--gsm8k-markdown=s.md")
    assert result.ret == 0, output(result)
    result.stdout.fnmatch_lines(
        [
            f"*noise: baseline of 5 runs per problem: {calibration['stable_correct']} "
            f"stable-correct, {calibration['stable_wrong']} stable-wrong, "
            f"{calibration['noisy']} noisy (flip rate *); the gate detects a drop of * points "
            f"or more spread over the noisy problems (* problems; 80% power, n={LIMIT}, "
            "alpha=0.01); *",
            "*gate baseline: PASS: p=* >= --gsm8k-alpha 0.01 (noise-aware, baseline 5 runs per "
            "problem)*",
        ]
    )
    unchanged = report(pytester)["baseline"]
    assert unchanged["stable_flips"] == []
    assert unchanged["noisy_failing"]  # the noise is there, and is not a regression
    assert set(unchanged["noisy_failing"]) <= seen_noisy

    # a true drop: 26 stable-correct problems turned wrong (13 points): FAIL, stable flips first
    server.set_script(_noisy(drop=26))
    dropped = sorted(f"test-{i:04d}" for i in server.script.dropped(1319))
    assert len(dropped) == 26
    result = pytester.runpytest(
        *args, "--gsm8k-report=r.json", "--gsm8k-markdown=s.md", "--gsm8k-html=p.html"
    )
    assert result.ret == 1, output(result)
    lines = result.stdout.lines
    stable_line = next(
        i for i, line in enumerate(lines) if "newly failing, stable (right in all 5" in line
    )
    assert lines[stable_line].split(": ", 1)[1].startswith(", ".join(dropped[:10]))
    noisy_lines = [i for i, line in enumerate(lines) if "newly failing, noisy (right" in line]
    assert all(i > stable_line for i in noisy_lines)
    result.stdout.fnmatch_lines(
        [
            "*gate baseline: FAIL: p=* < --gsm8k-alpha 0.01 (noise-aware, baseline 5 runs per "
            "problem): * newly failing: 26 stable (right in all 5 baseline runs), * noisy; diff *"
        ]
    )
    data = report(pytester)
    _validate(data)
    base = data["baseline"]
    assert base["stable_flips"] == dropped
    assert set(base["noisy_failing"]) <= seen_noisy
    assert base["p_value"] < 0.01
    assert base["repeats"] == {"baseline": 5, "run": 1}
    assert base["stability"]["noisy"] == calibration["noisy"]
    keys = list(base)
    assert keys.index("stable_flips") < keys.index("noisy_failing")
    markdown = (pytester.path / "s.md").read_text()
    stable_at = markdown.index("**Newly failing, stable (right in all 5 baseline runs) (26):**")
    assert len(base["newly_failing"]) == 26 + len(base["noisy_failing"])  # counts add up
    assert markdown.index(f"`{dropped[0]}`") > stable_at
    if base["noisy_failing"]:
        assert markdown.index("**Newly failing, noisy (right in some baseline runs)") > stable_at
    page = (pytester.path / "p.html").read_text()
    assert "26 stable (right in all 5 baseline runs)" in page


def test_candidate_repeats_are_compared_as_a_mean(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    """--gsm8k-repeats on the candidate: K asks per problem, one item each, the gate on
    the mean; the same protocol label and baseline file as a single run (K is not in it)."""
    server.set_script(_noisy())
    args = [*gsm8k_args, f"--gsm8k-limit={LIMIT}", "--gsm8k-no-cache"]
    _record_noisy(pytester, server, args)
    server.reset()
    result = pytester.runpytest(*args, "--gsm8k-repeats=3", "--gsm8k-report=r.json")
    assert result.ret == 0, output(result)
    assert server.stats()["requests_by_path"]["/v1/chat/completions"] == 3 * LIMIT
    data = report(pytester)
    assert data["n"] == LIMIT  # items stay one per problem
    assert data["baseline"]["repeats"] == {"baseline": 5, "run": 3}
    assert data["protocol"]["label"] == "test@1, 0-shot CoT"
    result.stdout.fnmatch_lines(["*gate baseline: PASS*"])

    server.set_script(_noisy(drop=26))
    result = pytester.runpytest(*args, "--gsm8k-repeats=3", "--gsm8k-report=r.json")
    assert result.ret == 1, output(result)
    flips = set(report(pytester)["baseline"]["stable_flips"])
    dropped = {f"test-{i:04d}" for i in server.script.dropped(1319)}
    # every dropped problem, and at most a noisy one that was right 5 times of 5 by chance
    assert dropped <= flips
    assert len(flips - dropped) <= 2


def test_a_calibrated_baseline_is_not_replaced_by_one_of_fewer_runs(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    """--snapshot-update without --gsm8k-repeats once replaced a K=5 baseline with a
    single-run one, without a word: the gate then fell back to McNemar and lost its power."""
    server.set_script(_noisy())
    args = [*gsm8k_args, "--gsm8k-limit=20", "--gsm8k-no-cache"]
    _record(pytester, args)
    recorded = (pytester.path / BASELINE).read_text()
    for fewer in ([], ["--gsm8k-repeats=3"]):
        result = pytester.runpytest(*args, *fewer, "--snapshot-update")
        out = output(result)
        assert result.ret == 1, out
        made = "3 runs" if fewer else "1 run"
        result.stdout.fnmatch_lines(
            [
                f"*gate baseline: FAIL: not written to {BASELINE}: it is calibrated over 5 runs "
                f"per problem and this run made {made}; record it with --gsm8k-repeats 5*"
            ]
        )
        assert (pytester.path / BASELINE).read_text() == recorded
    assert pytester.runpytest(*args, "--gsm8k-repeats=5", "--snapshot-update").ret == 0


def test_repeats_resume_from_the_cache_per_repeat(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_run: GsmRun,
) -> None:
    """Repeat 0 keeps the key of a run without repeats; each further repeat has its own:
    a K=3 run resumed after a plain one asks only repeats 1 and 2, and a resumed rerun asks
    nothing."""
    args = ["--gsm8k-limit=20", "--gsm8k-cache-dir=cache", "--gsm8k-resume"]
    gsm8k_run(*args, report=None)
    assert server.stats()["requests_by_path"]["/v1/chat/completions"] == 20
    server.reset()
    gsm8k_run(*args, "--gsm8k-repeats=3", report=None)
    assert server.stats()["requests_by_path"]["/v1/chat/completions"] == 40
    server.reset()
    result, _ = gsm8k_run(*args, "--gsm8k-repeats=3", "-n", "2", report=None)
    assert server.stats()["requests_by_path"].get("/v1/chat/completions", 0) == 0
    result.stdout.fnmatch_lines(["*answers from cache: 20 of 20*"])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--gsm8k-repeats=0"], "gsm8k: --gsm8k-repeats: must be >= 1 and <= 100, got 0"),
        (["--gsm8k-repeats=101"], "gsm8k: --gsm8k-repeats: must be >= 1 and <= 100, got 101"),
        (
            ["--gsm8k-repeats=3", "--gsm8k-protocol=maj@4"],
            "gsm8k: --gsm8k-repeats 3: repeats measure a single-sample protocol's run-to-run "
            "noise; --gsm8k-protocol maj@4 samples already (use test@1, or --gsm8k-repeats 1)",
        ),
    ],
)
def test_repeats_refusals_are_one_line(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
    extra: list[str],
    message: str,
) -> None:
    result = pytester.runpytest(*gsm8k_args, "--gsm8k-limit=5", *extra)
    assert result.ret != 0
    text = output(result)
    assert message in text, text
    assert "Traceback" not in text


def test_repeats_headline_and_min_acc_are_the_mean_over_every_answer(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    """Issue 32, point 1: with --gsm8k-repeats K the headline, the report's accuracy and
    --gsm8k-min-acc are test@1, the mean over every answer, not each problem's most common
    answer (maj@K, named so). Point 2: against a calibrated baseline the baseline line
    compares mean with mean, with the same diff and interval as the gate's line."""
    server.set_script(_noisy())
    args = [*gsm8k_args, f"--gsm8k-limit={LIMIT}", "--gsm8k-no-cache"]
    document = _record_noisy(pytester, server, args)
    base = report(pytester, "base.json")
    answers = [p["repeats"] for p in base["problems"]]
    mean = sum(r.count("correct") for r in answers) / (5 * LIMIT)
    majority = sum(1 for p in base["problems"] if p["correct"]) / LIMIT
    assert mean != majority  # the noise makes them differ on this script
    assert base["accuracy"] == pytest.approx(mean, abs=1e-12)
    assert base["repeats"]["majority_accuracy"] == pytest.approx(majority, abs=1e-6)
    assert f"= {mean:.4f}" in base["headline"]
    low, high = base["ci95"]
    assert low < mean < high
    assert document["accuracy"] == pytest.approx(mean, abs=1e-6)
    # a min-acc between the two: the mean decides, in the gate's own words
    between = (mean + majority) / 2
    result = pytester.runpytest(
        *args, "--gsm8k-repeats=5", f"--gsm8k-min-acc={between}", "--gsm8k-report=r.json"
    )
    out = output(result)
    data = report(pytester)
    shown = data["accuracy"]
    assert (result.ret == 0) == (shown >= between), out
    gate = next(g for g in data["gates"] if g["name"] == "min-acc")
    assert gate["value"] == pytest.approx(shown)
    assert "mean of 5 answers each" in gate["detail"]
    result.stdout.fnmatch_lines(["*maj@5 (each problem's most common answer*"])
    # like with like: the baseline line's diff is the gate's, one estimate, one interval
    line = next(x for x in result.stdout.lines if x.startswith("    accuracy: "))
    diff = line.split("; ", 1)[1]
    assert diff.startswith("diff ")
    assert "[95% CI " in diff
    gate_line = next(x for x in result.stdout.lines if "gate baseline:" in x)
    assert gate_line.endswith(diff)
    assert data["baseline"]["current_accuracy"] == pytest.approx(shown, abs=1e-9)


def test_a_rise_beyond_the_noise_warns_and_does_not_fail(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    """Issue 32, point 6: a candidate better than the baseline beyond its noise (26
    problems wrong in all 5 baseline runs are right now) prints one warning naming the usual
    causes, and the gate passes; a rerun of the baseline's own model does not warn."""
    server.set_script(_noisy(drop=26))
    args = [*gsm8k_args, f"--gsm8k-limit={LIMIT}", "--gsm8k-no-cache"]
    _record(pytester, args)
    warning = "WARNING: better than the baseline beyond its noise"
    same = pytester.runpytest(*args, "--gsm8k-report=r.json")
    assert same.ret == 0, output(same)
    assert warning not in output(same)
    assert report(pytester)["baseline"]["p_values"]["rise"] >= 0.01

    server.set_script(_noisy())
    result = pytester.runpytest(*args, "--gsm8k-report=r.json")
    assert result.ret == 0, output(result)
    assert output(result).count(warning) == 1
    result.stdout.fnmatch_lines(
        [
            f"*{warning} (p=* < --gsm8k-alpha 0.01; diff +*): check for a changed prompt or "
            "extractor, the wrong model or endpoint, or contamination before trusting it",
            "*gate baseline: PASS: p=* >= --gsm8k-alpha 0.01 (noise-aware, baseline 5 runs per "
            "problem)*",
        ]
    )
    base = report(pytester)["baseline"]
    assert base["p_values"]["rise"] < 0.01
    assert base["difference"] > 0
    assert base["stable_flips"] == []


def test_health_gates_with_repeats_count_every_answer(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    gsm8k_args: list[str],
    keyed_env: str,
) -> None:
    """Issue 32, point 1: with --gsm8k-repeats K a health gate's share is over every answer
    (the mean), not each problem's most common answer. 4 of 20 problems answer unparsed in
    1 of their 5 answers: 4 of 100 answers (4.0%). A majority would see 0 unparsed problems
    (pass at any rate), "any answer" 4 of 20 problems (20%: fail at 0.04)."""
    problems = load_split(None, "test", "main").problems
    chosen = [p.index for p in select(problems, 20, 1234)][:4]
    golds = {i: str(problems[i].gold) for i in chosen}

    def script() -> Script:
        # the server's sample counter is per problem: each problem's first answer unparsed
        return Script(samples={i: [None, g, g, g, g] for i, g in golds.items()})

    args = [
        *gsm8k_args,
        "--gsm8k-limit=20",
        "--gsm8k-no-cache",
        "--gsm8k-repeats=5",
        "--gsm8k-temperature=0.7",  # the server serves scripted samples only when sampling
        "--gsm8k-report=r.json",
    ]
    server.set_script(script())
    result = pytester.runpytest(*args, "--gsm8k-max-unparsed=0.03")
    assert result.ret == 1, output(result)
    assert (
        "  gate max-unparsed: FAIL: 4.0% of 100 answers unparsed (4; 3 allowed) > "
        "--gsm8k-max-unparsed 0.03"
    ) in result.stdout.lines
    gate = next(g for g in report(pytester)["gates"] if g["name"] == "max-unparsed")
    assert gate["value"] == pytest.approx(0.04)

    server.set_script(script())
    looser = pytester.runpytest(*args, "--gsm8k-max-unparsed=0.04")
    assert looser.ret == 0, output(looser)
    assert (
        "  gate max-unparsed: PASS: 4.0% of 100 answers unparsed (4; 4 allowed) <= "
        "--gsm8k-max-unparsed 0.04"
    ) in looser.stdout.lines
