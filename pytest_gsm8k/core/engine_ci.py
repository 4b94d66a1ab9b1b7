"""The engines' own GSM8K CI requests (``--gsm8k-preset vllm``, ``sglang``): their thresholds
hold only for that protocol, so these send what the scripts send, byte for byte where a
script posts JSON itself (docs/protocols.md). Pure."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pytest_gsm8k.core.presets import SGLANG, VLLM
from pytest_gsm8k.core.types import Api, Pairs, Problem, Request

#: per API, the optional fields gsm8k_eval.py sends after its own, in its order (None: left
#: out), and the type its command line gives each
_COMPLETION_PARAMS: dict[str, type] = {"top_p": float, "top_k": int}
VLLM_PARAMS = {
    "completions": _COMPLETION_PARAMS,
    "chat": {**_COMPLETION_PARAMS, "reasoning_effort": str, "chat_template_kwargs": dict},
}


def fewshot_prompt(question: str, examples: Pairs, shots: int) -> str:
    """The engines' prompt: the first ``shots`` of ``examples`` (question, raw answer) in
    order, each ``"Question: q\\nAnswer: a\\n\\n"``, then ``"Question: question\\nAnswer:"``."""
    if shots > len(examples):
        raise ValueError(f"--gsm8k-shots {shots}: only {len(examples)} examples are available")
    head = "".join(f"Question: {q}\nAnswer: {a}\n\n" for q, a in examples[:shots])
    return f"{head}Question: {question}\nAnswer:"


def vllm_param_error(keys: Sequence[str], api: str) -> str | None:
    """Why ``--gsm8k-param`` keys cannot go into a vLLM-preset body, or None when they can:
    only the fields gsm8k_eval.py itself can send keep the body its own."""
    allowed = VLLM_PARAMS[api]
    for key in (key for key in keys if key not in allowed):
        return (
            f"--gsm8k-param {key}: --gsm8k-preset vllm sends only what gsm8k_eval.py "
            f"sends; with --gsm8k-api {api} that is {', '.join(allowed)}"
        )
    return None


def _typed(key: str, kind: type, value: Any) -> Any:
    if kind is str or (kind is dict and isinstance(value, dict)):
        return kind(value)
    number = isinstance(value, int | float) and not isinstance(value, bool)
    wrong = "a JSON object" if kind is dict else None if number else "a number"
    if wrong or (kind is int and value != int(value)):
        raise ValueError(
            f"--gsm8k-param {key}: expected {wrong or 'a whole number'}, got {value!r}"
        )
    return kind(value)


def vllm_body(prompt: str, api: Api = "completions", params: Pairs = ()) -> str:
    """The exact JSON text gsm8k_eval.py posts for ``prompt`` (docs/protocols.md): the
    ``--gsm8k-param`` values last, in its order, as its command line types them (``--top-p 1``
    is the float ``1.0``; settings refused the keys it does not send)."""
    given = {key: json.loads(value) for key, value in params}
    extra = {k: _typed(k, kind, given[k]) for k, kind in VLLM_PARAMS[api].items() if k in given}
    data: dict[str, Any]
    if api == "chat":
        data = {"messages": [{"role": "user", "content": prompt}], "max_tokens": VLLM.max_tokens}
    else:
        data = {"prompt": prompt, "max_tokens": VLLM.max_tokens, "stop": list(VLLM.stop)}
    return json.dumps({**data, "temperature": VLLM.temperature, "seed": VLLM.seed, **extra})


def vllm_request(problem: Problem, train: Pairs, api: Api, shots: int, params: Pairs) -> Request:
    """The request gsm8k_eval.py sends for ``problem``: its exact body in ``wire``, and the
    same prompt and sampling in the fields reports read."""
    prompt = fewshot_prompt(problem.question, train, shots)
    common: dict[str, Any] = {
        "problem_id": problem.id,
        "temperature": VLLM.temperature,
        "max_tokens": VLLM.max_tokens,
        "seed": VLLM.seed,
        "params": tuple(params),
        "wire": vllm_body(prompt, api, params),
    }
    if api == "chat":
        return Request(api="chat", messages=(("user", prompt),), **common)
    return Request(api="completions", prompt=prompt, stop=VLLM.stop, **common)


def sglang_request(problem: Problem, rows: Pairs, shots: int, params: Pairs) -> Request:
    """few_shot_gsm8k.py's prompt and sampling for ``problem`` as a completions request;
    ``rows`` is the evaluated split in file order (its first ``shots`` are the examples)."""
    return Request(
        problem_id=problem.id,
        api="completions",
        prompt=fewshot_prompt(problem.question, rows, shots),
        temperature=SGLANG.temperature,
        max_tokens=SGLANG.max_tokens,
        stop=SGLANG.stop,
        params=tuple(params),
    )
