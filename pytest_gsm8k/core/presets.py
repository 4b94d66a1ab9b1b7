"""Presets that reproduce another harness's GSM8K requests and scoring exactly.

Pure functions: no pytest, no HTTP, no file access; standard library only. This module
holds every preset's :class:`PresetSpec` and lm-eval's requests and scoring; the vLLM and
SGLang presets' requests are built in :mod:`pytest_gsm8k.core.engine_ci`.

``lm-eval``
===========

Mirrors **lm-evaluation-harness 0.4.13** (``pip install "lm-eval[api]==0.4.13"``),
task ``gsm8k`` (``lm_eval/tasks/gsm8k/gsm8k.yaml``, metadata version 3.0), as
sent by the models ``local-completions`` and ``local-chat-completions
--apply_chat_template`` (``lm_eval/models/openai_completions.py`` on top of
``lm_eval/models/api_models.py``).  The files each piece copies are named
below; ``tests/data/lm_eval_requests.json`` holds request bodies and scores
recorded from that version (``tests/data/record_lm_eval.py`` re-records them) and
``tests/unit/core/test_presets.py`` checks this module against them byte for byte.

Prompt (``ConfigurableTask.fewshot_context`` / ``build_qa_turn`` in
``lm_eval/api/task.py``, ``Message``/``multiturn_to_singleturn`` in
``lm_eval/api/utils.py``)
    ``doc_to_text`` is ``"Question: {{question}}\\nAnswer:"`` and
    ``doc_to_target`` is ``"{{answer}}"``: the *whole* train answer, calculator
    annotations ``<<48/2=24>>`` and the ``#### N`` line included, nothing
    stripped.  Each example is question text + target delimiter ``" "`` +
    answer + fewshot delimiter ``"\\n\\n"``; the problem itself is
    ``"Question: {question}\\nAnswer:"`` with no trailing space.  Question and
    answer texts are used verbatim (Jinja renders them without escaping or
    whitespace changes).

Few-shot sampling (``ContextSampler.sample`` in ``lm_eval/api/samplers.py``)
    ONE ``random.Random(1234)`` per task (``Task.set_fewshot_seed`` from
    ``simple_evaluate(fewshot_random_seed=1234)``), shared by all documents.
    For every test document, in test-split order, ``rnd.sample(train, 5)`` is
    called once (the fewshot split ``train`` differs from the test split, so no
    "remove the eval doc" ``n + 1`` draw).  So the examples differ per problem:
    problem ``i`` gets the ``(i + 1)``-th draw of that generator.  A run with
    ``--limit K`` sees the same prompts for problems ``0..K-1`` as a full run.
    (``--samples`` and multi-rank runs enumerate fewer documents and so shift
    the draws; they are not reproduced here.)

Request body (``LocalCompletionsAPI._create_payload`` / ``LocalChatCompletion._create_payload``)
    completions: ``{"prompt", "model", "max_tokens": 256, "temperature": 0.0,
    "stop": ["Question:", "</s>", "<|im_end|>"], "seed": 1234}``; chat: the same
    with ``"messages"`` in place of ``"prompt"`` (``stop`` cut to 4 entries).
    ``max_tokens`` is the model's ``max_gen_toks`` default (the task sets none),
    ``temperature`` is the task's ``0.0``, ``do_sample`` is dropped, ``seed`` is
    the model's ``seed`` argument (default 1234).  No EOS string is appended to
    ``stop`` when the model has no tokenizer (``tokenizer_backend=None``, the
    only setting that needs no download).  No ``n``, no streaming.

Chat messages
    ``--apply_chat_template`` turns ``--fewshot_as_multiturn`` on by default:
    every example is a ``user`` turn ``"Question: ...\\nAnswer:"`` and an
    ``assistant`` turn holding the full answer (no delimiters: those only exist
    in text rendering), then a final ``user`` turn for the problem.  With
    ``--fewshot_as_multiturn false`` everything collapses into ONE ``user``
    message whose content is exactly the completions prompt.
    ``--system_instruction S`` adds a leading ``system`` message in chat mode;
    in completions mode ``S`` is glued to the prompt with no separator at all
    (``Message("system", S)`` renders with an empty delimiter).

Scoring (``filter_list`` and ``metric_list`` of ``gsm8k.yaml``;
``RegexFilter`` in ``lm_eval/filters/extraction.py``; ``exact_match_hf_evaluate``
in ``lm_eval/api/metrics.py``)
    ``strict-match``: ``re.findall(r"#### (\\-?[0-9\\.\\,]+)")`` and the FIRST
    match (``group_select`` 0), then ``take_first``.
    ``flexible-extract``: ``re.findall(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")``, the
    LAST match (``group_select`` -1), its first non-empty group, stripped.
    No match gives the fallback ``"[invalid]"`` (here ``None``).  The extracted
    string and the gold ``doc_to_target`` (the full answer text) then both go
    through ``re.sub`` with ``","``, ``"\\$"``, ``"(?s).*#### "``, ``"\\.$"``, in
    that order, are lower-cased (``ignore_case``), not stripped of punctuation
    (``ignore_punctuation: false``), and compared as strings: ``"18.00"`` does
    NOT equal ``18`` and ``"-0"`` does not equal ``0``.
    No ``<think>`` stripping (``think_end_token`` is unset by default) and no
    client-side stop cut for completions: the response text is used as the
    server returned it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gsm8k.core.types import Api, Problem, Request

__all__ = [
    "LM_EVAL",
    "LM_EVAL_FALLBACK",
    "LM_EVAL_FLEXIBLE_PATTERN",
    "LM_EVAL_IGNORE_REGEXES",
    "LM_EVAL_STRICT_PATTERN",
    "LM_EVAL_VERSION",
    "PRESETS",
    "SGLANG",
    "VLLM",
    "PresetSpec",
    "get_preset",
    "lm_eval_accuracy",
    "lm_eval_fewshot_indices",
    "lm_eval_flexible",
    "lm_eval_match",
    "lm_eval_messages",
    "lm_eval_normalise",
    "lm_eval_prompt",
    "lm_eval_request",
    "lm_eval_score",
    "lm_eval_strict",
    "preset_settings",
    "sends_model",
    "takes_first",
]

LM_EVAL_VERSION = "0.4.13"
"""The lm-evaluation-harness release this preset was recorded against."""
LM_EVAL_FEWSHOT_SEED = 1234
"""``simple_evaluate(fewshot_random_seed=...)``'s default: the one generator's seed."""


@dataclass(frozen=True)
class PresetSpec:
    """What a preset fixes: everything in a request and in scoring that a peer decides."""

    name: str
    harness: str
    version: str
    shots: int
    fewshot_seed: int | None
    fewshot_source: str
    max_tokens: int
    temperature: float
    stop: tuple[str, ...]
    seed: int | None
    extractors: tuple[str, ...]
    """Score names reported side by side, in the peer's order and spelling."""
    chat_stop: tuple[str, ...] | None = None
    """The stop list in chat mode when it differs from :attr:`stop` (None: the same)."""
    adjustable: tuple[str, ...] = ()
    """Settings a user may still give, as the peer's own flags allow (``shots``: its
    ``--num-shots``, a vLLM config's ``num_fewshot``); the rest are the preset's."""
    also_fixed: tuple[str, ...] = ()
    """Settings a user may not give beside those :meth:`settings` returns (the peer has no
    such thing, so giving one would silently change its protocol)."""
    apis: tuple[str, ...] = ("completions", "chat")
    """The APIs the peer sends to (completions is the preset's default)."""
    fewshot_split: str = "train"
    """Where the examples come from: ``train``, or ``evaluated`` (the first rows of the
    split under test itself, as SGLang's script does)."""
    first_questions: bool = False
    """``--gsm8k-limit N`` takes the first N problems, as the peer's ``--num-questions``
    (a vLLM config's ``num_questions``) does, instead of a seeded subset."""
    model_field: bool = True
    """The requests name the model (``model`` in the body). vLLM's script sends none, so
    the server's default model answers: the run checks that this is the model named
    (:func:`pytest_gsm8k.core.identity.unnamed_answerer`)."""

    def settings(self, api: str = "completions", shots: int | None = None) -> dict[str, Any]:
        """The run settings this preset fixes (``--gsm8k-*`` option names without the
        prefix), the one place they are written: the options table applies them, and a
        user who gives one of them as well gets an error instead of a silent mix.

        ``api`` is left out: completions by default (as ``local-completions``), and a
        user may switch it to ``chat`` (``local-chat-completions --apply_chat_template``)
        where the peer has a chat mode. ``shots`` replaces the default number of examples
        for a preset where it is :attr:`adjustable`.
        """
        stop = self.chat_stop if api == "chat" and self.chat_stop is not None else self.stop
        return {
            "protocol": "test@1",
            "temperature": self.temperature,
            "shots": self.shots if shots is None else shots,
            "max_tokens": self.max_tokens,
            "stop": list(stop),
            "extract": self.extractors[0],
        }


LM_EVAL = PresetSpec(
    name="lm-eval",
    harness="lm-evaluation-harness",
    version=LM_EVAL_VERSION,
    shots=5,
    fewshot_seed=LM_EVAL_FEWSHOT_SEED,
    fewshot_source="train (lm-eval sampler, seed 1234)",
    max_tokens=256,
    temperature=0.0,
    stop=("Question:", "</s>", "<|im_end|>"),
    seed=1234,
    extractors=("strict-match", "flexible-extract"),
)

VLLM_SOURCE = "vllm-project/vllm tests/evals/gsm8k/gsm8k_eval.py"
VLLM = PresetSpec(
    name="vllm",
    harness="vLLM's GSM8K CI (gsm8k_eval.py)",
    # the newest script the reference index held on 2026-12-05, named by its content (the
    # index gave no commit; its completions bodies equal commit 03e09605's): docs/protocols.md
    version=f"{VLLM_SOURCE} sha256 80aa6cb3f9aa4c3c",
    shots=5,
    fewshot_seed=None,
    fewshot_source="train, the first N in file order (vLLM gsm8k_eval.py)",
    max_tokens=256,
    temperature=0.0,
    stop=("Question", "Assistant:", "<|separator|>"),
    seed=42,
    extractors=("last-int",),
    chat_stop=(),
    adjustable=("shots",),
    also_fixed=("system",),
    first_questions=True,
    model_field=False,
)
"""vLLM's ``tests/evals/gsm8k/gsm8k_eval.py`` as its CI runs it (``evaluate_gsm8k``'s
defaults); the requests are built in :mod:`pytest_gsm8k.core.engine_ci`."""

SGLANG_SOURCE = "sgl-project/sglang python/sglang/test/few_shot_gsm8k.py @ 109fdd2f"
SGLANG = PresetSpec(
    name="sglang",
    harness="SGLang's few-shot GSM8K benchmark (few_shot_gsm8k.py)",
    version=SGLANG_SOURCE,
    shots=5,
    fewshot_seed=None,
    fewshot_source="the evaluated split's first N rows (SGLang few_shot_gsm8k.py)",
    max_tokens=512,
    temperature=0.0,
    stop=("Question", "Assistant:", "<|separator|>"),
    seed=None,
    extractors=("last-int",),
    adjustable=("shots",),
    also_fixed=("system",),
    apis=("completions",),
    fewshot_split="evaluated",
    first_questions=True,
)
"""SGLang's ``few_shot_gsm8k.py``: its prompt, stop list and sampling, sent to
``/v1/completions`` (the script itself posts to SGLang's native ``/generate``)."""

PRESETS: dict[str, PresetSpec] = {p.name: p for p in (LM_EVAL, VLLM, SGLANG)}
"""Every preset by its ``--gsm8k-preset`` name."""


def preset_settings(
    name: str, *, api: str = "completions", shots: int | None = None
) -> dict[str, Any]:
    """The run settings of preset ``name`` for ``api`` and (where adjustable) ``shots``,
    keyed by ``--gsm8k-*`` option name without the prefix, ``preset`` and ``api`` included.

    What a caller that builds runs itself (one per vLLM config, its ``num_fewshot`` as
    ``shots``) gives the options table, so that its runs are exactly ``--gsm8k-preset
    NAME --gsm8k-shots N``. ``ValueError`` for an unknown preset, an API the peer has no
    mode for, or ``shots`` the preset fixes.
    """
    spec = get_preset(name)
    if api not in spec.apis:
        raise ValueError(f"--gsm8k-preset {name} sends to {' and '.join(spec.apis)} only")
    if shots is not None and "shots" not in spec.adjustable:
        raise ValueError(f"--gsm8k-preset {name} sets --gsm8k-shots itself")
    if shots is not None and shots < 0:
        raise ValueError(f"--gsm8k-shots: must be >= 0, got {shots}")
    return {"preset": name, "api": api, **spec.settings(api, shots)}


def takes_first(preset: str | None) -> bool:
    """Whether ``--gsm8k-limit`` takes the first problems under ``preset`` (see
    :attr:`PresetSpec.first_questions`); a seeded subset otherwise."""
    return preset in PRESETS and PRESETS[preset].first_questions


def sends_model(preset: str | None) -> bool:
    """Whether the requests of ``preset`` (None: the plugin's own) name the model."""
    return preset not in PRESETS or PRESETS[preset].model_field


def get_preset(name: str) -> PresetSpec:
    """The preset called ``name``; ``ValueError`` naming the valid ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        valid = ", ".join(sorted(PRESETS))
        raise ValueError(f"--gsm8k-preset: unknown preset {name!r} (valid: {valid})") from None


# --------------------------------------------------------------------------- few-shot draws

# (pool size, shots, seed) -> (generator after the last draw, draws so far).
# Replaying the generator is cheap (a few microseconds per draw) but the cache
# makes a whole test split linear instead of quadratic.
_DRAWS: dict[tuple[int, int, int], tuple[random.Random, list[tuple[int, ...]]]] = {}


def lm_eval_fewshot_indices(
    problem_index: int,
    pool_size: int,
    shots: int = LM_EVAL.shots,
    seed: int = LM_EVAL_FEWSHOT_SEED,
) -> tuple[int, ...]:
    """Train-pool indices of the examples lm-eval shows test problem ``problem_index``.

    ``random.Random(seed)`` makes one ``sample(pool, shots)`` per test problem
    in test order, so problem ``i`` gets draw ``i`` (0-based).  ``sample``
    picks positions from the population's length alone, so sampling
    ``range(pool_size)`` gives the same positions as sampling the documents.
    """
    if problem_index < 0:
        raise ValueError(f"problem index must be >= 0, got {problem_index}")
    if not 0 <= shots <= pool_size:
        raise ValueError(f"cannot draw {shots} examples from a pool of {pool_size}")
    key = (pool_size, shots, seed)
    if key not in _DRAWS:
        _DRAWS[key] = (random.Random(seed), [])
    rnd, draws = _DRAWS[key]
    population = range(pool_size)
    while len(draws) <= problem_index:
        # lm-eval returns [] for n == 0 without touching the generator.
        draws.append(tuple(rnd.sample(population, shots)) if shots else ())
    return draws[problem_index]


def _examples(problem_index: int, train: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    return [train[i] for i in lm_eval_fewshot_indices(problem_index, len(train))]


def _doc_to_text(question: str) -> str:
    return f"Question: {question}\nAnswer:"


# --------------------------------------------------------------------------- requests


def lm_eval_prompt(
    problem_index: int,
    question: str,
    train: Sequence[tuple[str, str]],
    *,
    system: str | None = None,
) -> str:
    """The ``prompt`` that ``local-completions`` sends for test problem ``problem_index``.

    ``train`` is the whole GSM8K train split in file order as ``(question,
    answer)`` with the raw answers.  ``system`` is lm-eval's
    ``--system_instruction``, prefixed with no separator (as lm-eval does).
    """
    parts = [system or ""]
    for q, a in _examples(problem_index, train):
        parts.append(f"{_doc_to_text(q)} {a}\n\n")
    parts.append(_doc_to_text(question))
    return "".join(parts)


def lm_eval_messages(
    problem_index: int,
    question: str,
    train: Sequence[tuple[str, str]],
    *,
    system: str | None = None,
    multiturn: bool = True,
) -> list[tuple[str, str]]:
    """The ``messages`` that ``local-chat-completions --apply_chat_template`` sends.

    ``multiturn`` is ``--fewshot_as_multiturn`` (on by default with
    ``--apply_chat_template``): examples as user/assistant pairs.  Off, the
    whole completions prompt is one user message.  ``system`` adds a leading
    system message.
    """
    messages: list[tuple[str, str]] = []
    if system:
        messages.append(("system", system))
    if not multiturn:
        messages.append(("user", lm_eval_prompt(problem_index, question, train)))
        return messages
    for q, a in _examples(problem_index, train):
        messages.append(("user", _doc_to_text(q)))
        messages.append(("assistant", a))
    messages.append(("user", _doc_to_text(question)))
    return messages


def lm_eval_request(
    problem: Problem,
    train: Sequence[tuple[str, str]],
    api: Api = "completions",
    *,
    system: str | None = None,
    multiturn: bool = True,
) -> Request:
    """The full request lm-eval sends for ``problem`` (its ``index`` is its test position).

    ``Request.body(model)`` then has exactly lm-eval's keys and values (key
    order differs, which JSON does not care about).
    """
    common: dict[str, Any] = {
        "problem_id": problem.id,
        "temperature": LM_EVAL.temperature,
        "max_tokens": LM_EVAL.max_tokens,
        "n": 1,
        "stop": LM_EVAL.stop,
        "seed": LM_EVAL.seed,
    }
    if api == "chat":
        messages = lm_eval_messages(
            problem.index, problem.question, train, system=system, multiturn=multiturn
        )
        return Request(api="chat", messages=tuple(messages), **common)
    prompt = lm_eval_prompt(problem.index, problem.question, train, system=system)
    return Request(api="completions", prompt=prompt, **common)


# --------------------------------------------------------------------------- scoring

LM_EVAL_STRICT_PATTERN = r"#### (\-?[0-9\.\,]+)"
LM_EVAL_FLEXIBLE_PATTERN = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"
LM_EVAL_IGNORE_REGEXES: tuple[str, ...] = (",", r"\$", "(?s).*#### ", r"\.$")
"""``regexes_to_ignore`` of the task's ``exact_match``, applied in this order."""
LM_EVAL_FALLBACK = "[invalid]"
"""What lm-eval's regex filter returns (and logs) when nothing matched."""

_STRICT_RE = re.compile(LM_EVAL_STRICT_PATTERN)
_FLEXIBLE_RE = re.compile(LM_EVAL_FLEXIBLE_PATTERN)
_IGNORE_RES = tuple(re.compile(p) for p in LM_EVAL_IGNORE_REGEXES)


def _regex_filter(regex: re.Pattern[str], group_select: int, text: str) -> str | None:
    """``RegexFilter.apply`` for one response, ``None`` for its ``[invalid]`` fallback."""
    matches = regex.findall(text)
    if not matches:
        return None
    match = matches[group_select]
    if isinstance(match, tuple):
        groups = [m for m in match if m]
        if not groups:  # pragma: no cover - every alternative of both patterns is non-empty
            return None
        match = groups[0]
    value: str = match
    return value.strip()


def lm_eval_strict(text: str) -> str | None:
    """lm-eval's ``strict-match``: the number after the FIRST ``#### `` (``None``: invalid)."""
    return _regex_filter(_STRICT_RE, 0, text)


def lm_eval_flexible(text: str) -> str | None:
    """lm-eval's ``flexible-extract``: the LAST number-ish run (``None``: ``[invalid]``).

    Any run of two or more characters from ``$0-9.,`` counts, so an ellipsis
    ``...`` or ``$$`` after the answer is what gets extracted.
    """
    return _regex_filter(_FLEXIBLE_RE, -1, text)


def lm_eval_normalise(text: str) -> str:
    """``exact_match``'s view of a string: the ignore regexes removed, lower-cased.

    The trailing-NUL strip is numpy's: lm-eval compares ``numpy`` unicode
    arrays, which cannot hold trailing ``"\\x00"``.
    """
    for regex in _IGNORE_RES:
        text = regex.sub("", text)
    return text.lower().rstrip("\x00")


def lm_eval_match(extracted: str | None, gold_answer_text: str) -> bool:
    """lm-eval's ``exact_match`` of an extracted answer against a GSM8K ``answer`` field.

    ``gold_answer_text`` is the raw answer (working and ``#### N``), which is
    lm-eval's ``doc_to_target``; ``extracted`` ``None`` is the ``[invalid]``
    fallback, compared like any other string (it never equals a number).
    """
    prediction = LM_EVAL_FALLBACK if extracted is None else extracted
    return lm_eval_normalise(prediction) == lm_eval_normalise(gold_answer_text)


def lm_eval_score(text: str, gold_answer_text: str) -> dict[str, bool]:
    """Both lm-eval scores of one response, keyed by lm-eval's filter names."""
    return {
        "strict-match": lm_eval_match(lm_eval_strict(text), gold_answer_text),
        "flexible-extract": lm_eval_match(lm_eval_flexible(text), gold_answer_text),
    }


def lm_eval_accuracy(
    responses: Sequence[tuple[str, str]],
) -> dict[str, float]:
    """lm-eval's reported ``exact_match`` per filter over ``(response, gold answer)`` pairs.

    The mean of the per-problem 0/1 scores, as lm-eval aggregates them.
    """
    if not responses:
        raise ValueError("no responses to score")
    totals = dict.fromkeys(LM_EVAL.extractors, 0)
    for text, gold in responses:
        for name, ok in lm_eval_score(text, gold).items():
            totals[name] += ok
    return {name: count / len(responses) for name, count in totals.items()}
