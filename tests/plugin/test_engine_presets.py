"""``--gsm8k-preset vllm`` and ``sglang`` through the whole plugin, with and without xdist.

The plugin runs the problems vLLM's ``gsm8k_eval.py`` was recorded on
(``tests/data/vllm_requests.json``) against a server that gives the same answers: the
bytes of every request it receives must be the script's, and the ``last-int`` accuracy
must be the script's. Where the plugin differs on purpose, the test says so: a request
that fails is an ``error``, not a wrong answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer, Script
from helpers import NO_EXTRA_PLUGINS, TEST_KEY, VLLM_RECORDING, GsmRun, xdist_once

RECORDED: dict[str, Any] = json.loads(VLLM_RECORDING.read_text(encoding="utf-8"))


class ReplayServer(FakeOpenAIServer):
    """Answers each problem with the text vLLM's script received from the recording server."""

    def __init__(self, *args: Any, replies: dict[int, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replies = replies

    def _generate(self, idx: int | None, chat: bool, sampling: bool) -> tuple[str, str]:
        if idx is not None and idx in self.replies:
            return self.replies[idx], "stop"
        return super()._generate(idx, chat, sampling)


def _run(
    pytester: pytest.Pytester, server: FakeOpenAIServer, ids: list[int], *args: str
) -> pytest.RunResult:
    selection = " or ".join(f"test-{i:04d}" for i in sorted(ids))
    return pytester.runpytest(
        "--gsm8k-model=fake-model",
        f"--gsm8k-base-url={server.base_url}",
        "--gsm8k-report=r.json",
        "-k",
        selection,
        *NO_EXTRA_PLUGINS,
        *args,
    )


@xdist_once(
    "run,extra",
    [
        ("completions", []),
        ("chat", ["--gsm8k-api=chat"]),
        ("completions_3shot", ["--gsm8k-shots=3"]),
        (
            "chat_params",
            [
                "--gsm8k-api=chat",
                "--gsm8k-param=top_p=0.95",
                "--gsm8k-param=top_k=20",
                "--gsm8k-param=reasoning_effort=low",
                '--gsm8k-param=chat_template_kwargs={"enable_thinking": false}',
            ],
        ),
    ],
    ids=["completions", "chat", "completions_3shot", "chat_params"],
)
def test_vllm_preset_sends_the_scripts_bytes_and_gets_its_accuracy(
    pytester: pytest.Pytester,
    gsm8k_data: Path,
    keyed_env: str,
    run: str,
    extra: list[str],
    xdist: list[str],
) -> None:
    recorded = RECORDED["runs"][run]
    replies = {a["problem_index"]: a["text"] for a in recorded["answers"]}
    server = ReplayServer(gsm8k_data / "test.jsonl", api_key=TEST_KEY, record=True, replies=replies)
    server.start()
    try:
        result = _run(pytester, server, list(replies), "--gsm8k-preset=vllm", *extra, *xdist)
        raws: list[str] = server.stats()["raw_bodies"]
    finally:
        server.stop()
    assert result.ret == 0, result.stdout.str()
    assert sorted(raws) == sorted(r["raw"] for r in recorded["requests"])  # bytes, once each
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["n"] == len(replies)
    assert report["accuracy"] == pytest.approx(recorded["accuracy"])
    assert report["rules"]["last-int"] == pytest.approx(recorded["accuracy"])
    assert report["protocol"]["preset"] == "vllm"
    assert report["protocol"]["extractor"] == "last-int"
    shots = recorded["kwargs"]["num_shots"]
    api = ", completions" if run.startswith("completions") else ""
    label = f"test@1, {shots}-shot CoT{api}, preset vllm, extract last-int"
    result.stdout.fnmatch_lines([f"gsm8k acc ({label}*) = *"])


def test_vllm_preset_outcomes_a_failed_request_is_an_error(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str
) -> None:
    """The script counts a failed request as a wrong answer ("" has no integer); here it is
    an error, and the answers it scores as wrong or invalid keep our categories."""
    recorded = RECORDED["runs"]["completions"]
    replies = {a["problem_index"]: a["text"] for a in recorded["answers"]}
    replies.pop(0)
    server = ReplayServer(
        gsm8k_data / "test.jsonl",
        api_key=TEST_KEY,
        replies=replies,
        script=Script(fail_first={0: {"500": 10}}),
    )
    server.start()
    try:
        result = _run(
            pytester, server, [0, *replies], "--gsm8k-preset=vllm", "--gsm8k-max-retries=0"
        )
    finally:
        server.stop()
    assert result.ret != 0
    report = json.loads((pytester.path / "r.json").read_text())
    outcomes = {p["id"]: p["outcome"] for p in report["problems"]}
    assert outcomes == {
        "test-0000": "error",
        "test-0001": "wrong",
        "test-0002": "correct",
        "test-0003": "wrong",  # "#### 540 ... 3 times": the last integer is 3
        "test-0004": "wrong",  # "#### 20.00": the last integer is 00, that is 0
        "test-0005": "unparsed",
        "test-0006": "unparsed",  # "0260" is no Python integer: the script's INVALID
        "test-0007": "correct",
    }


def test_vllm_preset_resumed_rerun_sends_nothing(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str
) -> None:
    """The vllm preset's cache keys name its exact bytes: a resumed rerun (--gsm8k-resume)
    finds every answer, another body (4 shots) none."""
    server = FakeOpenAIServer(gsm8k_data / "test.jsonl", api_key=TEST_KEY)

    def completions() -> int:
        return int(server.stats()["requests_by_path"].get("/v1/completions", 0))

    server.start()
    try:
        first = _run(pytester, server, [0, 1, 2], "--gsm8k-preset=vllm")
        sent = completions()
        resume = ("--gsm8k-preset=vllm", "--gsm8k-resume")
        second = _run(pytester, server, [0, 1, 2], *resume)
        again = completions() - sent
        third = _run(pytester, server, [0, 1, 2], *resume, "--gsm8k-shots=4")
        other = completions() - sent
    finally:
        server.stop()
    assert first.ret == second.ret == third.ret == 0, third.stdout.str()
    assert sent == 3
    assert again == 0  # every answer from the cache
    assert other == 3  # another body (4 shots) is another key


def test_sglang_preset_sends_its_prompt_to_completions(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str
) -> None:
    """Plain: a preset is what the controller sends, not what crosses to the workers (a
    preset's bytes under -n 2: the vllm preset above)."""
    server = FakeOpenAIServer(gsm8k_data / "test.jsonl", api_key=TEST_KEY, record=True)
    server.start()
    try:
        result = _run(pytester, server, [0, 6], "--gsm8k-preset=sglang")
        bodies: list[dict[str, Any]] = server.stats()["bodies"]
    finally:
        server.stop()
    assert result.ret == 0, result.stdout.str()
    rows = [json.loads(line) for line in (gsm8k_data / "test.jsonl").read_text().splitlines()]
    shots = "".join(f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in rows[:5])
    expected = [
        {
            "model": "fake-model",
            "prompt": f"{shots}Question: {rows[i]['question']}\nAnswer:",
            "temperature": 0.0,
            "max_tokens": 512,
            "stop": ["Question", "Assistant:", "<|separator|>"],
        }
        for i in (0, 6)
    ]
    assert sorted(bodies, key=lambda b: str(b["prompt"])) == sorted(
        expected, key=lambda b: str(b["prompt"])
    )
    result.stdout.fnmatch_lines(["gsm8k acc (test@1, 5-shot CoT, completions, preset sglang, *"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--gsm8k-preset=sglang", "--gsm8k-api=chat"],
            "--gsm8k-preset sglang sends to completions only (its peer has no chat mode); "
            "remove --gsm8k-api",
        ),
        (
            ["--gsm8k-preset=vllm", "--gsm8k-param=logprobs=1"],
            "--gsm8k-param logprobs: --gsm8k-preset vllm sends only what gsm8k_eval.py sends; "
            "with --gsm8k-api completions that is top_p, top_k",
        ),
        (
            ["--gsm8k-preset=vllm", "--gsm8k-system=Be brief."],
            "--gsm8k-preset vllm sets --gsm8k-system itself; remove --gsm8k-system",
        ),
        (
            ["--gsm8k-preset=vllm", "--gsm8k-max-tokens=512"],
            "--gsm8k-preset vllm sets --gsm8k-max-tokens itself; remove --gsm8k-max-tokens",
        ),
        (
            ["--gsm8k-preset=vllm", "--gsm8k-extract=flexible"],
            "--gsm8k-preset vllm sets --gsm8k-extract itself; remove --gsm8k-extract",
        ),
    ],
)
def test_engine_preset_bad_input(
    pytester: pytest.Pytester, gsm8k_run: GsmRun, args: list[str], message: str
) -> None:
    result, _ = gsm8k_run(*args, ret=pytest.ExitCode.USAGE_ERROR, report=None)
    result.stderr.fnmatch_lines([f"ERROR: gsm8k: {message}"])
    assert "Traceback" not in result.stderr.str()


def test_shots_beyond_the_pool_is_one_line(pytester: pytest.Pytester, gsm8k_run: GsmRun) -> None:
    result, _ = gsm8k_run(
        "--gsm8k-preset=sglang", "--gsm8k-shots=2000", ret=pytest.ExitCode.USAGE_ERROR, report=None
    )
    result.stderr.fnmatch_lines(
        ["ERROR: gsm8k: --gsm8k-shots 2000: the preset's example pool has only 1319 rows"]
    )


def test_engine_preset_limit_takes_the_first_problems_and_baselines_keep_it(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str
) -> None:
    """vLLM's num_questions (and SGLang's --num-questions) is the first N problems: under
    an engine preset --gsm8k-limit N is too, and a baseline recorded so is read back so."""
    server = FakeOpenAIServer(gsm8k_data / "test.jsonl", api_key=TEST_KEY, record=True)
    server.start()
    args = (
        "--gsm8k-model=fake-model",
        f"--gsm8k-base-url={server.base_url}",
        "--gsm8k-preset=vllm",
        "--gsm8k-limit=3",
        # three problems reach p = 1/8 at best: a baseline gate at 0.2 can fail (rule 2)
        "--gsm8k-alpha=0.2",
        "--gsm8k-report=r.json",
        *NO_EXTRA_PLUGINS,
    )
    try:
        first = pytester.runpytest(*args, "--snapshot-update")
        prompts = sorted(
            str(b["prompt"]).rsplit("Question: ", 1)[1] for b in server.stats()["bodies"]
        )
        again = pytester.runpytest(*args)
    finally:
        server.stop()
    assert first.ret == 0, first.stdout.str()
    rows = [json.loads(line) for line in (gsm8k_data / "test.jsonl").read_text().splitlines()]
    assert prompts == sorted(f"{r['question']}\nAnswer:" for r in rows[:3])
    first.stdout.fnmatch_lines(["*dataset: *; the first 3 of 1319*"])
    assert again.ret == 0, again.stdout.str()
    again.stdout.fnmatch_lines(["*baseline*3 problems*"])
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["subset"]["first"] is True
    assert [p["id"] for p in report["problems"]] == ["test-0000", "test-0001", "test-0002"]


def test_engine_preset_on_the_whole_split_names_no_first_problems(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str
) -> None:
    """ "The first N" is said only of a limit: an engine preset over the whole split reports
    a subset with no ``first`` key, as a seeded run does."""
    server = FakeOpenAIServer(gsm8k_data / "test.jsonl", api_key=TEST_KEY)
    server.start()
    try:
        result = pytester.runpytest(
            "--gsm8k-model=fake-model",
            f"--gsm8k-base-url={server.base_url}",
            f"--gsm8k-data={gsm8k_data}",
            "--gsm8k-preset=vllm",
            "--gsm8k-no-cache",
            "--gsm8k-report=r.json",
            *NO_EXTRA_PLUGINS,
        )
    finally:
        server.stop()
    assert result.ret == 0, result.stdout.str()
    subset = json.loads((pytester.path / "r.json").read_text())["subset"]
    assert subset["limit"] is None
    assert "first" not in subset, subset
    assert "the first" not in result.stdout.str()


def test_vllm_preset_repeats_send_the_same_bytes_each_time(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str
) -> None:
    """A calibrated baseline of vLLM's protocol: each repeat is the script's body again."""
    recorded = RECORDED["runs"]["completions"]
    server = FakeOpenAIServer(gsm8k_data / "test.jsonl", api_key=TEST_KEY, record=True)
    server.start()
    try:
        result = _run(pytester, server, [0, 2], "--gsm8k-preset=vllm", "--gsm8k-repeats=3")
        raws: list[str] = server.stats()["raw_bodies"]
    finally:
        server.stop()
    assert result.ret == 0, result.stdout.str()
    wanted = [r["raw"] for r in recorded["requests"] if r["problem_index"] in (0, 2)]
    assert sorted(raws) == sorted(wanted * 3)
