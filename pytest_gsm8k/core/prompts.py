"""Protocol + Problem -> Request. Pure. Everything that changes what the model sees or how its
answer is judged is a field of :class:`Protocol`; :meth:`Protocol.identity` is what is compared."""

from __future__ import annotations

import hashlib
import json
import random
import re
from dataclasses import dataclass, field, replace
from typing import Any

from pytest_gsm8k.core.engine_ci import fewshot_prompt, sglang_request, vllm_request
from pytest_gsm8k.core.presets import PRESETS, lm_eval_request
from pytest_gsm8k.core.scrub import printable
from pytest_gsm8k.core.types import Api, Pairs, Problem, Request

COT_INSTRUCTION = (
    "Solve the problem step by step. "
    'End your response with a final line of the form "#### <number>".'
)
CALCULATOR = re.compile(r"<<[^<>]*>>")  # a train answer's annotations (<<2*3=6>>): not shown
#: the fields that make two numbers comparable, in the order reports write them
_IDENTITY: tuple[str, ...] = ("name", "samples", "temperature", "api", "shots", "fewshot_source")
_IDENTITY += ("max_tokens", "stop", "extractor", "answer_regex", "preset")


def _hash(text: str) -> str | None:
    # surrogatepass: --gsm8k-system's undecodable bytes are lone surrogates (UTF-8 text unchanged)
    return hashlib.sha256(text.encode(errors="surrogatepass")).hexdigest()[:16] if text else None


@dataclass(frozen=True)
class Protocol:
    """How problems are asked and judged; see :meth:`identity`."""

    name: str = "test@1"  # test@1, pass@N, maj@N
    samples: int = 1
    temperature: float | None = 0.0  # None: left to the server
    api: Api = "chat"
    shots: int = 0
    fewshot_source: str = "none"  # "train (seed 1234)" or a file name
    exemplars: tuple[tuple[str, str], ...] = field(default=(), repr=False)  # (question, answer)
    system: str | None = None
    max_tokens: int | None = 1024  # None: left to the server
    stop: tuple[str, ...] = ()
    extractor: str = "strict"
    answer_regex: str | None = None
    preset: str | None = None
    #: a preset's (question, raw answer) pool in file order: train, or SGLang's evaluated split
    train: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    params: tuple[tuple[str, str], ...] = ()  # --gsm8k-param: (key, canonical JSON)

    @property
    def label(self) -> str:
        """Short name for headlines, e.g. ``test@1, 0-shot CoT``; fit for one line (a
        --gsm8k-param key or value may hold a newline or an escape)."""
        parts = [self.name, f"{self.shots}-shot CoT"]
        parts += ["completions"] if self.api == "completions" else []
        parts += [f"preset {self.preset}"] if self.preset else []
        if self.extractor not in ("strict", "strict-match"):
            parts.append(f"extract {self.extractor}")
        parts += ["params " + " ".join(f"{k}={v}" for k, v in self.params)] if self.params else []
        return printable(", ".join(parts))

    def identity(self) -> dict[str, Any]:
        """Every field that makes two numbers comparable (exemplar texts hashed)."""
        pairs = "\x00".join(f"{q}\x01{a}" for q, a in self.exemplars or self.train)
        identity = {k: getattr(self, k) for k in _IDENTITY[:6]}
        identity.update(fewshot_hash=_hash(pairs), system_hash=_hash(self.system or ""))
        identity.update({k: getattr(self, k) for k in _IDENTITY[6:]}, stop=list(self.stop))
        if self.params:  # absent without params: baselines recorded before them still match
            identity["params"] = {key: json.loads(value) for key, value in self.params}
        if self.preset is not None:  # a new release of its peer's script is a new protocol
            identity["preset_version"] = PRESETS[self.preset].version
        return identity

    def request(self, problem: Problem) -> Request:
        if self.preset == "lm-eval":
            request = lm_eval_request(problem, self.train, self.api, self.system)
            return replace(request, params=self.params)
        if self.preset == "vllm":
            return vllm_request(problem, self.train, self.api, self.shots, self.params)
        if self.preset == "sglang":
            return sglang_request(problem, self.train, self.shots, self.params)
        common: dict[str, Any] = {"temperature": self.temperature, "n": self.samples}
        common.update(max_tokens=self.max_tokens, params=self.params)
        examples = [(question, CALCULATOR.sub("", answer)) for question, answer in self.exemplars]
        if self.api == "chat":  # the exemplars as user/assistant turns, then the question
            messages = [("system", self.system)] if self.system else []
            for question, solution in [*examples, (problem.question, None)]:
                messages.append(("user", f"{question}\n\n{COT_INSTRUCTION}"))
                messages += [("assistant", solution)] if solution is not None else []
            return Request(problem.id, "chat", messages=tuple(messages), stop=self.stop, **common)
        prompt = fewshot_prompt(problem.question, examples, len(examples))
        stop = self.stop or ("Question:", "</s>", "<|im_end|>", "\n\n")
        return Request(problem.id, "completions", prompt=prompt, stop=stop, **common)


def draw_exemplars(pool: Pairs, shots: int, seed: int) -> tuple[tuple[str, str], ...]:
    """``shots`` exemplars drawn from ``pool`` with a fixed seed, the same for every problem."""
    if shots > len(pool):
        raise ValueError(f"--gsm8k-shots {shots}: only {len(pool)} exemplars are available")
    return tuple(random.Random(seed).sample(list(pool), shots)) if shots else ()
