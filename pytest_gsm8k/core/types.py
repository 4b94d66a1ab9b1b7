"""Value types that cross module boundaries: frozen dataclasses, so each stage is tested on
its own and requests hash the same in every process (the cache is keyed by them)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from decimal import Decimal
from typing import Any, Literal

from pytest_gsm8k.core.scrub import clip

Api = Literal["chat", "completions"]
#: (question, answer) rows of a split or exemplars, or --gsm8k-param's (key, canonical JSON)
Pairs = Sequence[tuple[str, str]]

#: a billion tokens for one GSM8K answer is no count (summed, it prints nonsense totals)
MAX_TOKEN_COUNT = 10**9


def valid_usage(raw: Any, names: tuple[str, ...] | None = None) -> tuple[dict[str, int], list[str]]:
    """The counts in a ``usage`` that are counts (integral, 0 to :data:`MAX_TOKEN_COUNT`), and a
    ``name=value`` note for each other (never summed); ``names`` limits the fields read."""
    counts: dict[str, int] = {}
    bad: list[str] = []
    raw = raw if isinstance(raw, dict) else {}
    for name in [n for n in (raw if names is None else names) if n in raw]:
        value = raw[name]
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKEN_COUNT:
            counts[str(name)] = value
        else:
            bad.append(f"{name}={clip(repr(value), 40)}")
    return counts, bad


@dataclass(frozen=True)
class Problem:
    """One GSM8K row: its position in the split is its identity."""

    index: int
    split: str
    question: str
    answer: str
    gold: Decimal
    #: the vLLM config (--gsm8k-config) this problem is asked for: one group of items each
    group: str = ""

    @property
    def id(self) -> str:
        """``test-0042`` (``Qwen3-0.6B-FP8:test-0042`` in a config's group): not a run position."""
        plain = f"{self.split}-{self.index:04d}"
        return f"{self.group}:{plain}" if self.group else plain


@dataclass(frozen=True)
class Request:
    """Everything sent to the model for one problem (``n`` samples: one call or several)."""

    problem_id: str
    api: Api
    messages: tuple[tuple[str, str], ...] = ()
    prompt: str = ""
    temperature: float | None = 0.0
    max_tokens: int | None = 1024
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    #: --gsm8k-param: (key, canonical JSON) merged into the body last
    params: tuple[tuple[str, str], ...] = ()
    #: a preset's exact body text (key order, escapes): sent as it is and hashed for the cache
    wire: str | None = None
    #: --gsm8k-repeats: which ask this is (in the cache key after the first, not in the body)
    repeat: int = 0

    def asks(self, repeats: int) -> list[Request]:
        return [replace(self, repeat=i) for i in range(max(1, repeats))]

    def body(self, model: str) -> dict[str, Any]:
        """The JSON body the endpoint receives and the cache key hashes."""
        if self.wire is not None:
            return dict(json.loads(self.wire))
        body: dict[str, Any] = {"model": model}
        if self.api == "chat":
            body["messages"] = [{"role": role, "content": text} for role, text in self.messages]
        else:
            body["prompt"] = self.prompt
        optional: dict[str, Any] = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        optional.update(n=self.n if self.n != 1 else None, stop=list(self.stop) or None)
        body.update((k, v) for k, v in {**optional, "seed": self.seed}.items() if v is not None)
        body.update((key, json.loads(value)) for key, value in self.params)
        return body


@dataclass(frozen=True)
class Completion:
    """One sampled answer."""

    text: str
    finish_reason: str | None = None
    reasoning: str | None = None


@dataclass
class ModelResponse:
    """All samples for one request, with what the server told us about them."""

    completions: list[Completion]
    usage: dict[str, int] = field(default_factory=dict)
    model: str | None = None
    cached: int = 0  # how many of the completions came from the on-disk cache
    #: the reply's ``system_fingerprint`` (the serving stack's build), when it gave one
    fingerprint: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "completions": [asdict(c) for c in self.completions],
            "usage": dict(self.usage),
            "model": self.model,
            "system_fingerprint": self.fingerprint,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModelResponse:
        comps = [
            Completion(str(c["text"]), c.get("finish_reason"), c.get("reasoning"))
            for c in data["completions"]
        ]
        fingerprint = data.get("system_fingerprint")
        fingerprint = fingerprint if isinstance(fingerprint, str) else None
        return cls(comps, valid_usage(data.get("usage"))[0], data.get("model"), 0, fingerprint)


def stable_hash(obj: Any) -> str:
    """sha256 of canonical JSON: the same in every process and every run."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


#: what a user's model callable may return for one request (one text or Completion a sample)
Reply = str | list[str] | Completion | list[Completion] | ModelResponse
#: a model a user plugs in through the ``gsm8k_model`` fixture, sync or async
ModelCallable = Callable[[Request], Reply | Awaitable[Reply]]
