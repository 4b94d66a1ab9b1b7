"""Presets that reproduce another harness's GSM8K requests and scoring exactly. Pure.

Every preset's :class:`PresetSpec`, and lm-eval's requests and scoring (vLLM's and SGLang's
requests: core/engine_ci.py; docs/protocols.md says what each preset promises).

lm-eval mirrors **lm-evaluation-harness 0.4.13**, task ``gsm8k`` (``gsm8k.yaml`` v3.0) as
``local-completions`` and ``local-chat-completions --apply_chat_template`` send it;
``tests/data/lm_eval_requests.json`` holds bodies and scores recorded from it
(``tests/data/record_lm_eval.py``), checked byte for byte by tests/unit/core/test_presets.py.
What each piece copies:

- prompt (``fewshot_context``/``build_qa_turn``, lm_eval/api/task.py): examples ``"Question:
  {q}\\nAnswer:" + " " + answer + "\\n\\n"`` with the *whole* train answer (``<<48/2=24>>``
  and ``#### N`` included), verbatim, then ``"Question: {q}\\nAnswer:"``; a system
  instruction is glued in front with no separator;
- examples (``ContextSampler.sample``): ONE ``random.Random(1234)`` per task, one
  ``rnd.sample(train, 5)`` per test document in test order, so problem ``i`` gets draw ``i``
  and ``--limit K`` keeps a full run's prompts (``--samples`` and multi-rank runs shift the
  draws: not reproduced);
- body (``_create_payload``): ``max_tokens`` 256 (``max_gen_toks``), temperature 0.0, stop
  ``Question:``, ``</s>``, ``<|im_end|>`` (no EOS: no tokenizer), ``seed`` 1234, no ``n``;
- chat: ``--apply_chat_template`` turns ``--fewshot_as_multiturn`` on: each example a user
  and an assistant turn, then the problem's user turn (off: one user message holding the
  completions prompt); a system instruction is a leading system message;
- scoring (``RegexFilter``, ``exact_match_hf_evaluate``): ``strict-match`` takes the FIRST
  ``#### (\\-?[0-9\\.\\,]+)``, ``flexible-extract`` the LAST ``(-?[$0-9.,]{2,})|(-?[0-9]+)``;
  no match is ``[invalid]``; both sides lose ``,``, ``$``, ``(?s).*#### `` and a final
  ``.``, are lower-cased and compared as strings (``18.00`` is not ``18``); no ``<think>``
  stripping.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pytest_gsm8k.core.types import Api, Problem, Request

LM_EVAL_VERSION = "0.4.13"
#: ``simple_evaluate(fewshot_random_seed=...)``'s default: the one generator's seed
LM_EVAL_FEWSHOT_SEED = 1234


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
    #: score names reported side by side, in the peer's order and spelling
    extractors: tuple[str, ...]
    #: the stop list in chat mode when it differs from ``stop``
    chat_stop: tuple[str, ...] | None = None
    #: settings a user may still give, as the peer's own flags allow (``shots``)
    adjustable: tuple[str, ...] = ()
    #: settings the peer has no such thing for: giving one would change its protocol
    also_fixed: tuple[str, ...] = ()
    #: the APIs the peer sends to (completions is the preset's default)
    apis: tuple[str, ...] = ("completions", "chat")
    #: ``train``, or ``evaluated``: the first rows of the split under test (SGLang's script)
    fewshot_split: str = "train"
    #: ``--gsm8k-limit N`` takes the first N problems, as the peer's ``--num-questions``
    first_questions: bool = False
    #: the body names the model; vLLM's script does not, so the run checks who answered
    #: (core/identity.py ``unnamed_answerer``)
    model_field: bool = True

    def settings(self, api: str = "completions", shots: int | None = None) -> dict[str, Any]:
        """The settings this preset fixes, by option key, written once: a user who gives one
        as well gets an error instead of a silent mix (``api`` is the user's to switch
        where the peer has a chat mode; ``shots`` where :attr:`adjustable`)."""
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

PRESETS: dict[str, PresetSpec] = {p.name: p for p in (LM_EVAL, VLLM, SGLANG)}


def preset_settings(
    name: str, *, api: str = "completions", shots: int | None = None
) -> dict[str, Any]:
    """The settings of ``--gsm8k-preset NAME --gsm8k-shots N`` with ``preset`` and ``api``,
    for a caller that builds runs itself (one per vLLM config); ValueError as the options'
    checks would say it."""
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

# (pool size, shots, seed) -> (generator after the last draw, draws so far): a whole split
# linear instead of quadratic
_DRAWS: dict[tuple[int, int, int], tuple[random.Random, list[tuple[int, ...]]]] = {}


def lm_eval_fewshot_indices(
    problem_index: int,
    pool_size: int,
    shots: int = LM_EVAL.shots,
    seed: int = LM_EVAL_FEWSHOT_SEED,
) -> tuple[int, ...]:
    """Train-pool indices of lm-eval's examples for test problem ``problem_index`` (draw
    ``i``; ``sample`` picks from the length alone, so ``range(pool_size)`` gives the
    documents' positions)."""
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
    """The ``prompt`` ``local-completions`` sends; ``train``: the train split in file
    order, raw answers; ``system``: ``--system_instruction``."""
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
    """The ``messages`` ``local-chat-completions --apply_chat_template`` sends
    (``multiturn``: ``--fewshot_as_multiturn``)."""
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
    """The request lm-eval sends for ``problem``: its body has exactly lm-eval's keys and
    values."""
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
#: ``regexes_to_ignore`` of the task's ``exact_match``, in this order
LM_EVAL_IGNORE_REGEXES: tuple[str, ...] = (",", r"\$", "(?s).*#### ", r"\.$")
#: what lm-eval's regex filter returns when nothing matched
LM_EVAL_FALLBACK = "[invalid]"

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
    """lm-eval's ``flexible-extract``: the LAST number-ish run (an ellipsis after the
    answer is what it extracts); None: ``[invalid]``."""
    return _regex_filter(_FLEXIBLE_RE, -1, text)


def lm_eval_normalise(text: str) -> str:
    """``exact_match``'s view of a string; the trailing NULs go as in numpy's unicode
    arrays, which lm-eval compares."""
    for regex in _IGNORE_RES:
        text = regex.sub("", text)
    return text.lower().rstrip("\x00")


def lm_eval_match(extracted: str | None, gold_answer_text: str) -> bool:
    """lm-eval's ``exact_match`` against the raw answer (its ``doc_to_target``); None is
    the ``[invalid]`` fallback, compared like any string."""
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
    """lm-eval's ``exact_match`` per filter: the mean over ``(response, gold)`` pairs."""
    if not responses:
        raise ValueError("no responses to score")
    totals = dict.fromkeys(LM_EVAL.extractors, 0)
    for text, gold in responses:
        for name, ok in lm_eval_score(text, gold).items():
            totals[name] += ok
    return {name: count / len(responses) for name, count in totals.items()}
