"""Prompt building: Protocol + Problem -> Request. Pure, no I/O.

The protocol is the unit of comparability: everything that changes what the
model sees or how the answer is judged is a field of :class:`Protocol`, and
:meth:`Protocol.identity` is what reports and baselines compare.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_gsm8k.core.scrub import printable
from pytest_gsm8k.core.types import Api, Problem, Request

COT_INSTRUCTION = (
    "Solve the problem step by step. "
    'End your response with a final line of the form "#### <number>".'
)
CALCULATOR = re.compile(r"<<[^<>]*>>")
DEFAULT_COMPLETION_STOP = ("Question:", "</s>", "<|im_end|>", "\n\n")


def _pairs_hash(pairs: Iterable[tuple[str, str]]) -> str:
    return hashlib.sha256("\x00".join(f"{q}\x01{a}" for q, a in pairs).encode()).hexdigest()[:16]


def clean_solution(answer: str) -> str:
    """A train answer as a worked example: calculator annotations ``<<2*3=6>>`` removed."""
    return CALCULATOR.sub("", answer)


@dataclass(frozen=True)
class Exemplar:
    question: str
    answer: str


@dataclass(frozen=True)
class Protocol:
    """How problems are asked and judged; see :meth:`identity`."""

    name: str = "test@1"  # test@1, pass@N, maj@N
    samples: int = 1
    temperature: float | None = 0.0  # None: left to the server
    api: Api = "chat"
    shots: int = 0
    fewshot_source: str = "none"  # "train (seed 1234)" or a file name
    exemplars: tuple[Exemplar, ...] = field(default=(), repr=False)
    system: str | None = None
    max_tokens: int | None = 1024  # None: left to the server
    stop: tuple[str, ...] = ()
    extractor: str = "strict"
    answer_regex: str | None = None
    preset: str | None = None
    #: a preset's example pool in file order (question, raw answer): the whole train split
    #: (lm-eval samples from it per problem, vLLM takes its first rows), or for SGLang the
    #: evaluated split itself
    train: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    #: --gsm8k-param: (key, canonical JSON) merged into every request body
    params: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        """Short name for headlines, e.g. ``test@1, 0-shot CoT``; fit for one line (a
        --gsm8k-param key or value may hold a newline or an escape)."""
        shots = f"{self.shots}-shot CoT"
        parts = [self.name, shots]
        if self.api == "completions":
            parts.append("completions")
        if self.preset:
            parts.append(f"preset {self.preset}")
        if self.extractor not in ("strict", "strict-match"):
            parts.append(f"extract {self.extractor}")
        if self.params:
            parts.append("params " + " ".join(f"{k}={v}" for k, v in self.params))
        return printable(", ".join(parts))

    def params_dict(self) -> dict[str, Any]:
        """The --gsm8k-param values, decoded."""
        return {key: json.loads(value) for key, value in self.params}

    def identity(self) -> dict[str, Any]:
        """Every field that makes two numbers comparable (exemplar texts hashed)."""
        ex_hash = _pairs_hash((e.question, e.answer) for e in self.exemplars)
        train_hash = _pairs_hash(self.train)
        identity: dict[str, Any] = {
            "name": self.name,
            "samples": self.samples,
            "temperature": self.temperature,
            "api": self.api,
            "shots": self.shots,
            "fewshot_source": self.fewshot_source,
            "fewshot_hash": ex_hash if self.exemplars else (train_hash if self.train else None),
            "system_hash": (
                hashlib.sha256(self.system.encode()).hexdigest()[:16] if self.system else None
            ),
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
            "extractor": self.extractor,
            "answer_regex": self.answer_regex,
            "preset": self.preset,
        }
        if self.params:  # absent without params: baselines recorded before them still match
            identity["params"] = self.params_dict()
        if self.preset is not None:
            # which release of the peer's script the preset copies: a preset brought up to a
            # new release is a new protocol, whose numbers are not compared with the old one's
            from pytest_gsm8k.core.presets import PRESETS

            spec = PRESETS.get(self.preset)
            identity["preset_version"] = spec.version if spec is not None else None
        return identity

    def request(self, problem: Problem) -> Request:
        """The request for one problem."""
        if self.preset == "lm-eval":
            from pytest_gsm8k.core.presets import lm_eval_request

            request = lm_eval_request(problem, self.train, self.api, system=self.system)
            return replace(request, params=self.params) if self.params else request
        if self.preset == "vllm":
            from pytest_gsm8k.core.engine_ci import vllm_request

            return vllm_request(problem, self.train, self.api, self.shots, self.params)
        if self.preset == "sglang":
            from pytest_gsm8k.core.engine_ci import sglang_request

            return sglang_request(problem, self.train, self.shots, self.params)
        common: dict[str, Any] = {
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "n": self.samples,
            "params": self.params,
        }
        if self.api == "chat":
            messages = tuple(chat_messages(self, problem.question))
            return Request(problem.id, "chat", messages=messages, stop=self.stop, **common)
        prompt = completion_prompt(self, problem.question)
        stop = self.stop or DEFAULT_COMPLETION_STOP
        return Request(problem.id, "completions", prompt=prompt, stop=stop, **common)


def chat_messages(protocol: Protocol, question: str) -> list[tuple[str, str]]:
    """System prompt, exemplars as user/assistant turns, then the question."""
    messages: list[tuple[str, str]] = []
    if protocol.system:
        messages.append(("system", protocol.system))
    for ex in protocol.exemplars:
        messages.append(("user", f"{ex.question}\n\n{COT_INSTRUCTION}"))
        messages.append(("assistant", clean_solution(ex.answer)))
    messages.append(("user", f"{question}\n\n{COT_INSTRUCTION}"))
    return messages


def completion_prompt(protocol: Protocol, question: str) -> str:
    """Plain-text few-shot prompt for base models: ``Question: ...\\nAnswer: ...`` blocks."""
    parts = [
        f"Question: {ex.question}\nAnswer: {clean_solution(ex.answer)}\n\n"
        for ex in protocol.exemplars
    ]
    parts.append(f"Question: {question}\nAnswer:")
    return "".join(parts)


def draw_exemplars(pool: Sequence[Exemplar], shots: int, seed: int) -> tuple[Exemplar, ...]:
    """``shots`` exemplars drawn from ``pool`` with a fixed seed, the same for every problem."""
    if shots > len(pool):
        raise ValueError(f"--gsm8k-shots {shots}: only {len(pool)} exemplars are available")
    if shots == 0:
        return ()
    return tuple(random.Random(seed).sample(list(pool), shots))
