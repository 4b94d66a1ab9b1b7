"""The ``vllm`` and ``sglang`` presets against what the engines' scripts send and score.

``tests/data/vllm_requests.json`` was recorded by ``tests/data/record_vllm.py`` from vLLM's
real ``gsm8k_eval.py`` against ``tests/fakeserver.py`` (the bytes as received); the
script is not needed here. Every recorded body is rebuilt from the plugin's own dataset
loader and compared byte for byte, and the script's accuracies are recomputed with the
``last-int`` rule from the answers it got. SGLang's script needs SGLang's runtime, so its
prompt is checked against the script's construction written out here independently.
"""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from helpers import VLLM_RECORDING

from pytest_gsm8k.core import presets
from pytest_gsm8k.core.engine_ci import (
    fewshot_prompt,
    sglang_request,
    vllm_body,
    vllm_param_error,
    vllm_request,
)
from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.scoring import last_int, numbers_equal
from pytest_gsm8k.core.settings import SettingsError, build_settings, parse_params
from pytest_gsm8k.core.types import Api, Problem
from pytest_gsm8k.runtime.data import load_split

RECORDED: dict[str, Any] = json.loads(VLLM_RECORDING.read_text(encoding="utf-8"))
RUNS: dict[str, dict[str, Any]] = RECORDED["runs"]
INVALID = -9999999  # gsm8k_eval.py's "no answer"
PARAM_KEYS = ("top_p", "top_k", "reasoning_effort", "chat_template_kwargs")


@pytest.fixture(scope="module")
def eval_problems(gsm8k_data: Path) -> tuple[Problem, ...]:
    return load_split(str(gsm8k_data), "test", "main").problems


@pytest.fixture(scope="module")
def train_rows(gsm8k_data: Path) -> list[tuple[str, str]]:
    return [(p.question, p.answer) for p in load_split(str(gsm8k_data), "train", "main").problems]


def _options(kwargs: dict[str, Any]) -> tuple[str, int, tuple[tuple[str, str], ...]]:
    """A recorded run's evaluate_gsm8k arguments as the preset's api, shots and params."""
    api = "chat" if kwargs.get("use_chat_completions") else "completions"
    given = [f"{key}={json.dumps(kwargs[key])}" for key in PARAM_KEYS if key in kwargs]
    return api, int(kwargs["num_shots"]), parse_params(given)


REQUEST_CASES = [
    pytest.param(name, i, id=f"{name}-{req['problem_index']}")
    for name, run in RUNS.items()
    for i, req in enumerate(run["requests"])
]


@pytest.mark.parametrize(("name", "i"), REQUEST_CASES)
def test_vllm_request_is_the_scripts_bytes(
    name: str, i: int, eval_problems: tuple[Problem, ...], train_rows: list[tuple[str, str]]
) -> None:
    run = RUNS[name]
    recorded = run["requests"][i]
    api, shots, params = _options(run["kwargs"])
    request = vllm_request(eval_problems[recorded["problem_index"]], train_rows, api, shots, params)  # type: ignore[arg-type]
    assert request.wire == recorded["raw"]
    assert request.body("ignored-model") == json.loads(recorded["raw"])  # what the cache stores
    assert "model" not in request.body("ignored-model")


def test_vllm_full_split_bodies_hash_as_recorded(
    eval_problems: tuple[Problem, ...], train_rows: list[tuple[str, str]]
) -> None:
    run = RUNS["completions_full"]
    wires = [vllm_request(p, train_rows, "completions", 5, ()).wire or "" for p in eval_problems]
    assert len(wires) == run["n_requests"] == 1319
    assert hashlib.sha256("\n".join(wires).encode("utf-8")).hexdigest() == run["sha256"]


def test_vllm_body_key_order_and_escapes() -> None:
    """What json.dumps with its defaults does, spelled out: the separators, the order the
    script builds its dict in, non-ASCII escaped; a changed order is another body."""
    assert vllm_body("Q é") == (
        '{"prompt": "Q \\u00e9", "max_tokens": 256, "stop": ["Question", "Assistant:", '
        '"<|separator|>"], "temperature": 0.0, "seed": 42}'
    )
    assert vllm_body("Q", "chat") == (
        '{"messages": [{"role": "user", "content": "Q"}], "max_tokens": 256, '
        '"temperature": 0.0, "seed": 42}'
    )
    # the command line's types: --top-p 1 is 1.0, a param written 20.0 for top_k is 20
    assert vllm_body("Q", params=parse_params(["top_k=20.0", "top_p=1"])).endswith(
        '"seed": 42, "top_p": 1.0, "top_k": 20}'
    )


@pytest.mark.parametrize(
    ("params", "api", "message"),
    [
        (["logprobs=1"], "completions", "--gsm8k-param logprobs: --gsm8k-preset vllm sends only"),
        (["reasoning_effort=low"], "completions", "with --gsm8k-api completions that is top_p"),
        (["top_k=1.5"], "completions", "--gsm8k-param top_k: expected a whole number"),
        (["top_p=high"], "completions", "--gsm8k-param top_p: expected a number"),
        (["chat_template_kwargs=1"], "chat", "chat_template_kwargs: expected a JSON object"),
    ],
)
def test_vllm_params_beyond_the_scripts_are_refused(
    params: list[str], api: Api, message: str
) -> None:
    """The options refuse a key the script does not send; the body a value it would not."""
    given = {"gsm8k_preset": "vllm", "gsm8k_api": api, "gsm8k_param": params}

    def body() -> str:  # as a run gets there: its settings, then each request's body
        return vllm_body("Q", api, build_settings(lambda o: given.get(o.dest), print).params)

    with pytest.raises((SettingsError, ValueError), match=message.replace("(", r"\(")):
        body()
    assert vllm_param_error(["top_p", "top_k"], api) is None


def test_scripts_labels_are_last_int_of_the_answer(eval_problems: tuple[Problem, ...]) -> None:
    """The script's label per test problem is the last-int rule's gold: the gold number,
    but for the two negative golds (-10 and -3), which it reads without their sign."""
    labels = RECORDED["labels"]
    assert len(labels) == len(eval_problems) == 1319
    differ = []
    for problem, label in zip(eval_problems, labels, strict=True):
        assert last_int(problem.answer) == Decimal(label)
        if problem.gold != label:
            differ.append((problem.index, str(problem.gold)))
    assert differ == [(489, "-10"), (1113, "-3")]


@pytest.mark.parametrize("case", RECORDED["scoring_cases"], ids=lambda c: repr(c["text"][:24]))
def test_last_int_is_get_answer_value(case: dict[str, Any]) -> None:
    value = last_int(case["text"])
    assert value == (None if case["value"] == INVALID else Decimal(case["value"]))


def _literal_last_int(text: str) -> Decimal | None:
    """last_int the slow way: every digit run through ``ast.literal_eval``, as vLLM reads it."""
    import ast
    import re

    runs = re.findall(r"\d+", text.replace(",", ""))
    if not runs:
        return None
    try:
        value = ast.literal_eval(runs[-1])
    except (SyntaxError, ValueError, MemoryError):
        return None
    return Decimal(value) if isinstance(value, int) else None


def test_last_ints_fast_path_reads_what_literal_eval_reads() -> None:
    """Plain ASCII digit runs skip literal_eval; leading zeros, other scripts' digits and
    runs near Python's 4300-digit limit still go through it, with the same answers."""
    import random

    edges = ["0", "00", "007", "10", "1" * 3999, "1" * 4000, "1" * 4001, "1" * 4300, "1" * 4301]
    edges += ["\u0663", "12\u0663", "x 5 y 0012", "-3", "a1,234b", "1,2", "0,5"]
    rnd = random.Random(7)
    texts = edges + [
        "".join(rnd.choice("0123456789 ,a-.\u0663") for _ in range(rnd.randint(0, 14)))
        for _ in range(5000)
    ]
    for text in texts:
        assert last_int(text) == _literal_last_int(text), text[:40]


@pytest.mark.parametrize("name", [n for n, run in RUNS.items() if "answers" in run])
def test_scripts_accuracy_recomputed_with_last_int(
    name: str, eval_problems: tuple[Problem, ...]
) -> None:
    run = RUNS[name]
    answers = run["answers"]
    right = invalid = 0
    for answer in answers:
        problem = eval_problems[answer["problem_index"]]
        value = last_int(answer["text"])
        invalid += value is None
        right += numbers_equal(value, last_int(problem.answer))
    assert right / len(answers) == pytest.approx(run["accuracy"])
    assert invalid / len(answers) == pytest.approx(run["invalid_rate"])


def _sglang_example(lines: list[tuple[str, str]], i: int, include_answer: bool) -> str:
    """few_shot_gsm8k.py's get_one_example, written out again from the script."""
    text = "Question: " + lines[i][0] + "\nAnswer:"
    if include_answer:
        text += " " + lines[i][1]
    return text


def test_sglang_request_is_the_scripts_prompt_and_sampling(
    eval_problems: tuple[Problem, ...],
) -> None:
    lines = [(p.question, p.answer) for p in eval_problems]
    for shots in (5, 0, 2):
        few_shot = "".join(_sglang_example(lines, i, True) + "\n\n" for i in range(shots))
        for problem in (eval_problems[0], eval_problems[7], eval_problems[1318]):
            request = sglang_request(problem, lines, shots, ())
            assert request.prompt == few_shot + _sglang_example(lines, problem.index, False)
            body = request.body("m")
            assert body == {
                "model": "m",
                "prompt": request.prompt,
                "temperature": 0.0,
                "max_tokens": 512,
                "stop": ["Question", "Assistant:", "<|separator|>"],
            }
            assert request.wire is None


def test_fewshot_prompt_needs_enough_rows() -> None:
    with pytest.raises(ValueError, match="--gsm8k-shots 3: only 2 examples are available"):
        fewshot_prompt("q", [("a", "b"), ("c", "d")], 3)


def test_preset_settings_is_what_the_option_table_applies() -> None:
    """The public entry for a caller that builds runs itself (a vLLM config's num_fewshot)."""
    settings = presets.preset_settings("vllm", shots=8)
    assert settings == {
        "preset": "vllm",
        "api": "completions",
        "protocol": "test@1",
        "temperature": 0.0,
        "shots": 8,
        "max_tokens": 256,
        "stop": ("Question", "Assistant:", "<|separator|>"),
        "extract": "last-int",
    }
    chat = presets.preset_settings("vllm", api="chat")
    assert chat["stop"] == ()
    assert chat["shots"] == 5
    assert presets.preset_settings("sglang")["max_tokens"] == 512
    with pytest.raises(ValueError, match="--gsm8k-preset sglang sends to completions only"):
        presets.preset_settings("sglang", api="chat")
    assert presets.preset_settings("lm-eval", shots=3)["shots"] == 5  # settings refuses 3
    given = {"gsm8k_preset": "lm-eval", "gsm8k_shots": "3"}
    with pytest.raises(SettingsError, match="--gsm8k-preset lm-eval sets --gsm8k-shots itself"):
        build_settings(lambda o: given.get(o.dest), lambda note: None)
    with pytest.raises(ValueError, match="unknown preset 'helm'"):
        presets.preset_settings("helm")


def test_the_presets_version_names_the_recorded_script_and_is_part_of_the_identity() -> None:
    """The vllm preset names the script it copies by content (the recording's sha256); a
    protocol's identity carries it, so a baseline of an older copy is never compared."""
    from pytest_gsm8k.core.prompts import Protocol

    version = presets.VLLM.version
    assert RECORDED["script_sha256"].startswith(version.rsplit(" ", 1)[1])
    ours = Protocol(api="completions", preset="vllm", extractor="last-int")
    assert ours.identity()["preset_version"] == version
    assert "preset_version" not in Protocol(api="completions").identity()


def test_sends_model_is_what_each_presets_bodies_say(
    eval_problems: tuple[Problem, ...], train_rows: list[tuple[str, str]]
) -> None:
    """The model under test is the one named: a run checks who answers a request that names
    no model (GET /v1/models, the replies) for the presets whose bodies name none, so
    :func:`presets.sends_model` must be what the bodies themselves say, in every API."""
    problem = eval_problems[0]
    asked: list[tuple[str, Api]] = [("vllm", "completions"), ("vllm", "chat")]
    asked += [("sglang", "completions"), ("lm-eval", "completions"), ("lm-eval", "chat")]
    bodies = {  # each preset's request as a run builds it
        (name, api): Protocol(api=api, shots=5, preset=name, train=tuple(train_rows))
        .request(problem)
        .body("m")
        for name, api in asked
    }
    assert {name for name, _ in bodies} == set(presets.PRESETS)
    for (name, api), body in bodies.items():
        assert ("model" in body) is presets.sends_model(name), (name, api)
    assert not presets.sends_model("vllm")
    assert presets.sends_model(None)  # the plugin's own requests name the model
