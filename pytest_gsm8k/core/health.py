"""Hints for a run whose answers fail in a recognisable way: the health gates say *that* the
format failed, these the likely *why*, once. A chat model asked through the completions API
reads as one that cannot count (vllm-project/vllm#48253). Pure."""

from __future__ import annotations

import re
from collections.abc import Iterable

#: the unparsed share from which the hint is given (a few stray answers are not a pattern)
HINT_MIN_SHARE = 0.10
#: the fewest unparsed problems that give the hint (a 3-problem smoke run says nothing)
HINT_MIN_COUNT = 5
#: turn markup of the common chat templates (ChatML, Llama 3, Gemma, Mistral/Llama 2, Phi)
TEMPLATE_TOKENS: tuple[str, ...] = (
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
#: what in a model id marks an instruction-tuned model (``it`` as a whole word: Gemma's ``-it``)
_ID_WORDS = {"instruct": "instruct", "chat": "chat", "-it": r"(?:^|[^a-z0-9])it(?:$|[^a-z0-9])"}


def chat_sign(models: Iterable[str], texts: Iterable[str]) -> str | None:
    """Why the model looks like a chat model (a short phrase), or None when it does not."""
    for model in models:
        if word := next((w for w, p in _ID_WORDS.items() if re.search(p, model.lower())), None):
            return f"its id {model!r} has {word!r}"
    for text in texts:
        if token := next((t for t in TEMPLATE_TOKENS if t in text), None):
            return f"a reply holds the chat-template token {token!r}"
    return None


def chat_api_hint(
    api: str, models: Iterable[str], unparsed: int, n: int, texts: Iterable[str]
) -> str | None:
    """The one line suggesting ``--gsm8k-api chat``, or None when the run gives no cause
    (``texts``: the replies, read only until a sign is found)."""
    if api != "completions" or unparsed < HINT_MIN_COUNT or unparsed / n < HINT_MIN_SHARE:
        return None
    if (sign := chat_sign(models, texts)) is None:
        return None
    return (
        f"hint: {unparsed / n:.1%} of {n} problems unparsed ({unparsed}) through "
        f"--gsm8k-api completions, and the model looks like a chat model ({sign}): "
        "try --gsm8k-api chat, which applies its chat template"
    )


#: what OpenAI's reasoning models (o1, o3, gpt-5, ...) answer, with HTTP 400, to a classic
#: chat model's fields: ``max_tokens`` and a temperature other than 1
_REASONING_REFUSALS = re.compile(
    r"Unsupported parameter: 'max_tokens'.*max_completion_tokens"
    r"|Unsupported value: 'temperature' does not support",
    re.IGNORECASE,
)

REASONING_MODEL_FIX = (
    "this endpoint refuses as OpenAI's reasoning models do: run with --gsm8k-max-tokens none "
    "--gsm8k-param max_completion_tokens=N --gsm8k-temperature none (such a model samples at "
    "temperature 1: calibrate its baseline with --gsm8k-repeats K)"
)


def reasoning_model_hint(message: str) -> str | None:
    """The options that get a reasoning model through, all at its first refusal (an HTTP 400
    names one field at a time)."""
    return REASONING_MODEL_FIX if _REASONING_REFUSALS.search(message) else None
