"""``--gsm8k-preset lm-eval`` through the whole plugin, against requests recorded from lm-eval.

``tests/data/lm_eval_requests.json`` holds what lm-evaluation-harness 0.4.13 sent
to the scripted server for 8 problems, the answers it got and the scores it
reported (see ``tests/data/record_lm_eval.py``). Here the plugin runs the same 8
problems against a server that returns those same answers: every request body
must equal lm-eval's, and the plugin's strict-match/flexible-extract accuracies
must equal lm-eval's numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fakeserver import FakeOpenAIServer
from helpers import LM_EVAL_RECORDING, NO_EXTRA_PLUGINS, TEST_KEY, GsmRun

RECORDED = json.loads(LM_EVAL_RECORDING.read_text(encoding="utf-8"))


class ReplayServer(FakeOpenAIServer):
    """Answers each problem with the text lm-eval received from the recording server."""

    def __init__(self, *args: Any, replies: dict[int, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replies = replies

    def _generate(self, idx: int | None, chat: bool, sampling: bool) -> tuple[str, str]:
        if idx is not None and idx in self.replies:
            return self.replies[idx], "stop"
        return super()._generate(idx, chat, sampling)


def _canonical(body: dict[str, Any]) -> str:
    body = dict(body)
    body.pop("model", None)
    return json.dumps(body, sort_keys=True, ensure_ascii=False)


@pytest.mark.parametrize(("run", "extra"), [("completions", []), ("chat", ["--gsm8k-api=chat"])])
def test_lm_eval_preset_sends_lm_evals_requests_and_gets_its_scores(
    pytester: pytest.Pytester, gsm8k_data: Path, keyed_env: str, run: str, extra: list[str]
) -> None:
    recorded = RECORDED["runs"][run]
    replies = {s["problem_index"]: s["response"] for s in recorded["samples"]}
    server = ReplayServer(
        gsm8k_data / "test.jsonl",
        model="fake-model",
        api_key=TEST_KEY,
        record=True,
        replies=replies,
    )
    server.start()
    try:
        selection = " or ".join(f"test-{i:04d}" for i in sorted(replies))
        result = pytester.runpytest(
            "--gsm8k-model=fake-model",
            f"--gsm8k-base-url={server.base_url}",
            f"--gsm8k-data={gsm8k_data}",
            "--gsm8k-preset=lm-eval",
            "--gsm8k-report=r.json",
            "-k",
            selection,
            *NO_EXTRA_PLUGINS,
            *extra,
        )
        bodies = server.stats()["bodies"]
    finally:
        server.stop()
    assert result.ret == 0, result.stdout.str()
    sent = sorted(_canonical(b) for b in bodies)
    expected = sorted(_canonical(r["body"]) for r in recorded["requests"])
    assert len(sent) == len(replies) == len(expected)
    assert sent == expected  # byte for byte, key order aside
    report = json.loads((pytester.path / "r.json").read_text())
    assert report["n"] == len(replies)
    for name, value in recorded["metrics"].items():
        assert report["rules"][name] == pytest.approx(value), name
    assert report["accuracy"] == pytest.approx(recorded["metrics"]["strict-match"])
    assert report["protocol"]["preset"] == "lm-eval"
    label = (
        "test@1, 5-shot CoT, completions, preset lm-eval"
        if run == "completions"
        else ("test@1, 5-shot CoT, preset lm-eval")
    )
    result.stdout.fnmatch_lines([f"gsm8k acc ({label}) = *", "*strict-match* *flexible-extract*"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--gsm8k-preset=helm"],
            "--gsm8k-preset: unknown preset 'helm' (valid: lm-eval, sglang, vllm)",
        ),
        (
            ["--gsm8k-preset=lm-eval", "--gsm8k-shots=8"],
            "--gsm8k-preset lm-eval sets --gsm8k-shots itself; remove --gsm8k-shots",
        ),
        (
            ["--gsm8k-preset=lm-eval", "--gsm8k-protocol=maj@4"],
            "--gsm8k-preset lm-eval sets --gsm8k-protocol itself; remove --gsm8k-protocol",
        ),
    ],
)
def test_preset_bad_input(
    pytester: pytest.Pytester, gsm8k_run: GsmRun, args: list[str], message: str
) -> None:
    result, _ = gsm8k_run(*args, ret=pytest.ExitCode.USAGE_ERROR, report=None)
    result.stderr.fnmatch_lines([f"ERROR: gsm8k: {message}"])
