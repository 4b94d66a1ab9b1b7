"""The ``lm-eval`` preset against requests and scores recorded from lm-evaluation-harness.

``tests/data/lm_eval_requests.json`` was recorded by ``tests/data/record_lm_eval.py``
(lm-eval's own CLI against ``tests/fakeserver.py``); lm-eval itself is not
needed here.  Every recorded request is rebuilt with ``pytest_gsm8k.core.presets``
from the plugin's own dataset loader and compared byte for byte, and lm-eval's
reported accuracies are recomputed from the recorded responses.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers import LM_EVAL_RECORDING

from pytest_gsm8k.core import presets
from pytest_gsm8k.core.prompts import Protocol
from pytest_gsm8k.core.settings import build_settings
from pytest_gsm8k.core.types import Problem
from pytest_gsm8k.runtime.data import load_split

RECORDED: dict[str, Any] = json.loads(LM_EVAL_RECORDING.read_text(encoding="utf-8"))
RUNS: dict[str, dict[str, Any]] = RECORDED["runs"]
MODEL: str = RECORDED["model"]


def _canonical(obj: Any) -> str:
    """JSON text that differs whenever the bytes sent would (``0`` vs ``0.0`` included)."""
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


@pytest.fixture(scope="module")
def eval_problems(gsm8k_data: Path) -> tuple[Problem, ...]:
    return load_split(str(gsm8k_data), "test", "main").problems


@pytest.fixture(scope="module")
def train_pool(gsm8k_data: Path) -> list[tuple[str, str]]:
    return [(p.question, p.answer) for p in load_split(str(gsm8k_data), "train", "main").problems]


def _run_options(name: str) -> dict[str, Any]:
    run = RUNS[name]
    chat = name.startswith("chat")
    return {
        "api": "chat" if chat else "completions",
        "system": RECORDED["system_instruction"] if run["system_instruction"] else None,
    }


REQUEST_CASES = [
    pytest.param(name, i, id=f"{name}-{req['problem_index']}")
    for name, run in RUNS.items()
    for i, req in enumerate(run["requests"])
]


def test_fixture_is_from_the_mirrored_version() -> None:
    assert RECORDED["lm_eval_version"] == presets.LM_EVAL_VERSION
    # The completions and chat runs cover the 8 scripted problems, in every variant.
    assert [r["problem_index"] for r in RUNS["completions"]["requests"]] == list(range(8))
    assert [r["problem_index"] for r in RUNS["chat"]["requests"]] == list(range(8))
    assert RUNS["chat"]["fewshot_as_multiturn"] is True
    assert RUNS["chat_singleturn"]["fewshot_as_multiturn"] is False


@pytest.mark.parametrize(("run_name", "position"), REQUEST_CASES)
def test_request_equals_recorded(
    run_name: str,
    position: int,
    eval_problems: Sequence[Problem],
    train_pool: Sequence[tuple[str, str]],
) -> None:
    recorded = RUNS[run_name]["requests"][position]
    sent: dict[str, Any] = recorded["body"]
    problem = eval_problems[recorded["problem_index"]]
    opts = _run_options(run_name)
    request = presets.lm_eval_request(problem, train_pool, opts["api"], opts["system"])
    if run_name == "chat_singleturn":  # --fewshot_as_multiturn false, which no preset sends:
        # lm-eval's chat request with the completions prompt as its one turn
        prompt = presets.lm_eval_request(problem, train_pool, "completions", None).prompt
        request = dataclasses.replace(request, messages=(("user", prompt),))
    body = request.body(MODEL)

    if opts["api"] == "chat":
        assert body["messages"] == sent["messages"]
    else:
        assert body["prompt"] == sent["prompt"]
        assert body["prompt"].encode("utf-8") == sent["prompt"].encode("utf-8")
    assert body["stop"] == sent["stop"] == ["Question:", "</s>", "<|im_end|>"]
    assert body["max_tokens"] == sent["max_tokens"] == 256
    assert body["temperature"] == sent["temperature"] == 0.0
    assert isinstance(sent["temperature"], float)
    assert isinstance(body["temperature"], float)
    assert body["seed"] == sent["seed"] == 1234
    assert sorted(body) == sorted(sent)
    assert _canonical(body) == _canonical(sent)


@pytest.mark.parametrize("run_name", list(RUNS))
def test_accuracy_equals_lm_eval(run_name: str) -> None:
    run = RUNS[run_name]
    pairs = [(s["response"], s["target"]) for s in run["samples"]]
    if run_name == "completions_full":
        # Only a few samples of the full run are kept: check those one by one.
        assert len(pairs) == len(run["requests"]) == 4
    else:
        assert len(pairs) == run["n_samples"]["effective"]
        scores = [presets.lm_eval_score(text, gold) for text, gold in pairs]
        means = {k: sum(s[k] for s in scores) / len(pairs) for k in presets.LM_EVAL.extractors}
        assert means == run["metrics"]  # lm-eval's exact_match: the mean per filter


@pytest.mark.parametrize("run_name", list(RUNS))
def test_per_sample_extraction_and_score_equal_lm_eval(run_name: str) -> None:
    for sample in RUNS[run_name]["samples"]:
        text, gold = sample["response"], sample["target"]
        extracted = {
            "strict-match": presets.lm_eval_strict(text),
            "flexible-extract": presets.lm_eval_flexible(text),
        }
        logged = {
            name: None if value == presets.LM_EVAL_FALLBACK else value
            for name, value in sample["extracted"].items()
        }
        assert extracted == logged, sample["problem_index"]
        expected = {name: score == 1.0 for name, score in sample["exact_match"].items()}
        assert presets.lm_eval_score(text, gold) == expected, sample["problem_index"]


def test_scripted_answers_separate_the_two_rules() -> None:
    """The recorded run really exercises strict/flexible disagreement both ways."""
    samples = RUNS["completions"]["samples"]
    strict = [s["exact_match"]["strict-match"] for s in samples]
    flexible = [s["exact_match"]["flexible-extract"] for s in samples]
    assert strict == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert flexible == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 1.0]
    assert RUNS["completions"]["metrics"] == {"strict-match": 0.375, "flexible-extract": 0.5}


@pytest.mark.parametrize(
    "case", RECORDED["scoring_cases"], ids=[repr(c["response"]) for c in RECORDED["scoring_cases"]]
)
def test_scoring_edge_cases_equal_lm_eval(case: dict[str, Any]) -> None:
    text, gold = case["response"], case["gold"]
    logged = {
        name: None if value == presets.LM_EVAL_FALLBACK else value
        for name, value in case["extracted"].items()
    }
    assert presets.lm_eval_strict(text) == logged["strict-match"]
    assert presets.lm_eval_flexible(text) == logged["flexible-extract"]
    expected = {name: score == 1.0 for name, score in case["exact_match"].items()}
    assert presets.lm_eval_score(text, gold) == expected


def test_match_normalisation() -> None:
    assert presets.lm_eval_match("$1,800.", "Work.\n#### 1,800")
    assert presets.lm_eval_match("18.", "#### 18")
    assert not presets.lm_eval_match("18.00", "#### 18")
    assert not presets.lm_eval_match(None, "#### 18")
    assert presets.lm_eval_match("A 1,000 #### $12.", "12")


def test_fewshot_draws_are_sequential_per_problem() -> None:
    """Problem i gets the (i+1)-th rnd.sample(train, 5) of one Random(1234)."""
    rnd = random.Random(1234)
    replay = [tuple(rnd.sample(range(7473), 5)) for _ in range(30)]
    # Ask out of order: the cache must not depend on call order.
    for i in (29, 0, 17, 3, 29):
        assert presets.lm_eval_fewshot_indices(i, 7473) == replay[i]
    assert len({presets.lm_eval_fewshot_indices(i, 7473) for i in range(30)}) == 30
    with pytest.raises(ValueError, match="problem index must be >= 0"):
        presets.lm_eval_fewshot_indices(-1, 7473)
    with pytest.raises(ValueError, match="cannot draw 5 examples from a pool of 4"):
        presets.lm_eval_fewshot_indices(0, 4)


def test_protocol_fields_and_spec() -> None:
    assert presets.preset_settings("lm-eval") == {
        "preset": "lm-eval",
        "api": "completions",
        "protocol": "test@1",
        "temperature": 0.0,
        "shots": 5,
        "max_tokens": 256,
        "stop": ("Question:", "</s>", "<|im_end|>"),
        "extract": "strict-match",
    }
    settings = build_settings(lambda o: {"gsm8k_preset": "lm-eval"}.get(o.dest), lambda note: None)
    assert (settings.protocol, settings.api, settings.extract) == (
        "test@1",
        "completions",
        "strict-match",
    )
    assert (settings.shots, settings.max_tokens, settings.temperature) == (5, 256, 0.0)
    assert tuple(settings.stop) == presets.LM_EVAL.stop
    protocol = Protocol(
        api="completions", shots=5, preset="lm-eval", fewshot_source=presets.LM_EVAL.fewshot_source
    )
    assert protocol.identity()["preset"] == "lm-eval"
    assert presets.PRESETS["lm-eval"] is presets.LM_EVAL
    assert presets.LM_EVAL.extractors == ("strict-match", "flexible-extract")
    with pytest.raises(ValueError, match="--gsm8k-preset: unknown preset 'lm_eval'"):
        presets.preset_settings("lm_eval")


def test_scoring_equals_installed_lm_eval_on_random_strings() -> None:
    """Cross-check against lm-eval's own filter/metric code when it is installed.

    The recorded fixture is the real guarantee; this only widens the net
    (NUL bytes, Unicode minus, stray ``####``) where lm-eval happens to be present.
    """
    pytest.importorskip("lm_eval")
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter

    strict = RegexFilter(regex_pattern=presets.LM_EVAL_STRICT_PATTERN)
    flexible = RegexFilter(regex_pattern=presets.LM_EVAL_FLEXIBLE_PATTERN, group_select=-1)
    kwargs = {
        "regexes_to_ignore": list(presets.LM_EVAL_IGNORE_REGEXES),
        "ignore_case": True,
        "ignore_punctuation": False,
    }
    rnd = random.Random(0)
    alphabet = [*"0123456789.,$-# \nAaxQ:", "#### ", "####", "\u2212", "\x00"]
    for _ in range(3000):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 25)))
        gold = "Work.\n#### " + "".join(rnd.choice("0123456789.,$-") for _ in range(3))
        for flt, ours in ((strict, presets.lm_eval_strict), (flexible, presets.lm_eval_flexible)):
            theirs = next(iter(flt.apply([[text]], [{}])))[0]
            assert ours(text) == (None if theirs == presets.LM_EVAL_FALLBACK else theirs)
            score = exact_match_hf_evaluate(predictions=[theirs], references=[gold], **kwargs)
            assert presets.lm_eval_match(ours(text), gold) == (score["exact_match"] == 1.0)
