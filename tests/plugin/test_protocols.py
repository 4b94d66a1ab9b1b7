"""Protocols end to end: pass@N, maj@N, pass@k, few-shot, completions, bad input.

The scripted server serves known samples per problem, so every number below is
computed by hand from the script, not read back from the plugin.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_EXTRA_PLUGINS, TEST_KEY, GsmRun

from pytest_gsm8k.core.scoring import gold_number

N_PROBLEMS = 6


@pytest.fixture
def six(tmp_path: Path, gsm8k_data: Path) -> tuple[Path, list[str]]:
    """The first six test problems as a small data file, and their gold numbers."""
    lines = (gsm8k_data / "test.jsonl").read_text().splitlines()[:N_PROBLEMS]
    path = tmp_path / "six.jsonl"
    path.write_text("\n".join(lines) + "\n")
    (tmp_path / "train.jsonl").symlink_to(gsm8k_data / "train.jsonl")  # exemplars' source
    golds = [str(gold_number(json.loads(line)["answer"])) for line in lines]
    return path, golds


def sample_script(golds: list[str]) -> Script:
    """Hand-designed samples (N=4); see the expectations in ``EXPECTED``."""
    g = golds
    w = [str(int(x) + 1) for x in golds]
    w2 = [str(int(x) + 2) for x in golds]
    return Script(
        samples={
            0: [g[0], g[0], w[0], None],  # pass, 2 correct; maj g (2 vs 1)
            1: [w[1], w[1], g[1], None],  # pass, 1 correct; maj w (2 vs 1) -> wrong
            2: [None, None, None, None],  # nothing parsed
            3: [w[3], g[3], w[3], g[3]],  # pass, 2 correct; maj tie 2-2, w first -> wrong
            4: [g[4], g[4], g[4], g[4]],  # 4 correct
            5: [w[5], w2[5], w[5], w2[5]],  # 0 correct; maj w (tie, first) -> wrong
        }
    )


EXPECTED_N_CORRECT = [2, 1, 0, 2, 4, 0]
EXPECTED_PASS = [True, True, False, True, True, False]
EXPECTED_MAJ = [True, False, False, False, True, False]
# pass@k = mean over problems of 1 - C(n-c, k) / C(n, k), n = 4
EXPECTED_PASS_AT = {
    "pass@1": (2 + 1 + 0 + 2 + 4 + 0) / 4 / 6,
    "pass@2": (5 / 6 + 1 / 2 + 0 + 5 / 6 + 1 + 0) / 6,
    "pass@4": 4 / 6,
}


@pytest.fixture(params=[True, False], ids=["n-honoured", "n-ignored"])
def sampling_server(request: pytest.FixtureRequest, gsm8k_data: Path) -> Iterator[FakeOpenAIServer]:
    srv = FakeOpenAIServer(
        gsm8k_data / "test.jsonl", model="fake-model", api_key=TEST_KEY, honour_n=request.param
    )
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _args(server: FakeOpenAIServer, data: Path, *extra: str) -> list[str]:
    return [
        "--gsm8k-model=fake-model",
        f"--gsm8k-base-url={server.base_url}",
        f"--gsm8k-data={data}",
        "--gsm8k-report=r.json",
        *NO_EXTRA_PLUGINS,
        *extra,
    ]


@pytest.mark.parametrize("protocol", ["pass@4", "maj@4"])
def test_sampled_protocols_match_hand_computed_values(
    pytester: pytest.Pytester,
    sampling_server: FakeOpenAIServer,
    six: tuple[Path, list[str]],
    keyed_env: str,
    protocol: str,
) -> None:
    data, golds = six
    sampling_server.set_script(sample_script(golds))
    result = pytester.runpytest(*_args(sampling_server, data, f"--gsm8k-protocol={protocol}"))
    assert result.ret == 0, result.stdout.str()
    report = json.loads((pytester.path / "r.json").read_text())
    problems = sorted(report["problems"], key=lambda p: p["index"])
    assert [p["n_samples"] for p in problems] == [4] * N_PROBLEMS
    assert [p["n_correct"] for p in problems] == EXPECTED_N_CORRECT
    expected = EXPECTED_PASS if protocol == "pass@4" else EXPECTED_MAJ
    assert [p["correct"] for p in problems] == expected
    assert report["accuracy"] == pytest.approx(sum(expected) / N_PROBLEMS)
    assert report["protocol"]["name"] == protocol
    assert report["protocol"]["temperature"] == 0.7
    result.stdout.fnmatch_lines([f"gsm8k acc ({protocol}, 0-shot CoT) = {sum(expected) / 6:.4f}*"])
    stats = sampling_server.stats()
    per_problem = 1 if sampling_server.honour_n else 4  # one call with n=4, or four calls
    assert stats["requests_by_path"].get("/v1/chat/completions") == per_problem * N_PROBLEMS
    if protocol == "pass@4":
        for key, value in EXPECTED_PASS_AT.items():
            assert report["pass_at_k"][key] == pytest.approx(value), key
        result.stdout.fnmatch_lines(["*pass@1 0.3750, pass@2 0.5278, pass@4 0.6667*"])
    else:
        votes = {p["index"]: p["votes"] for p in problems}
        assert votes[3] == [[str(int(golds[3]) + 1), 2], [golds[3], 2]]  # tie: first seen wins
        assert problems[3]["extracted"] == str(int(golds[3]) + 1)
        assert problems[2]["outcome"] == "unparsed"
        assert problems[2]["votes"] == []


#: (honour_n, xdist): under -n 2 the endpoint that ignores n, one call per sample (the case
#: that lost samples); whether the server honours n does not cross processes
@pytest.mark.parametrize(
    ("sampling_server", "xdist"),
    [(True, []), (False, []), (False, ["-n", "2"])],
    ids=["n-honoured-plain", "n-ignored-plain", "n-ignored-xdist"],
    indirect=["sampling_server"],
)
def test_a_resumed_sampled_protocol_is_scored_on_every_sample(
    pytester: pytest.Pytester,
    sampling_server: FakeOpenAIServer,
    six: tuple[Path, list[str]],
    keyed_env: str,
    xdist: list[str],
) -> None:
    """--gsm8k-resume against an endpoint that ignores ``n`` (one call per sample): an
    earlier run's answer, held until this run's first fresh reply, was its first call's
    sample alone, so pass@4 was scored on one sample (4/6 became 2/6, silently). Every
    sample is read back, none asked again."""
    data, golds = six
    sampling_server.set_script(sample_script(golds))
    run = _args(sampling_server, data, "--gsm8k-protocol=pass@4", "--gsm8k-cache-dir=cache", *xdist)
    assert pytester.runpytest(*run).ret == 0
    sampling_server.reset()
    result = pytester.runpytest(*run, "--gsm8k-resume")
    assert result.ret == 0, result.stdout.str()
    problems = sorted(
        json.loads((pytester.path / "r.json").read_text())["problems"], key=lambda p: p["index"]
    )
    assert [p["n_samples"] for p in problems] == [4] * N_PROBLEMS
    assert [p["cached"] for p in problems] == [4] * N_PROBLEMS
    assert [p["correct"] for p in problems] == EXPECTED_PASS
    assert not sampling_server.stats()["requests_by_path"].get("/v1/chat/completions")


def test_few_shot_chat_turns_come_from_train_and_are_the_same_for_every_problem(
    pytester: pytest.Pytester, gsm8k_data: Path, six: tuple[Path, list[str]], keyed_env: str
) -> None:
    data, _ = six
    srv = FakeOpenAIServer(
        gsm8k_data / "test.jsonl", model="fake-model", api_key=TEST_KEY, record=True
    ).start()
    try:
        result = pytester.runpytest(
            *_args(srv, data, "--gsm8k-shots=3", "--gsm8k-system=You are careful.")
        )
        bodies = srv.stats()["bodies"]
    finally:
        srv.stop()
    assert result.ret == 0, result.stdout.str()
    train_questions = {
        json.loads(x)["question"] for x in (gsm8k_data / "train.jsonl").read_text().splitlines()
    }
    shots = None
    for body in bodies:
        roles = [m["role"] for m in body["messages"]]
        assert roles == ["system"] + ["user", "assistant"] * 3 + ["user"]
        exemplars = [m["content"] for m in body["messages"][1:7]]
        assert shots is None or exemplars == shots
        shots = exemplars
        for question_turn in exemplars[::2]:
            assert question_turn.split("\n\n")[0] in train_questions
        assert "<<" not in "".join(exemplars[1::2])  # calculator annotations removed
        assert body["temperature"] == 0.0
        assert "n" not in body
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["protocol"]["shots"] == 3
    assert report["protocol"]["fewshot_source"] == "train (seed 1234)"
    assert report["protocol"]["system_hash"]
    result.stdout.fnmatch_lines(["gsm8k acc (test@1, 3-shot CoT) = 1.0000*"])


def test_completions_api_sends_text_prompt_with_stops(
    pytester: pytest.Pytester, gsm8k_data: Path, six: tuple[Path, list[str]], keyed_env: str
) -> None:
    data, _ = six
    srv = FakeOpenAIServer(
        gsm8k_data / "test.jsonl", model="fake-model", api_key=TEST_KEY, record=True
    ).start()
    try:
        result = pytester.runpytest(
            *_args(
                srv,
                data,
                "--gsm8k-api=completions",
                "--gsm8k-shots=2",
                "--gsm8k-stop=Question:",
                "--gsm8k-stop=\n\n",
            )
        )
        bodies = srv.stats()["bodies"]
    finally:
        srv.stop()
    assert result.ret == 0, result.stdout.str()
    assert len(bodies) == N_PROBLEMS
    for body in bodies:
        assert body["prompt"].count("Question: ") == 3
        assert body["prompt"].endswith("\nAnswer:")
        assert body["stop"] == ["Question:", "\n\n"]
    result.stdout.fnmatch_lines(["gsm8k acc (test@1, 2-shot CoT, completions) = 1.0000*"])


def test_fewshot_file_replaces_train(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    six: tuple[Path, list[str]],
    keyed_env: str,
    tmp_path: Path,
) -> None:
    data, _ = six
    shots = tmp_path / "wei8.jsonl"
    shots.write_text(
        "".join(
            json.dumps(
                {"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}.\n#### {2 * i}"}
            )
            + "\n"
            for i in range(1, 9)
        )
    )
    result = pytester.runpytest(*_args(server, data, f"--gsm8k-fewshot-file={shots}"))
    assert result.ret == 0, result.stdout.str()
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["protocol"]["shots"] == 8
    assert report["protocol"]["fewshot_source"] == "file wei8.jsonl"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gsm8k-protocol=pass@0"], "--gsm8k-protocol pass@0: N must be >= 1 and <= 1024"),
        (["--gsm8k-protocol=maj@-1"], "--gsm8k-protocol maj@-1: N must be >= 1 and <= 1024"),
        (["--gsm8k-protocol=best@3"], "--gsm8k-protocol: expected test@1, pass@N or maj@N"),
        (["--gsm8k-extract=regex"], "--gsm8k-extract: expected one of strict, answer-is"),
        (["--gsm8k-api=grpc"], "--gsm8k-api: expected chat or completions"),
        (["--gsm8k-temperature=3"], "--gsm8k-temperature: must be >= 0 and <= 2, got 3.0"),
    ],
)
def test_bad_protocol_options_are_one_line_errors(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    six: tuple[Path, list[str]],
    keyed_env: str,
    args: list[str],
    message: str,
) -> None:
    data, _ = six
    result = pytester.runpytest(*_args(server, data, *args))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: gsm8k: {message}*"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert server.stats()["requests_total"] == 0


def test_fewshot_file_without_answers_names_file_and_line(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    six: tuple[Path, list[str]],
    keyed_env: str,
    tmp_path: Path,
) -> None:
    data, _ = six
    shots = tmp_path / "bad.jsonl"
    shots.write_text(
        json.dumps({"question": "q1", "answer": "2 #### 2"})
        + "\n"
        + json.dumps({"question": "q2", "answer": "no final line"})
        + "\n"
    )
    result = pytester.runpytest(*_args(server, data, f"--gsm8k-fewshot-file={shots}"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: gsm8k: {shots}:2: *####*"])
    assert server.stats()["requests_total"] == 0


def test_more_shots_than_exemplars_is_an_error(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    six: tuple[Path, list[str]],
    keyed_env: str,
    tmp_path: Path,
) -> None:
    data, _ = six
    shots = tmp_path / "two.jsonl"
    shots.write_text(
        "".join(json.dumps({"question": f"q{i}", "answer": f"#### {i}"}) + "\n" for i in range(2))
    )
    result = pytester.runpytest(
        *_args(server, data, f"--gsm8k-fewshot-file={shots}", "--gsm8k-shots=5")
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: gsm8k: --gsm8k-shots 5: only 2 exemplars are available"])


def test_pass_at_n_at_temperature_zero_warns(
    pytester: pytest.Pytester,
    server: FakeOpenAIServer,
    six: tuple[Path, list[str]],
    keyed_env: str,
) -> None:
    data, _ = six
    result = pytester.runpytest(
        *_args(server, data, "--gsm8k-protocol=pass@3", "--gsm8k-temperature=0")
    )
    result.stdout.fnmatch_lines(
        [
            "*gsm8k: --gsm8k-protocol pass@3 at --gsm8k-temperature 0: "
            "the 3 samples will be identical*"
        ]
    )


def test_think_blocks_and_truncation_warning(server: FakeOpenAIServer, gsm8k_run: GsmRun) -> None:
    # 3 of the first 40 subset problems truncated: 7.5% > 1% -> the headline block warns
    server.set_script(Script(default="think"))
    _, report = gsm8k_run("--gsm8k-limit=40", ret=None)
    assert report["accuracy"] == 1.0  # the wrong number inside <think> never counts
    ids = sorted(p["index"] for p in report["problems"])[:3]
    server.set_script(Script(default="think", behaviours={i: "truncated" for i in ids}))
    result, report = gsm8k_run("--gsm8k-limit=40", "--gsm8k-no-cache", ret=None)
    assert report["counts"]["truncated"] == 3
    result.stdout.fnmatch_lines(
        [
            "*37 correct, 0 wrong, 3 truncated*",
            "*WARNING: 3 of 40 answers (7.5%) were cut by --gsm8k-max-tokens*",
        ]
    )


OWN_PROTOCOL = """
import dataclasses
import pytest
from pytest_gsm8k.session import get_session

@pytest.fixture(scope="session")
def gsm8k_protocol(pytestconfig):
    return dataclasses.replace(get_session(pytestconfig).plan.protocol, max_tokens=123)
"""


@pytest.mark.parametrize("xdist", [[], ["-n", "2"]], ids=["plain", "xdist"])
def test_a_conftest_protocol_is_what_is_prefetched_and_each_problem_is_asked_once(
    pytester: pytest.Pytester,
    gsm8k_data: Path,
    monkeypatch: pytest.MonkeyPatch,
    xdist: list[str],
) -> None:
    """The prefetch asks what the items ask (the override's requests, not the plan's:
    those would be paid for and never used); under xdist each worker asks per item."""
    recording = FakeOpenAIServer(gsm8k_data / "test.jsonl", model="fake-model", record=True)
    recording.start()
    try:
        monkeypatch.setenv("OPENAI_API_KEY", TEST_KEY)
        pytester.makeconftest(OWN_PROTOCOL)
        result = pytester.runpytest(
            "--gsm8k-model=fake-model",
            f"--gsm8k-base-url={recording.base_url}",
            "--gsm8k-limit=6",
            "--gsm8k-concurrency=4",
            "--gsm8k-no-cache",
            *xdist,
            *NO_EXTRA_PLUGINS,
        )
        assert result.ret == 0, result.stdout.str()
        bodies = recording.stats()["bodies"]
        assert len(bodies) == 6  # before: 12, under -n 2 18
        assert {b["max_tokens"] for b in bodies} == {123}
    finally:
        recording.stop()
