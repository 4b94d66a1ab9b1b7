"""The hint that a chat model is being asked through the completions API. Pure.

Without its chat template a chat model often continues the prompt in its own markup or drops
the ``#### N`` line, and reads as a model that cannot count (vllm-project/vllm#48253: 18.8%
invalid through completions). The health gates say *that* the format failed; this says the
likely *why*, once (the rule: docs/baselines.md#answer-format-health).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

#: the unparsed share from which the hint is given (a few stray answers are not a pattern)
HINT_MIN_SHARE = 0.10
#: the fewest unparsed problems that give the hint (a 3-problem smoke run says nothing)
HINT_MIN_COUNT = 5
#: turn markup of the common chat templates (ChatML, Llama 3, Gemma, Mistral/Llama 2, Phi):
#: a reply that holds one came from a model that expected its template
TEMPLATE_TOKENS = (
    "<|im_start|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<start_of_turn>",
    "<end_of_turn>",
    "[INST]",
    "[/INST]",
    "<|assistant|>",
    "<|user|>",
)
#: words of a model id that mark an instruction-tuned model; ``it`` only as a whole word
_ID_WORDS = ("instruct", "chat")
_IT_WORD = re.compile(r"(?:^|[^a-z0-9])it(?:$|[^a-z0-9])")


def chat_sign(models: Iterable[str], texts: Iterable[str]) -> str | None:
    """Why the model looks like a chat model (a short phrase), or None when it does not."""
    for model in models:
        lowered = model.lower()
        for word in _ID_WORDS:
            if word in lowered:
                return f"its id {model!r} has {word!r}"
        if _IT_WORD.search(lowered):
            return f"its id {model!r} has '-it'"
    for text in texts:
        for token in TEMPLATE_TOKENS:
            if token in text:
                return f"a reply holds the chat-template token {token!r}"
    return None


def chat_api_hint(
    api: str, models: Iterable[str], unparsed: int, n: int, texts: Iterable[str]
) -> str | None:
    """The one line suggesting ``--gsm8k-api chat``, or None when the run gives no cause.

    ``models``: the model id asked for and those the server reported; ``unparsed`` of ``n``
    problems with a result; ``texts``: the replies (read only until a sign is found).
    """
    if api != "completions" or n < 1 or unparsed < HINT_MIN_COUNT:
        return None
    if unparsed / n < HINT_MIN_SHARE:
        return None
    sign = chat_sign(models, texts)
    if sign is None:
        return None
    return (
        f"hint: {unparsed / n:.1%} of {n} problems unparsed ({unparsed}) through "
        f"--gsm8k-api completions, and the model looks like a chat model ({sign}): "
        "try --gsm8k-api chat, which applies its chat template"
    )


#: what OpenAI's reasoning models (o1, o3, o4-mini, gpt-5, ...) answer, with HTTP 400, to the
#: request fields a classic chat model takes: ``max_tokens`` (they take
#: ``max_completion_tokens``) and a temperature other than 1 (they sample at 1 only)
_REASONING_REFUSALS = (
    re.compile(r"Unsupported parameter: 'max_tokens'.*max_completion_tokens", re.IGNORECASE),
    re.compile(r"Unsupported value: 'temperature' does not support", re.IGNORECASE),
)

REASONING_MODEL_FIX = (
    "this endpoint refuses as OpenAI's reasoning models do: run with --gsm8k-max-tokens none "
    "--gsm8k-param max_completion_tokens=N --gsm8k-temperature none (such a model samples at "
    "temperature 1: calibrate its baseline with --gsm8k-repeats K)"
)


def reasoning_model_hint(message: str) -> str | None:
    """The options that get a reasoning model through, when ``message`` (an HTTP 400's text)
    is one of its refusals: the endpoint names one field at a time, so a newcomer met two
    stops, one fix each, and would not guess the third option (``max_completion_tokens``).
    All three are named at the first."""
    if any(pattern.search(message) for pattern in _REASONING_REFUSALS):
        return REASONING_MODEL_FIX
    return None
