"""Options, their ini twins and their checks, each declared once as a :class:`Settings` field;
what relates two options is in :func:`_across`. README's options table says the rest (checked
by tests/repo/test_options_table.py). Imported at every pytest start: nothing heavy."""

from __future__ import annotations

import json
import math
import operator
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any, Literal
from urllib.parse import urlsplit

from pytest_gsm8k.core import jsontext

#: pass@N/maj@N above this is refused: N requests' worth of samples per problem, kept in memory
MAX_SAMPLES = 1024
#: core/scoring.py's RULES (a test keeps them equal): pytest's start does not import scoring
EXTRACTORS = ("strict", "answer-is", "boxed", "flexible", "last-int")
OMIT = "none"  # an ``omit`` option's value that leaves the field out of the request body


class SettingsError(Exception):
    """A bad option value; the message names the option."""


@dataclass(frozen=True)
class Option:
    """One option as the plugin registers and reads it, made from its :class:`Settings` field."""

    name: str  # "min-acc" -> --gsm8k-min-acc and ini gsm8k_min_acc
    kind: str  # "str", "int", "float", "bool" or "list"
    help: str
    default: Any = None
    metavar: str | None = None
    field: str = ""
    bounds: tuple[tuple[str, float], ...] = ()  # (("ge", 0), ("le", 1)): the range, in order
    unit: str = ""  # said after the range: "<= 1e+06 seconds"
    why: str = ""  # said after a range error, in parentheses
    choices: tuple[str, ...] = ()
    omit: bool = False  # ``none``: the request body leaves the field out (the server decides)

    @property
    def flag(self) -> str:
        return f"--gsm8k-{self.name}"

    @property
    def dest(self) -> str:
        return "gsm8k_" + self.name.replace("-", "_")

    @classmethod
    def of(cls, f: Field[Any]) -> Option:
        """The option a ``Settings`` field declares, its kind read from the annotation."""
        spec = dict(f.metadata["gsm8k"])
        base = str(f.type).removesuffix(" | None")
        kind = base if base in _READ else "list" if base.startswith("tuple[") else "str"
        name = spec.pop("name", f.name.replace("_", "-"))
        bounds = tuple((key, spec.pop(key)) for key in _SIGNS if key in spec)
        default = None if kind == "list" else f.default
        return cls(name, kind, default=default, field=f.name, bounds=bounds, **spec)

    def parse(self, raw: Any, said: str) -> Any:
        """``raw`` as this option's type, range and choices; None when not given (an empty
        value clears the ini's); errors name it as ``said`` (the flag, or the ini key) and quote
        the value given, cut at 200 characters."""
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return None
        if self.omit and str(raw).strip().lower() == OMIT:
            return OMIT
        if self.kind == "list":
            return [raw] if isinstance(raw, str) else [str(x) for x in raw]
        given = f"{raw!r:.200}"  # quoted in every refusal, cut: a pasted value has any length
        try:
            value = _READ[self.kind](raw)
        except (KeyError, ValueError):
            raise SettingsError(f"{said}: expected {_EXPECTED[self.kind]}, got {given}") from None
        if self.metavar == "PATH" and (problem := unexpandable(value)):
            raise SettingsError(f"{said}: {problem}")
        if self.choices and value not in self.choices:
            *first, last = self.choices
            one_of = f"one of {', '.join(first)}," if first[1:] else f"{first[0]} or"
            raise SettingsError(f"{said}: expected {one_of} {last}, got {given}")
        # nan passes every comparison check and inf overflows a socket's timeout
        if self.kind == "float" and not math.isfinite(value):
            raise SettingsError(f"{said}: expected a finite number, got {given}")
        if problem := out_of_range(value, **dict(self.bounds)):
            why = f" ({self.why})" if self.why else ""
            raise SettingsError(f"{said}: {problem}{self.unit}, got {value}{why}")
        return value


def unexpandable(path: str) -> str | None:
    """Why ``path``'s ``~`` or ``~name`` names no home folder (pathlib's expanduser raises
    there, a traceback; os.path's leaves it as it is), else None."""
    if os.path.expanduser(path)[:1] != "~":
        return None
    return f"cannot expand {path!r:.200}: no such user or home folder"


#: a bound's sign, in the order a range is said; ``operator``'s function of its name tests it
_SIGNS = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}


def out_of_range(value: float, **bounds: float) -> str | None:
    """``must be >= 0 and <= 1`` (the whole range, said one way for every option and config
    field) when ``value`` is outside ``bounds`` (``gt``, ``ge``, ``lt``, ``le``), else None."""
    if all(getattr(operator, key)(value, bound) for key, bound in bounds.items()):
        return None
    said = (f"{_SIGNS[key]} {bound:g}" for key, bound in bounds.items())
    return "must be " + " and ".join(said)


#: the words pytest's own bool ini type accepts
_BOOL = dict.fromkeys(("1", "true", "yes", "on", "y", "t"), True)
_BOOL |= dict.fromkeys(("0", "false", "no", "off", "n", "f"), False)
_READ: dict[str, Callable[[Any], Any]] = {"str": str, "float": float}
_READ["bool"] = lambda raw: _BOOL[str(raw).strip().lower()]  # KeyError: not a bool word
_READ["int"] = lambda raw: int(str(raw))  # never int(3.7): that would be 3
_EXPECTED = {"bool": "true or false", "int": "an integer", "float": "a number"}


def opt(help: str, default: Any = None, **spec: Any) -> Any:
    """A :class:`Settings` field that is an option; ``spec``: :class:`Option`'s attributes."""
    return field(default=default, metadata={"gsm8k": {"help": help, **spec}})


_PATH: dict[str, Any] = {"metavar": "PATH"}
_COUNT: dict[str, Any] = {"metavar": "N", "gt": 0}
_RATE: dict[str, Any] = {"metavar": "RATE", "ge": 0, "le": 1}
#: a wait in seconds: 1e6 (11 days) is the longest that means anything; longer overflows a socket's
WAIT = {"gt": 0.0, "le": 1e6}
_SECONDS: dict[str, Any] = {"metavar": "S", "unit": " seconds", **WAIT}


@dataclass(frozen=True)
class Settings:
    """Validated settings, each field an option's declaration (``--help`` says its one line)."""

    # fmt: off
    model: str | None = opt("model id to evaluate ('local': a GGUF on llama.cpp)", metavar="ID")
    base_url: str | None = opt("OpenAI-compatible base URL", metavar="URL")
    api_key_env: str = opt("variable holding the API key", "OPENAI_API_KEY", metavar="VAR")
    data: str | None = opt("local GSM8K file or folder", **_PATH)
    dataset: str | None = opt("Hugging Face dataset", metavar="NAME")
    dataset_config: str = opt("dataset config: main or socratic", "main")
    vllm_config: str | None = opt(  # --gsm8k-config (the field keeps its older name)
        "vLLM's GSM8K CI configs: a YAML, a folder or a models-*.txt", **_PATH, name="config")
    split: str = opt("split to evaluate", "test")
    limit: int | None = opt("run a seeded, stable subset of N problems", **_COUNT)
    seed: int = opt("seed of the --gsm8k-limit subset and of few-shot draws", 1234)
    min_acc: float | None = opt("fail the run below this accuracy", metavar="ACC", ge=0, le=1)
    max_unparsed: float | None = opt("fail above this share of answers with no number", **_RATE)
    max_truncated: float | None = opt("fail above this share of answers cut short", **_RATE)
    max_error: float | None = opt("fail above this share of problems with no answer", **_RATE)
    protocol: str = opt("test@1, pass@N or maj@N", "test@1")
    temperature: float | None = opt("sampling temperature", ge=0, le=2, omit=True)
    shots: int = opt("few-shot exemplars drawn from train", 0, metavar="K", ge=0)
    fewshot_file: str | None = opt("JSONL of your own exemplars", metavar="PATH")
    system: str | None = opt("system prompt (chat API)", metavar="TEXT")
    api: Literal["chat", "completions"] = opt(
        "chat or completions", "chat", choices=("chat", "completions"))
    stop: tuple[str, ...] = opt("stop sequence (repeatable)", (), metavar="TEXT")
    max_tokens: int | None = opt("max new tokens per sample", 1024, omit=True, **_COUNT)
    extract: str = opt("extractor that decides correctness", "strict", choices=EXTRACTORS)
    answer_regex: str | None = opt("the strict pattern; group 1 is the number", metavar="REGEX")
    preset: str | None = opt("reproduce a peer exactly: lm-eval, vllm or sglang", metavar="NAME")
    report: str | None = opt("write the JSON report here", metavar="PATH")
    concurrency: int = opt("requests in flight at once", 32, le=4096, **_COUNT)
    timeout: float = opt("seconds per HTTP request", 300.0, **_SECONDS)
    max_retries: int = opt("retries on 429, 5xx and dropped connections", 5, metavar="N", ge=0)
    serve: str | None = opt("start this server for the run ({port}, {model})", metavar="CMD")
    serve_timeout: float = opt("seconds the served server may take to start", 900.0, **_SECONDS)
    params: tuple[tuple[str, str], ...] = opt(  # (key, canonical JSON), in the order given
        "KEY=VALUE merged into every request body (repeatable)", (), metavar="KEY=VALUE",
        name="param")
    cache_dir: str | None = opt("response cache folder", **_PATH)
    no_cache: bool = opt("do not read or write the response cache", False)
    resume: bool = opt("reuse the answers earlier runs left in the response cache", False)
    stall_timeout: float = opt("stop when no answer came for this long", 60.0, **_SECONDS)
    local_threads: int | None = opt("--gsm8k-model=local: llama.cpp threads", **_COUNT)
    local_ctx: int | None = opt("--gsm8k-model=local: context size", **_COUNT)
    baseline: str | None = opt("baseline file (written with --snapshot-update)", **_PATH)
    baseline_name: str | None = opt("baseline name", metavar="NAME")
    max_drop: float = opt("drop allowed beyond the noise-aware test", 0.0, metavar="D", ge=0, le=1)
    #: 0.01: an unchanged build fails at most 1 run in 100 (the exact test is conservative)
    alpha: float = opt(
        "level of the noise-aware baseline test", 0.01, metavar="A", ge=1e-6, lt=1,
        why="the noise-aware test's tail shortcuts are exact only above that")
    require_baseline: bool = opt("fail without a baseline holding every problem of the run", False)
    baseline_partial: bool = opt("let --snapshot-update write a partial baseline", False)
    html: str | None = opt("write the run's HTML page here", metavar="PATH")
    markdown: str | None = opt("write the run's Markdown summary here", **_PATH)
    early_stop: str | None = opt(
        "stop once the verdicts are settled: certain or sequential", metavar="MODE",
        choices=("certain", "sequential"))
    early_stop_alpha: float = opt(
        "the sequential early stop's error rate", 0.05, metavar="A", gt=0, lt=1)
    progress: bool | None = opt("show a progress line instead of dots")  # None: on a terminal
    repeats: int = opt("ask every problem K times (test@1)", 1, metavar="K", ge=1, le=100)
    shard: str | None = opt("run shard I of N (a CI matrix job)", metavar="I/N")
    # fmt: on
    samples: int = 1  # pass@N / maj@N's N (1 for test@1): from the protocol, not an option

    @property
    def asked(self) -> bool:
        """A model is asked for (a model, a server or configs): GSM8K work from the start."""
        return bool(self.model or self.serve or self.vllm_config)

    def api_key(self) -> str | None:
        """From the environment only (an option would land in logs)."""
        return os.environ.get(self.api_key_env) or None

    def resolved_base_url(self) -> str | None:
        return self.base_url or os.environ.get("OPENAI_BASE_URL") or None


OPTIONS: tuple[Option, ...] = tuple(Option.of(f) for f in fields(Settings) if f.metadata)
_BY_FIELD = {o.field: o for o in OPTIONS}  # the values as read are keyed by field

#: --gsm8k-model=local: a base model; a loaded CPU server may take minutes per answer (its death
#: is watched directly) and answers one at a time (32 queued outlived --gsm8k-timeout)
LOCAL_DEFAULTS: dict[str, Any] = dict(
    api="completions", shots=5, max_tokens=256, stall_timeout=300.0, concurrency=2
)


def is_local_spec(model: object) -> bool:
    """``local`` or ``local:PATH`` (not LM Studio's ``local-model``)."""
    return isinstance(model, str) and (model == "local" or model.startswith("local:"))


#: request-body fields the protocol owns: --gsm8k-param may not set them (why, or which option)
_OWNED_OPTIONS = ("model", "max_tokens", "stop", "temperature")
OWNED_FIELDS = {k: f"use {_BY_FIELD[k].flag}" for k in _OWNED_OPTIONS}
OWNED_FIELDS |= {"n": "use --gsm8k-protocol pass@N or maj@N", "prompt": "the protocol builds it"}
OWNED_FIELDS |= {"messages": "the protocol builds them", "stream": "the plugin reads whole replies"}


def parse_params(raw: list[str]) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` items as (key, canonical JSON): VALUE is JSON when it parses, else text."""
    params: dict[str, str] = {}
    for item in raw:
        key, sep, text = str(item).partition("=")
        if not sep or not (key := key.strip()):
            raise SettingsError(f"--gsm8k-param: expected KEY=VALUE, got {item!r:.200}")
        if key in OWNED_FIELDS:
            why = f"the plugin sets {key!r} itself; {OWNED_FIELDS[key]}"
            raise SettingsError(f"--gsm8k-param {key}: {why}")
        if key in params:
            raise SettingsError(f"--gsm8k-param {key}: given twice")
        try:
            value: Any = jsontext.loads(text)
        except jsontext.TooDeep as exc:
            raise SettingsError(f"--gsm8k-param {key}: {exc}") from None
        except ValueError:
            value = text
        params[key] = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return tuple(params.items())


def url_problem(url: str) -> str | None:
    """What makes ``url`` fail deep in a request (a bad port, a malformed IPv6 host), or None."""
    try:
        urlsplit(url.strip()).port  # noqa: B018 (reading it checks it)
    except ValueError as exc:
        return str(exc)
    return None


def with_v1(base_url: str) -> str | None:
    """``base_url`` (fit to print) with ``/v1`` appended when it lacks it, else None: vLLM,
    Ollama, SGLang and llama.cpp serve under /v1, and without it every request is a 404."""
    from pytest_gsm8k.core.scrub import shown_url  # not at import: the option table stays light

    shown = shown_url(base_url).rstrip("/")
    return None if not urlsplit(shown).scheme or shown.endswith("/v1") else shown + "/v1"


#: the openai client's default (here, so the pytest layer names it without importing it)
DEFAULT_BASE_URL = "https://api.openai.com/v1"
#: what --gsm8k-config meant before it took vLLM's configs: the dataset config
DATASET_CONFIGS = ("main", "socratic")
_EACH = "each config's {} decides"
_VLLM_SCORES = "vLLM's scoring rule decides"
_NAMED = "each config's baseline is named by the config and its protocol"
#: what a vLLM config decides, or a matrix of configs cannot honour: refused with why
CONFIG_DECIDES = {
    "model": "each config's model_name names its model",
    "base_url": "each config's server is started for it (--gsm8k-serve changes the command)",
    "limit": _EACH.format("num_questions") + " (vLLM's first N questions)",
    "seed": _EACH.format("seed") + " (vLLM's request seed)",
    "shots": _EACH.format("num_fewshot"),
    "fewshot_file": "vLLM's configs take their shots from train",
    "api": _EACH.format("use_chat_completions"),
    "max_tokens": _EACH.format("max_tokens"),
    "temperature": _EACH.format("temperature"),
    "stop": "vLLM's stop list is part of its protocol",
    "protocol": "vLLM's configs are test@1",
    "system": "vLLM's script sends no system prompt",
    "extract": _VLLM_SCORES,
    "answer_regex": _VLLM_SCORES,
    "params": "vLLM's request fields are the config's",
    "split": "vLLM's configs run the test split",
    "baseline": _NAMED,
    "baseline_name": _NAMED,
}
#: what a server the run starts decides (--gsm8k-serve, the local model)
SERVE_DECIDES = {"base_url": "the run starts the server and asks it at its own URL"}


def _across(
    values: dict[str, Any],
    given: dict[str, bool],
    warn: Callable[[str], None],
    exists: Callable[[str], bool],
) -> None:
    """The rules that relate options, in order: the modes, the preset or the local model, the
    protocol and its N, the checks beyond a range. ``given``: the fields set, True where the ini
    set them."""

    def mode_wins(mode: str, decides: Mapping[str, str]) -> None:
        """A value a mode decides: refused from the command line, set aside with a note from the
        ini (written for another recipe)."""
        for key, why in decides.items():
            if key not in given:
                continue
            option = _BY_FIELD[key]
            if not given[key]:
                raise SettingsError(f"{option.flag} cannot be combined with {mode}: {why}")
            warn(f"ini {option.dest} set aside: {mode} runs ({why}); {option.flag}= clears it")
            del given[key]
            values[key] = option.default

    # the old --gsm8k-config main|socratic (DATASET_CONFIGS)
    if (old := values["vllm_config"]) in DATASET_CONFIGS:
        if exists(old):
            raise SettingsError(
                f"--gsm8k-config {old}: a file or folder named {old!r} exists here; write "
                f"--gsm8k-config ./{old} for vLLM configs or --gsm8k-dataset-config {old} "
                "for the dataset config"
            )
        if "dataset_config" in given and values["dataset_config"] != old:
            raise SettingsError(
                f"--gsm8k-config {old} and --gsm8k-dataset-config {values['dataset_config']} "
                "disagree; give --gsm8k-dataset-config only"
            )
        warn(
            f"--gsm8k-config {old} selects the dataset config: write --gsm8k-dataset-config "
            f"{old} (--gsm8k-config now takes vLLM config files)"
        )
        values.update(dataset_config=old, vllm_config=None)
    if values["vllm_config"]:
        # an ini floor would gate every config beside its own threshold (a command-line one does)
        floor = {"min_acc": "each config's accuracy_threshold - tolerance is its floor"}
        mode_wins("--gsm8k-config", {**CONFIG_DECIDES, **(floor if given.get("min_acc") else {})})
        if values["early_stop"] == "sequential":
            # a seeded random order and a stated alpha: not the exact comparison of vLLM's test
            raise SettingsError(
                "--gsm8k-early-stop sequential cannot be combined with --gsm8k-config: each "
                "config's verdict is vLLM's exact comparison over its first num_questions "
                "problems (--gsm8k-early-stop certain stops each config once its verdict is fixed)"
            )
        if "preset" in given and values["preset"] != "vllm":
            raise SettingsError(
                f"--gsm8k-preset {values['preset']} cannot be combined with --gsm8k-config: "
                "every config runs --gsm8k-preset vllm (vLLM's own requests)"
            )
        if values["serve"] and "{server_args}" not in values["serve"]:
            # another server (SGLang) takes none of vLLM's flags: said, never dropped unseen
            warn(
                "--gsm8k-serve has no {server_args}: the configs' server_args and the flags "
                "vLLM's test adds are not passed to the server"
            )
    local = is_local_spec(values["model"])
    if values["serve"] or local:
        mode_wins("--gsm8k-serve" if values["serve"] else "--gsm8k-model=local", SERVE_DECIDES)
    if (name := values["preset"]) is not None:
        # the preset's values; any of them given as well is refused (the peer's protocol)
        from pytest_gsm8k.core.presets import PRESETS, preset_settings

        chosen = {key: values[key] for key in ("api", "shots") if key in given}
        try:
            fixed = preset_settings(name, **chosen)
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        spec = PRESETS[name]
        for key in (*fixed, *spec.also_fixed):
            if key in given and key not in ("preset", "api", *spec.adjustable):
                flag = _BY_FIELD[key].flag
                raise SettingsError(f"--gsm8k-preset {name} sets {flag} itself; remove {flag}")
        values.update(fixed)
    elif local:
        # A base model does not follow chat instructions: few-shot completions with stops.
        values.update({k: v for k, v in LOCAL_DEFAULTS.items() if k not in given})
    protocol = values["protocol"] = values["protocol"].strip()
    match = re.match(r"^(test@1|(pass|maj)@(-?\d+))$", protocol)
    if not match:
        raise SettingsError(
            f"--gsm8k-protocol: expected test@1, pass@N or maj@N, got {protocol!r:.200}"
        )
    samples = values["samples"] = int(match.group(3) or 1)
    if problem := out_of_range(samples, ge=1, le=MAX_SAMPLES):
        raise SettingsError(f"--gsm8k-protocol {protocol}: N {problem}")
    if values["temperature"] is None:
        values["temperature"] = 0.0 if protocol == "test@1" else 0.7
    values.update({key: None for key in ("temperature", "max_tokens") if values[key] == OMIT})
    if samples > 1 and values["temperature"] == 0.0:
        warn(
            f"--gsm8k-protocol {protocol} at --gsm8k-temperature 0: the {samples} samples will "
            "be identical"
        )
    if values["repeats"] > 1 and protocol != "test@1":
        raise SettingsError(
            f"--gsm8k-repeats {values['repeats']}: repeats measure a single-sample protocol's "
            f"run-to-run noise; --gsm8k-protocol {protocol} samples already (use test@1, or "
            "--gsm8k-repeats 1)"
        )
    values["params"] = parse_params(values["params"] or [])
    if values["preset"] == "vllm":
        from pytest_gsm8k.core.engine_ci import vllm_param_error

        if error := vllm_param_error([key for key, _ in values["params"]], values["api"]):
            raise SettingsError(error)
    if (regex := values["answer_regex"]) is not None:
        try:
            compiled = re.compile(regex)
        except re.error as exc:
            raise SettingsError(f"--gsm8k-answer-regex: invalid regex ({exc})") from None
        if compiled.groups < 1:
            raise SettingsError(
                f"--gsm8k-answer-regex {regex!r:.200}: needs a capture group "
                "(group 1 is the number)"
            )
    if (baseline := values["baseline"]) and not baseline.endswith(".gsm8k"):
        # syrupy deletes (--snapshot-update) the files of a __snapshots__ folder it does not
        # know: only the .gsm8k kind is kept out of its reach
        raise SettingsError(
            f"--gsm8k-baseline {baseline!r:.200}: a baseline file's name ends in .gsm8k"
        )
    if values["shard"] is not None:
        values["shard"] = "{}/{}".format(*parse_shard(values["shard"]))
        if values["early_stop"]:
            raise SettingsError(
                "--gsm8k-shard cannot be combined with --gsm8k-early-stop: a shard cannot see "
                "the other shards' answers (the merge decides on all of them)"
            )
    if values["resume"] and values["no_cache"]:
        raise SettingsError(
            "--gsm8k-resume reads the response cache that --gsm8k-no-cache turns off: give one"
        )
    if values["serve"] and "{port}" not in values["serve"]:
        raise SettingsError(
            "--gsm8k-serve: the command line has no {port}: the server must listen on the free "
            "loopback port the run picks (e.g. 'vllm serve {model} --port {port}')"
        )
    if values["base_url"] and (problem := url_problem(values["base_url"])):
        raise SettingsError(f"--gsm8k-base-url: {problem}")  # the URL may hold a secret


#: the most shards a run may be cut into (--gsm8k-shard I/N): GitHub's job matrix allows 256
MAX_SHARDS = 256


def parse_shard(text: str) -> tuple[int, int]:
    """``--gsm8k-shard I/N`` as ``(I, N)``, with ``1 <= I <= N <= MAX_SHARDS``."""
    match = re.fullmatch(r"\s*(\d{1,6})\s*/\s*(\d{1,6})\s*", text)
    if not match:
        raise SettingsError(f"--gsm8k-shard: expected I/N (e.g. 2/4), got {text[:40]!r}")
    index, count = int(match.group(1)), int(match.group(2))
    for name, value, most in (("N", count, MAX_SHARDS), ("I", index, count)):
        if problem := out_of_range(value, ge=1, le=most):
            raise SettingsError(f"--gsm8k-shard {index}/{count}: {name} {problem}")
    return index, count


def build_settings(
    get: Callable[[Option], Any],
    warn: Callable[[str], None],
    exists: Callable[[str], bool] = lambda path: False,
    from_ini: Callable[[Option], bool] = lambda option: False,
) -> Settings:
    """Every option read through ``get`` (command line, then ini) and checked, then the rules
    across them; ``exists``: the file system; ``from_ini``: whether a value is the ini's."""
    values: dict[str, Any] = {}
    given: dict[str, bool] = {}
    for option in OPTIONS:
        ini = from_ini(option)
        value = option.parse(get(option), f"ini {option.dest}" if ini else option.flag)
        values[option.field] = option.default if value is None else value
        if value is not None:
            given[option.field] = ini
    _across(values, given, warn, exists)
    values.update((o.field, tuple(values[o.field] or ())) for o in OPTIONS if o.kind == "list")
    return Settings(**values)
