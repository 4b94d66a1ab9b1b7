"""Presets that reproduce another harness's GSM8K requests and scoring exactly, and lm-eval's
(vLLM's and SGLang's: core/engine_ci.py). Pure. docs/protocols.md says what each copies;
tests/data/lm_eval_requests.json, recorded from lm-eval itself, checks it byte for byte."""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass
from typing import Any

from pytest_gsm8k.core.types import Api, Pairs, Problem, Request

LM_EVAL_VERSION = "0.4.13"
#: ``simple_evaluate(fewshot_random_seed=...)``'s default: the one generator's seed
LM_EVAL_FEWSHOT_SEED = 1234


@dataclass(frozen=True)
class PresetSpec:
    """What a preset fixes: everything in a request and in scoring that a peer decides."""

    name: str
    version: str
    fewshot_source: str
    stop: tuple[str, ...]
    seed: int | None
    #: score names reported side by side, in the peer's order and spelling
    extractors: tuple[str, ...]
    shots: int = 5
    max_tokens: int = 256
    temperature: float = 0.0
    chat_stop: tuple[str, ...] | None = None  # the stop list in chat mode, when it differs
    adjustable: tuple[str, ...] = ()  # settings a user may still give, as the peer's flags allow
    #: settings the peer has no such thing for: giving one would change its protocol
    also_fixed: tuple[str, ...] = ("fewshot_file", "answer_regex")
    apis: tuple[str, ...] = ("completions", "chat")  # completions first: the default
    fewshot_split: str = "train"  # or "evaluated": the split under test's first rows (SGLang)
    first_questions: bool = False  # --gsm8k-limit N is the first N, as --num-questions
    #: vLLM's body names no model, so the run checks who answered (identity.unnamed_answerer)
    model_field: bool = True


LM_EVAL = PresetSpec(
    "lm-eval",
    LM_EVAL_VERSION,
    fewshot_source="train (lm-eval sampler, seed 1234)",
    stop=("Question:", "</s>", "<|im_end|>"),
    seed=1234,
    extractors=("strict-match", "flexible-extract"),
)
#: what vLLM's and SGLang's scripts share: their stop list, --num-shots, the first N questions
_ENGINE: dict[str, Any] = dict(
    stop=("Question", "Assistant:", "<|separator|>"), first_questions=True
)
_ENGINE.update(adjustable=("shots",), also_fixed=("fewshot_file", "answer_regex", "system"))
VLLM = PresetSpec(
    "vllm",
    # the newest script the reference index held on 2026-12-05, named by its content (the
    # index gave no commit; its completions bodies equal commit 03e09605's): docs/protocols.md
    "vllm-project/vllm tests/evals/gsm8k/gsm8k_eval.py sha256 80aa6cb3f9aa4c3c",
    fewshot_source="train, the first N in file order (vLLM gsm8k_eval.py)",
    seed=42,
    extractors=("last-int",),
    chat_stop=(),
    model_field=False,
    **_ENGINE,
)
SGLANG = PresetSpec(
    "sglang",
    "sgl-project/sglang python/sglang/test/few_shot_gsm8k.py @ 109fdd2f",
    fewshot_source="the evaluated split's first N rows (SGLang few_shot_gsm8k.py)",
    max_tokens=512,
    seed=None,
    extractors=("last-int",),
    apis=("completions",),
    fewshot_split="evaluated",
    **_ENGINE,
)
PRESETS: dict[str, PresetSpec] = {p.name: p for p in (LM_EVAL, VLLM, SGLANG)}


def preset_settings(
    name: str, *, api: str = "completions", shots: int | None = None
) -> dict[str, Any]:
    """The settings ``--gsm8k-preset NAME`` fixes, ``preset`` and ``api`` included (``shots``
    where the peer takes it: settings refuses it elsewhere); ValueError for an unknown preset
    or an ``api`` the peer has not."""
    if name not in PRESETS:
        valid = ", ".join(sorted(PRESETS))
        raise ValueError(f"--gsm8k-preset: unknown preset {name!r:.200} (valid: {valid})")
    spec = PRESETS[name]
    if api not in spec.apis:
        raise ValueError(
            f"--gsm8k-preset {name} sends to {' and '.join(spec.apis)} only (its peer has no "
            f"{api} mode); remove --gsm8k-api"
        )
    stop = spec.chat_stop if api == "chat" and spec.chat_stop is not None else spec.stop
    shots = spec.shots if shots is None or "shots" not in spec.adjustable else shots
    values = dict(preset=name, api=api, protocol="test@1", shots=shots, stop=stop)
    values.update(temperature=spec.temperature, max_tokens=spec.max_tokens)
    return values | {"extract": spec.extractors[0]}


def takes_first(preset: str | None) -> bool:
    return preset in PRESETS and PRESETS[preset].first_questions


def sends_model(preset: str | None) -> bool:
    return preset not in PRESETS or PRESETS[preset].model_field


# pool size -> (generator after the last draw, draws so far): a split in linear time
_DRAWS: dict[int, tuple[random.Random, list[tuple[int, ...]]]] = {}


def lm_eval_fewshot_indices(problem_index: int, pool_size: int) -> tuple[int, ...]:
    """Train-pool indices of lm-eval's examples for test problem ``problem_index``: its
    ``ContextSampler`` draws ``rnd.sample(train, shots)`` once per test document, in order, from
    one ``Random(1234)`` (``sample`` reads only the length, so positions stand for documents)."""
    shots = LM_EVAL.shots  # fixed: the preset takes no --gsm8k-shots
    if problem_index < 0:
        raise ValueError(f"problem index must be >= 0, got {problem_index}")
    if shots > pool_size:
        raise ValueError(f"cannot draw {shots} examples from a pool of {pool_size}")
    rnd, draws = _DRAWS.setdefault(pool_size, (random.Random(LM_EVAL_FEWSHOT_SEED), []))
    while len(draws) <= problem_index:
        draws.append(tuple(rnd.sample(range(pool_size), shots)))
    return draws[problem_index]


def lm_eval_request(problem: Problem, train: Pairs, api: Api, system: str | None) -> Request:
    """lm-eval's request for ``problem``. ``local-completions`` sends a system instruction glued
    on with no separator, each example with its whole raw train answer (``<<48/2=24>>`` and
    ``#### N`` included); in chat each example is a user and an assistant turn
    (``--apply_chat_template`` turns ``--fewshot_as_multiturn`` on)."""
    common: dict[str, Any] = {"temperature": LM_EVAL.temperature, "seed": LM_EVAL.seed}
    common.update(problem_id=problem.id, stop=LM_EVAL.stop, max_tokens=LM_EVAL.max_tokens)
    examples = [train[i] for i in lm_eval_fewshot_indices(problem.index, len(train))]
    question = f"Question: {problem.question}\nAnswer:"
    if api == "completions":
        shots = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in examples)
        return Request(api=api, prompt=f"{system or ''}{shots}{question}", **common)
    messages = [("system", system)] if system else []
    for q, a in examples:
        messages += [("user", f"Question: {q}\nAnswer:"), ("assistant", a)]
    messages.append(("user", question))
    return Request(api="chat", messages=tuple(messages), **common)


# scoring: RegexFilter, then exact_match_hf_evaluate with the task's regexes_to_ignore
LM_EVAL_STRICT_PATTERN = r"#### (\-?[0-9\.\,]+)"
LM_EVAL_FLEXIBLE_PATTERN = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"
LM_EVAL_IGNORE_REGEXES: tuple[str, ...] = (",", r"\$", "(?s).*#### ", r"\.$")
#: what lm-eval's regex filter returns when nothing matched
LM_EVAL_FALLBACK = "[invalid]"


def _regex_filter(regex: re.Pattern[str], group_select: int, text: str) -> str | None:
    """``RegexFilter.apply`` for one response, ``None`` for its ``[invalid]`` fallback."""
    if not (matches := regex.findall(text)):
        return None
    match = matches[group_select]
    if isinstance(match, tuple):  # every alternative of both patterns is non-empty
        match = next(m for m in match if m)
    return str(match).strip()


#: ``strict-match``: the number after the FIRST ``#### `` (``None``: invalid)
lm_eval_strict = functools.partial(_regex_filter, re.compile(LM_EVAL_STRICT_PATTERN), 0)
#: ``flexible-extract``: the LAST number-ish run (an ellipsis after the answer too)
lm_eval_flexible = functools.partial(_regex_filter, re.compile(LM_EVAL_FLEXIBLE_PATTERN), -1)


def lm_eval_match(extracted: str | None, gold_answer_text: str) -> bool:
    """``exact_match`` against the raw answer, each side with the ignored regexes removed and
    lower-cased, compared as a string (``18.00`` is not ``18``; None is ``[invalid]``, compared
    like any string); trailing NULs go as in the numpy unicode arrays lm-eval compares."""
    sides = [LM_EVAL_FALLBACK if extracted is None else extracted, gold_answer_text]
    for pattern in LM_EVAL_IGNORE_REGEXES:
        sides = [re.sub(pattern, "", text) for text in sides]
    prediction, gold = (text.lower().rstrip("\x00") for text in sides)
    return prediction == gold


def lm_eval_score(text: str, gold_answer_text: str) -> dict[str, bool]:
    pairs = (("strict-match", lm_eval_strict), ("flexible-extract", lm_eval_flexible))
    return {name: lm_eval_match(rule(text), gold_answer_text) for name, rule in pairs}
