"""Options, their ini twins, and their validation: parsed once per process.

One table (:data:`OPTIONS`) defines every option; the plugin registers each
as ``--gsm8k-x`` and ini ``gsm8k_x`` from it, so the two can never drift.
The command line wins over the ini file. Validation errors are one line that
names the option.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pytest_gsm8k.core import jsondepth
from pytest_gsm8k.core.scoring import RULES

#: the smallest --gsm8k-alpha: far below any CI gate's, and where the calibrated test's
#: bounds stop being exact (below 1e-12 its shortcut may return a bound for the p-value)
MIN_ALPHA = 1e-6


class SettingsError(Exception):
    """A bad option value; the message names the option."""


Kind = Literal["str", "int", "float", "bool", "list"]


@dataclass(frozen=True)
class Option:
    name: str  # "min-acc" -> --gsm8k-min-acc and ini gsm8k_min_acc
    kind: Kind
    help: str
    default: Any = None
    metavar: str | None = None
    #: the default in words, for an option whose default is decided at run time (``default``
    #: is None): README's options table shows it, and tests/test_options_table.py checks it
    default_text: str = ""

    @property
    def flag(self) -> str:
        return f"--gsm8k-{self.name}"

    @property
    def dest(self) -> str:
        return "gsm8k_" + self.name.replace("-", "_")


OPTIONS: tuple[Option, ...] = (
    Option(
        "model",
        "str",
        "model id to evaluate; enables the built-in GSM8K test. "
        "'local' serves a packaged GGUF model with llama.cpp",
        metavar="ID",
    ),
    Option(
        "base-url",
        "str",
        "OpenAI-compatible base URL (default: $OPENAI_BASE_URL, else OpenAI)",
        metavar="URL",
        default_text="`$OPENAI_BASE_URL`, else OpenAI",
    ),
    Option(
        "api-key-env",
        "str",
        "environment variable holding the API key",
        "OPENAI_API_KEY",
        metavar="VAR",
    ),
    Option(
        "data",
        "str",
        "local GSM8K file or folder instead of the embedded copy",
        metavar="PATH",
        default_text="the embedded copy",
    ),
    Option(
        "dataset",
        "str",
        "load this Hugging Face dataset through datasets (same columns as "
        "openai/gsm8k) instead of the embedded copy",
        metavar="NAME",
        default_text="the embedded copy",
    ),
    Option("dataset-config", "str", "dataset config: main or socratic", "main"),
    Option(
        "config",
        "str",
        "run vLLM's GSM8K CI configs: a config YAML, a folder of them, or a models-*.txt "
        "list; each config's server is started in turn and gated at threshold - tolerance",
        metavar="PATH",
    ),
    Option("split", "str", "split to evaluate (train is not a reportable number)", "test"),
    Option(
        "limit",
        "int",
        "run a seeded, stable subset of N problems (the first N under the vllm and sglang presets)",
        metavar="N",
    ),
    Option("seed", "int", "seed of the --gsm8k-limit subset and of few-shot sampling", 1234),
    Option("min-acc", "float", "fail the run when accuracy is below this", metavar="ACC"),
    Option(
        "max-unparsed",
        "float",
        "fail the run when more than this share of its problems gave no number "
        "the gating extractor finds",
        metavar="RATE",
    ),
    Option(
        "max-truncated",
        "float",
        "fail the run when more than this share of its problems were cut by "
        "--gsm8k-max-tokens before an answer",
        metavar="RATE",
    ),
    Option(
        "max-error",
        "float",
        "fail the run when more than this share of its problems got no answer (an error)",
        metavar="RATE",
    ),
    Option("protocol", "str", "test@1, pass@N or maj@N", "test@1"),
    Option(
        "temperature",
        "float",
        "sampling temperature (default 0 for test@1, 0.7 otherwise)",
        default_text="0, or 0.7 when sampling",
    ),
    Option("shots", "int", "few-shot chain-of-thought exemplars drawn from train", 0, metavar="K"),
    Option(
        "fewshot-file",
        "str",
        "JSONL of your own exemplars (question/answer) instead of train",
        metavar="PATH",
    ),
    Option("system", "str", "system prompt (chat API)", metavar="TEXT"),
    Option("api", "str", "chat or completions", "chat"),
    Option(
        "stop",
        "list",
        "stop sequence (repeatable)",
        metavar="TEXT",
        default_text="completions: `Question:`, `</s>`, `<|im_end|>`, blank line",
    ),
    Option("max-tokens", "int", "max new tokens per sample", 1024, metavar="N"),
    Option("extract", "str", f"extractor that decides correctness: {', '.join(RULES)}", "strict"),
    Option(
        "answer-regex", "str", "replace the strict pattern; group 1 is the number", metavar="REGEX"
    ),
    Option(
        "preset",
        "str",
        "reproduce a peer exactly: lm-eval (lm-evaluation-harness gsm8k), vllm (vLLM's "
        "gsm8k_eval.py), sglang (SGLang's few_shot_gsm8k.py)",
        metavar="NAME",
    ),
    Option("report", "str", "write the JSON report here", metavar="PATH"),
    Option(
        "concurrency",
        "int",
        "requests in flight at once (per run, shared by xdist workers)",
        32,
        metavar="N",
    ),
    Option("timeout", "float", "seconds per HTTP request", 300.0, metavar="S"),
    Option("max-retries", "int", "retries on 429, 5xx and dropped connections", 5, metavar="N"),
    Option(
        "serve",
        "str",
        "start this server command for the run ({port}: a free loopback port, {model}: "
        "--gsm8k-model) and stop it at the end",
        metavar="CMD",
    ),
    Option(
        "serve-timeout",
        "float",
        "seconds --gsm8k-serve's server may take to answer GET /v1/models",
        900.0,
        metavar="S",
    ),
    Option(
        "param",
        "list",
        "KEY=VALUE merged into every request body (VALUE is JSON when it parses, else a "
        "string; repeatable)",
        metavar="KEY=VALUE",
    ),
    Option(
        "cache-dir",
        "str",
        "response cache folder (default: pytest's cache dir)",
        metavar="PATH",
        default_text="`.pytest_cache/d/gsm8k`",
    ),
    Option("no-cache", "bool", "do not read or write the response cache", False),
    Option(
        "resume",
        "bool",
        "read answers earlier runs left in the response cache (resume an unfinished run of "
        "the same build, or re-score offline); by default every answer is asked for again",
        False,
    ),
    Option(
        "stall-timeout",
        "float",
        "stop the run when no answer arrived for this many seconds while requests are in flight",
        60.0,
        metavar="S",
    ),
    Option(
        "local-threads",
        "int",
        "--gsm8k-model=local: llama.cpp threads (default: the CPUs this process may use)",
        metavar="N",
        default_text="the CPUs available",
    ),
    Option(
        "local-ctx",
        "int",
        "--gsm8k-model=local: context size (default: 2048, more when --gsm8k-max-tokens needs it)",
        metavar="N",
        default_text="2048, more if `--gsm8k-max-tokens` needs it",
    ),
    Option(
        "baseline",
        "str",
        "baseline file (default: __snapshots__/gsm8k/<name>.gsm8k under "
        "the rootdir); written with --snapshot-update",
        metavar="PATH",
        default_text="`__snapshots__/gsm8k/<name>.gsm8k`",
    ),
    Option(
        "baseline-name",
        "str",
        "baseline name (default: derived from the protocol)",
        metavar="NAME",
        default_text="from the protocol",
    ),
    Option(
        "max-drop",
        "float",
        "allowed accuracy drop against the baseline on top of the noise-aware test: a FAIL "
        "needs p < --gsm8k-alpha and a drop above this",
        0.0,
        metavar="D",
    ),
    Option(
        "alpha",
        "float",
        "level of the noise-aware baseline test (exact McNemar for single runs): an "
        "unchanged model fails at most this often",
        0.01,
        metavar="A",
    ),
    Option(
        "require-baseline",
        "bool",
        "fail when no baseline exists or it does not hold every problem of the run",
        False,
    ),
    Option(
        "baseline-partial",
        "bool",
        "let --snapshot-update write a baseline from a run that covers only part of its "
        "selection (-k, -m, --lf, early stop), or one that holds fewer problems than the "
        "baseline it replaces",
        False,
    ),
    Option("html", "str", "write the run's self-contained HTML page here", metavar="PATH"),
    Option(
        "markdown",
        "str",
        "write the run's Markdown summary (what $GITHUB_STEP_SUMMARY gets) here",
        metavar="PATH",
    ),
    Option(
        "early-stop",
        "str",
        "stop once the gates' verdicts are settled: certain (exact) or "
        "sequential (anytime-valid, at --gsm8k-early-stop-alpha)",
        metavar="MODE",
    ),
    Option(
        "early-stop-alpha",
        "float",
        "sequential early stop: the chance that its verdict differs from the full run's",
        0.05,
        metavar="A",
    ),
    Option(
        "progress",
        "bool",
        "show a progress line (answered/total, rate, ETA) in place of the dots; "
        "ini false turns it off",
        default_text="on when the output is a terminal",
    ),
    Option(
        "repeats",
        "int",
        "ask every problem K times (separate requests; test@1 only): a calibrated "
        "baseline with --snapshot-update, a mean over K runs against one",
        1,
        metavar="K",
    ),
    Option(
        "shard",
        "str",
        "run shard I of N (a CI matrix job); python -m pytest_gsm8k merge gates the shards",
        metavar="I/N",
    ),
)

#: --gsm8k-model=local: a base model (few-shot completions), and a stall timeout as long as a
#: request's: a CPU llama.cpp server under load may take minutes per answer, and its death is
#: watched directly (runtime/local.py), so the stall detector only has to catch a hang. Two
#: requests in flight: the server answers one at a time, so more only wait in its queue, where
#: each one's --gsm8k-timeout runs (32 queued requests outlived it on a loaded machine)
LOCAL_DEFAULTS: dict[str, Any] = {
    "api": "completions",
    "shots": 5,
    "max_tokens": 256,
    "stall_timeout": 300.0,
    "concurrency": 2,
}
#: pass@N/maj@N above this is refused: N requests' worth of samples per problem, kept in memory
MAX_SAMPLES = 1024
#: --gsm8k-concurrency above this is refused: more sockets than most systems allow one process
MAX_CONCURRENCY = 4096
#: options that are a number of seconds, and the longest one that means anything (about 11
#: days): a wait past it is a wait for ever, and a longer one overflows a socket's timeout
SECONDS = ("timeout", "serve-timeout", "stall-timeout")
MAX_SECONDS = 1e6
#: --gsm8k-repeats above this is refused: K full runs of the split per run
MAX_REPEATS = 100
PROTOCOL_RE = re.compile(r"^(test@1|(pass|maj)@(-?\d+))$")


def is_local_spec(model: object) -> bool:
    """Whether ``--gsm8k-model`` names the local preset: exactly ``local`` or ``local:PATH``.

    A model id that merely starts with "local" (LM Studio's ``local-model``) is a
    model id like any other.
    """
    return isinstance(model, str) and (model == "local" or model.startswith("local:"))


def convert_bool(raw: Any) -> bool:
    """The words pytest's own bool ini type accepts; ValueError otherwise."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("1", "true", "yes", "on", "y", "t"):
        return True
    if text in ("0", "false", "no", "off", "n", "f", ""):
        return False
    raise ValueError(raw)


#: options whose value ``none`` leaves the field out of the request body (server default)
OMITTABLE = ("temperature", "max-tokens")
OMIT = "none"

#: request-body fields the protocol owns: --gsm8k-param may not set them (why, or which option)
OWNED_FIELDS = {
    "model": "use --gsm8k-model",
    "messages": "the protocol builds them",
    "prompt": "the protocol builds it",
    "n": "use --gsm8k-protocol pass@N or maj@N",
    "max_tokens": "use --gsm8k-max-tokens",
    "temperature": "use --gsm8k-temperature",
    "stop": "use --gsm8k-stop",
    "stream": "the plugin reads whole replies",
}


def parse_params(raw: list[str]) -> tuple[tuple[str, str], ...]:
    """``KEY=VALUE`` items as (key, canonical JSON): VALUE is JSON when it parses, else text."""
    params: dict[str, str] = {}
    for item in raw:
        key, sep, text = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise SettingsError(f"--gsm8k-param: expected KEY=VALUE, got {item!r}")
        if key in OWNED_FIELDS:
            raise SettingsError(
                f"--gsm8k-param {key}: the plugin sets {key!r} itself; {OWNED_FIELDS[key]}"
            )
        if key in params:
            raise SettingsError(f"--gsm8k-param {key}: given twice")
        try:
            value: Any = jsondepth.loads(text)
        except jsondepth.TooDeep as exc:
            raise SettingsError(f"--gsm8k-param {key}: {exc}") from None
        except ValueError:
            value = text
        params[key] = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return tuple(params.items())


def _convert(option: Option, raw: Any) -> Any:
    """Turn a command-line or ini value into the option's type, naming the option on failure."""
    if raw is None:
        return None
    if option.name in OMITTABLE and str(raw).strip().lower() == OMIT:
        return OMIT
    if option.kind == "list":
        if isinstance(raw, str):
            return [raw]
        return [str(x) for x in raw]
    if option.kind == "bool":
        try:
            return convert_bool(raw)
        except ValueError:
            raise SettingsError(f"{option.flag}: expected true or false, got {raw!r}") from None
    if option.kind == "int":
        try:
            return int(str(raw).strip())
        except ValueError:
            raise SettingsError(f"{option.flag}: expected an integer, got {raw!r}") from None
    if option.kind == "float":
        try:
            value = float(str(raw).strip())
        except ValueError:
            raise SettingsError(f"{option.flag}: expected a number, got {raw!r}") from None
        # nan passes every comparison check and inf overflows a socket's timeout
        if not math.isfinite(value):
            raise SettingsError(f"{option.flag}: expected a finite number, got {raw!r}")
        if option.name in SECONDS and value > MAX_SECONDS:
            raise SettingsError(
                f"{option.flag}: must be at most {MAX_SECONDS:g} seconds, got {value:g}"
            )
        return value
    return str(raw)


@dataclass(frozen=True)
class Settings:
    """Validated settings. Pure data: no pytest objects inside."""

    model: str | None
    base_url: str | None
    api_key_env: str
    data: str | None
    dataset: str | None
    #: --gsm8k-dataset-config: main or socratic
    dataset_config: str
    split: str
    limit: int | None
    seed: int
    min_acc: float | None
    protocol: str
    samples: int
    temperature: float | None
    shots: int
    fewshot_file: str | None
    system: str | None
    api: Literal["chat", "completions"]
    stop: tuple[str, ...]
    max_tokens: int | None
    extract: str
    answer_regex: str | None
    report: str | None
    preset: str | None
    concurrency: int
    timeout: float
    max_retries: int
    serve: str | None
    serve_timeout: float
    #: --gsm8k-param: (key, canonical JSON of the value), in the order given
    params: tuple[tuple[str, str], ...]
    cache_dir: str | None
    no_cache: bool
    #: --gsm8k-resume: read earlier runs' answers from the cache (otherwise only written)
    resume: bool = False
    stall_timeout: float = 60.0
    local_threads: int | None = None
    local_ctx: int | None = None
    baseline: str | None = None
    baseline_name: str | None = None
    max_drop: float = 0.0
    #: the noise-aware baseline test's level (core/calibrated.py): 0.01, so that an
    #: unchanged build fails at most 1 run in 100 (the exact test is conservative)
    alpha: float = 0.01
    require_baseline: bool = False
    baseline_partial: bool = False
    html: str | None = None
    #: --gsm8k-max-unparsed / -truncated / -error: the answer-format health gates' rates
    max_unparsed: float | None = None
    max_truncated: float | None = None
    max_error: float | None = None
    #: --gsm8k-markdown: the step summary's Markdown, written to this file as well
    markdown: str | None = None
    early_stop: str | None = None
    early_stop_alpha: float = 0.05
    #: the progress line: True (asked for), False (ini false), None (on a terminal only)
    progress: bool | None = None
    #: --gsm8k-repeats: how many times each problem is asked (separate requests)
    repeats: int = 1
    #: --gsm8k-config: vLLM's GSM8K configs (a YAML, a folder, a models-*.txt list)
    vllm_config: str | None = None
    #: --gsm8k-shard I/N: (I, N), the slice of the selection this run asks (core/merge.py)
    shard: tuple[int, int] | None = None

    @property
    def aggregation(self) -> str:
        """'test', 'pass' or 'maj'."""
        return self.protocol.split("@", 1)[0]

    def api_key(self) -> str | None:
        """The key, from the environment only (never an option: it would land in logs)."""
        return os.environ.get(self.api_key_env) or None

    def resolved_base_url(self) -> str | None:
        return self.base_url or os.environ.get("OPENAI_BASE_URL") or None


def url_problem(url: str) -> str | None:
    """What makes ``url`` unusable as a base URL, or None. Only what would otherwise
    surface as a traceback deep in a request (a port out of range or not a number, a
    malformed IPv6 host); what a server could still answer is left to the first call."""
    try:
        parts = urlsplit(url.strip())
        if parts.port is not None and parts.port < 0:  # pragma: no cover (urllib raises)
            return "negative port"
    except ValueError as exc:
        return str(exc)
    return None


def plain_url(url: str) -> str:
    """``url`` fit to print: without credentials, query or fragment."""
    parts = urlsplit(url.strip())
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def with_v1(base_url: str) -> str | None:
    """``base_url`` (fit to print) with ``/v1`` appended when its path does not end in /v1,
    else None: vLLM, Ollama, SGLang and llama.cpp serve the OpenAI API under /v1, and a
    base URL without it (``http://host:8000``) gets 404 for every request."""
    shown = plain_url(base_url).rstrip("/")
    if not urlsplit(shown).scheme or shown.endswith("/v1"):
        return None
    return shown + "/v1"


PRESET_RULES = ("strict-match", "flexible-extract")
#: options a preset decides beside the values it sets (PresetSpec.settings): its exemplars
#: and its extraction; giving any of them as well would silently change the peer's protocol
PRESET_ALSO_FIXED = ("fewshot_file", "answer_regex")


def _apply_preset(name: str, values: dict[str, Any], given: set[str]) -> None:
    from pytest_gsm8k.core.presets import get_preset

    try:
        spec = get_preset(name)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    api = values["api"] if "api" in given else "completions"
    if api not in spec.apis:
        raise SettingsError(
            f"--gsm8k-preset {name} sends to {' and '.join(spec.apis)} only "
            f"(its peer has no {api} mode); remove --gsm8k-api"
        )
    shots = values["shots"] if "shots" in given and "shots" in spec.adjustable else None
    fixed = spec.settings(api, shots)
    for key in (*fixed, *PRESET_ALSO_FIXED, *spec.also_fixed):
        if key in given and key not in spec.adjustable:
            flag = "--gsm8k-" + key.replace("_", "-")
            raise SettingsError(f"--gsm8k-preset {name} sets {flag} itself; remove {flag}")
    values.update(fixed)
    values["api"] = api
    if name == "vllm":
        from pytest_gsm8k.core.engine_ci import vllm_param_error

        error = vllm_param_error([key for key, _ in parse_params(values["param"] or [])], api)
        if error:
            raise SettingsError(error)


#: what --gsm8k-config meant before it took vLLM's configs: the dataset config
DATASET_CONFIGS = ("main", "socratic")


def _config_option(
    values: dict[str, Any],
    given: set[str],
    exists: Callable[[str], bool],
    warn: Callable[[str], None],
) -> None:
    """``--gsm8k-config main|socratic`` from before ``--gsm8k-dataset-config``: still the
    dataset config (with a note) unless a file or folder of that name exists, which is then
    ambiguous and refused."""
    value = values["config"]
    if value not in DATASET_CONFIGS:
        return
    if exists(value):
        raise SettingsError(
            f"--gsm8k-config {value}: a file or folder named {value!r} exists here; write "
            f"--gsm8k-config ./{value} for vLLM configs or --gsm8k-dataset-config {value} "
            "for the dataset config"
        )
    if "dataset_config" in given and values["dataset_config"] != value:
        raise SettingsError(
            f"--gsm8k-config {value} and --gsm8k-dataset-config {values['dataset_config']} "
            "disagree; give --gsm8k-dataset-config only"
        )
    warn(
        f"--gsm8k-config {value} selects the dataset config: write --gsm8k-dataset-config "
        f"{value} (--gsm8k-config now takes vLLM config files)"
    )
    values["dataset_config"] = value
    values["config"] = None
    given.discard("config")
    given.add("dataset_config")


DEFAULT_BASE_URL = "https://api.openai.com/v1"
"""What the openai client uses when neither --gsm8k-base-url nor $OPENAI_BASE_URL is set
(here, not in runtime/client.py, so the pytest layer names it without importing asyncio and
the client at every pytest start: an installed plugin costs unrelated runs nothing)."""


#: options a vLLM config decides, or that a matrix of configs cannot honour: with
#: --gsm8k-config each is refused in one line saying why
CONFIG_DECIDES = {
    "model": "each config's model_name names its model",
    "base_url": "each config's server is started for it (--gsm8k-serve changes the command)",
    "limit": "each config's num_questions decides (vLLM's first N questions)",
    "seed": "each config's seed decides (vLLM's request seed)",
    "shots": "each config's num_fewshot decides",
    "fewshot_file": "vLLM's configs take their shots from train",
    "api": "each config's use_chat_completions decides",
    "max_tokens": "each config's max_tokens decides",
    "temperature": "each config's temperature decides",
    "stop": "vLLM's stop list is part of its protocol",
    "protocol": "vLLM's configs are test@1",
    "system": "vLLM's script sends no system prompt",
    "extract": "vLLM's scoring rule decides",
    "answer_regex": "vLLM's scoring rule decides",
    "param": "vLLM's request fields are the config's",
    "split": "vLLM's configs run the test split",
    "baseline": "each config's baseline is named by the config and its protocol",
    "baseline_name": "each config's baseline is named by the config and its protocol",
}


def _mode_wins(
    mode: str,
    decides: Mapping[str, str],
    given: set[str],
    values: dict[str, Any],
    from_ini: set[str],
    warn: Callable[[str], None],
) -> None:
    """The one rule for values a mode decides itself (``--gsm8k-config``: each config's
    server, protocol and floor; ``--gsm8k-serve`` and the local model: the server's URL).
    Given on the command line beside the mode, a value is a conflict the user wrote: refused
    in one line. Read from the ini (written once for another recipe), the mode wins and one
    note names the key set aside: the ini README suggests must not break the other recipes."""
    for key, why in decides.items():
        if key not in given:
            continue
        flag = "--gsm8k-" + key.replace("_", "-")
        if key not in from_ini:
            raise SettingsError(f"{flag} cannot be combined with {mode}: {why}")
        warn(f"ini gsm8k_{key} set aside: {mode} runs ({why}); {flag}= clears it")
        given.discard(key)
        values[key] = next(o.default for o in OPTIONS if o.dest == f"gsm8k_{key}")


#: what a server the run starts decides (--gsm8k-serve, the local model)
SERVE_DECIDES = {"base_url": "the run starts the server and asks it at its own URL"}


def _refuse_with_configs(
    given: set[str], values: dict[str, Any], from_ini: set[str], warn: Callable[[str], None]
) -> None:
    # an ini floor would gate every config beside its own accuracy_threshold - tolerance
    ini_only = {"min_acc": "each config's accuracy_threshold - tolerance is its floor"}
    _mode_wins(
        "--gsm8k-config",
        {**CONFIG_DECIDES, **{k: v for k, v in ini_only.items() if k in from_ini}},
        given,
        values,
        from_ini,
        warn,
    )
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
    serve = values["serve"]
    if serve and "{server_args}" not in str(serve):
        # another server (SGLang) takes none of vLLM's flags: said, never dropped unseen
        warn(
            "--gsm8k-serve has no {server_args}: the configs' server_args and the flags "
            "vLLM's test adds are not passed to the server"
        )


#: the most shards a run may be cut into (--gsm8k-shard I/N): GitHub's job matrix allows 256
MAX_SHARDS = 256


def parse_shard(text: str) -> tuple[int, int]:
    """``--gsm8k-shard I/N`` as ``(I, N)``, with ``1 <= I <= N <= MAX_SHARDS``."""
    match = re.fullmatch(r"\s*(\d{1,6})\s*/\s*(\d{1,6})\s*", text)
    if not match:
        raise SettingsError(
            f"--gsm8k-shard: expected I/N (shard I of N, e.g. 2/4), got {text[:40]!r}"
        )
    index, count = int(match.group(1)), int(match.group(2))
    if not 1 <= count <= MAX_SHARDS:
        raise SettingsError(f"--gsm8k-shard {index}/{count}: N must be between 1 and {MAX_SHARDS}")
    if not 1 <= index <= count:
        raise SettingsError(f"--gsm8k-shard {index}/{count}: I must be between 1 and N ({count})")
    return index, count


def build_settings(
    get: Callable[[Option], Any],
    warn: Callable[[str], None],
    exists: Callable[[str], bool] = lambda path: False,
    from_ini: Callable[[Option], bool] = lambda option: False,
) -> Settings:
    """Read every option through ``get`` (command line, then ini) and validate.

    ``warn`` receives non-fatal remarks (e.g. pass@N at temperature 0); ``exists`` says
    whether a path exists (the caller's file system: this module does no I/O); ``from_ini``
    whether an option's value came from the ini file rather than the command line (a mode
    sets an ini value aside, where the same value on the command line is refused). An
    empty value (``--gsm8k-base-url=``) is no value: on the command line it clears the
    ini's.
    """
    values: dict[str, Any] = {}
    given: set[str] = set()
    ini: set[str] = set()
    for option in OPTIONS:
        raw = get(option)
        if isinstance(raw, str) and not raw.strip():
            raw = None
        value = _convert(option, raw)
        key = option.dest[len("gsm8k_") :]
        if value is not None:
            given.add(key)
            if from_ini(option):
                ini.add(key)
        values[key] = option.default if value is None else value
    _config_option(values, given, exists, warn)
    if values["config"]:
        _refuse_with_configs(given, values, ini, warn)
    if values["serve"] or is_local_spec(values["model"]):
        mode = "--gsm8k-serve" if values["serve"] else "--gsm8k-model=local"
        _mode_wins(mode, SERVE_DECIDES, given, values, ini, warn)
    preset = values["preset"]
    if preset is not None:
        _apply_preset(str(preset), values, given)
    elif is_local_spec(values["model"]):
        # A base model does not follow chat instructions: few-shot completions with stops.
        for key, value in LOCAL_DEFAULTS.items():
            if key not in given:
                values[key] = value

    protocol = str(values["protocol"]).strip()
    match = PROTOCOL_RE.match(protocol)
    if not match:
        raise SettingsError(f"--gsm8k-protocol: expected test@1, pass@N or maj@N, got {protocol!r}")
    samples = int(match.group(3)) if match.group(3) is not None else 1
    if samples < 1:
        raise SettingsError(f"--gsm8k-protocol {protocol}: N must be at least 1")
    if samples > MAX_SAMPLES:
        raise SettingsError(f"--gsm8k-protocol {protocol}: N must be at most {MAX_SAMPLES}")
    temperature = values["temperature"]
    if temperature is None:
        temperature = 0.0 if protocol == "test@1" else 0.7
    if temperature == OMIT:
        temperature = None
    elif not 0.0 <= temperature <= 2.0:
        raise SettingsError(f"--gsm8k-temperature: must be between 0 and 2, got {temperature}")
    if values["max_tokens"] == OMIT:
        values["max_tokens"] = None
    params = parse_params(values["param"] or [])
    if protocol != "test@1" and samples > 1 and temperature == 0.0:
        warn(
            f"--gsm8k-protocol {protocol} at --gsm8k-temperature 0: the {samples} samples will "
            "be identical"
        )

    def positive(name: str, *, allow_zero: bool = False) -> None:
        value = values[name.replace("-", "_")]
        if value is None:
            return
        if value < 0 or (value == 0 and not allow_zero):
            raise SettingsError(
                f"--gsm8k-{name}: must be {'>= 0' if allow_zero else '> 0'}, got {value}"
            )

    positive("limit")
    positive("max-tokens")
    positive("concurrency")
    if int(values["concurrency"]) > MAX_CONCURRENCY:
        raise SettingsError(
            f"--gsm8k-concurrency: must be at most {MAX_CONCURRENCY}, got {values['concurrency']}"
        )
    positive("stall-timeout")
    positive("timeout")
    positive("max-retries", allow_zero=True)
    positive("serve-timeout")
    positive("shots", allow_zero=True)
    positive("local-threads")
    positive("local-ctx")
    min_acc = values["min_acc"]
    if min_acc is not None and not 0.0 <= min_acc <= 1.0:
        raise SettingsError(f"--gsm8k-min-acc: must be between 0 and 1, got {min_acc}")
    for name in ("max-unparsed", "max-truncated", "max-error"):
        rate = values[name.replace("-", "_")]
        if rate is not None and not 0.0 <= rate <= 1.0:
            raise SettingsError(f"--gsm8k-{name}: must be between 0 and 1, got {rate}")
    if not 0.0 <= float(values["max_drop"]) <= 1.0:
        raise SettingsError(f"--gsm8k-max-drop: must be between 0 and 1, got {values['max_drop']}")
    alpha = values["alpha"]
    if not MIN_ALPHA <= alpha < 1.0:
        raise SettingsError(
            f"--gsm8k-alpha: must be at least {MIN_ALPHA:g} and below 1, got {alpha} (the "
            "noise-aware test's tail shortcuts are exact only above that)"
        )
    repeats = values["repeats"]
    if not 1 <= repeats <= MAX_REPEATS:
        raise SettingsError(f"--gsm8k-repeats: must be between 1 and {MAX_REPEATS}, got {repeats}")
    if repeats > 1 and protocol != "test@1":
        raise SettingsError(
            f"--gsm8k-repeats {repeats}: repeats measure a single-sample protocol's run-to-run "
            f"noise; --gsm8k-protocol {protocol} samples already (use test@1, or --gsm8k-repeats 1)"
        )
    api = values["api"]
    if api not in ("chat", "completions"):
        raise SettingsError(f"--gsm8k-api: expected chat or completions, got {api!r}")
    extract = values["extract"]
    if extract not in RULES and not (preset and extract in PRESET_RULES):
        raise SettingsError(f"--gsm8k-extract: expected one of {', '.join(RULES)}, got {extract!r}")
    regex = values["answer_regex"]
    if regex is not None:
        try:
            compiled = re.compile(regex)
        except re.error as exc:
            raise SettingsError(
                f"--gsm8k-answer-regex: invalid regular expression ({exc})"
            ) from None
        if compiled.groups < 1:
            raise SettingsError(
                f"--gsm8k-answer-regex {regex!r}: needs a capture group (group 1 is the number)"
            )
    early_stop = values["early_stop"] or None
    if early_stop not in (None, "certain", "sequential"):
        raise SettingsError(
            f"--gsm8k-early-stop: expected certain or sequential, got {early_stop!r}"
        )
    if not 0.0 < float(values["early_stop_alpha"]) < 1.0:
        raise SettingsError(
            f"--gsm8k-early-stop-alpha: must be between 0 and 1 (exclusive), "
            f"got {values['early_stop_alpha']}"
        )
    shard = parse_shard(str(values["shard"])) if values["shard"] else None
    if shard and early_stop:
        raise SettingsError(
            "--gsm8k-shard cannot be combined with --gsm8k-early-stop: a shard cannot "
            "see the other shards' answers (the merge decides on all of them)"
        )
    if values["resume"] and values["no_cache"]:
        raise SettingsError(
            "--gsm8k-resume reads the response cache that --gsm8k-no-cache turns off: give one"
        )
    serve = values["serve"]
    if serve and "{port}" not in str(serve):
        raise SettingsError(
            "--gsm8k-serve: the command line has no {port}: the server must listen on the free "
            "loopback port the run picks, where it is waited for (e.g. 'vllm serve {model} "
            "--port {port}')"
        )
    base_url = values["base_url"]
    if base_url and (problem := url_problem(str(base_url))):
        raise SettingsError(f"--gsm8k-base-url: {problem}")  # the URL may hold a secret
    if not str(values["api_key_env"]).strip():
        raise SettingsError("--gsm8k-api-key-env: must name an environment variable")

    return Settings(
        model=values["model"] or None,
        base_url=values["base_url"] or None,
        api_key_env=str(values["api_key_env"]),
        data=values["data"] or None,
        dataset=values["dataset"] or None,
        dataset_config=str(values["dataset_config"]),
        split=str(values["split"]),
        limit=values["limit"],
        seed=int(values["seed"]),
        min_acc=min_acc,
        protocol=protocol,
        samples=samples,
        temperature=None if temperature is None else float(temperature),
        shots=int(values["shots"]),
        fewshot_file=values["fewshot_file"] or None,
        system=values["system"] or None,
        api=api,
        stop=tuple(values["stop"] or ()),
        max_tokens=None if values["max_tokens"] is None else int(values["max_tokens"]),
        extract=extract,
        answer_regex=regex,
        report=values["report"] or None,
        preset=preset,
        concurrency=int(values["concurrency"]),
        timeout=float(values["timeout"]),
        max_retries=int(values["max_retries"]),
        serve=values["serve"] or None,
        serve_timeout=float(values["serve_timeout"]),
        params=params,
        cache_dir=values["cache_dir"] or None,
        no_cache=bool(values["no_cache"]),
        resume=bool(values["resume"]),
        stall_timeout=float(values["stall_timeout"]),
        local_threads=values["local_threads"],
        local_ctx=values["local_ctx"],
        baseline=values["baseline"] or None,
        baseline_name=values["baseline_name"] or None,
        max_drop=float(values["max_drop"]),
        alpha=float(alpha),
        require_baseline=bool(values["require_baseline"]),
        baseline_partial=bool(values["baseline_partial"]),
        html=values["html"] or None,
        max_unparsed=values["max_unparsed"],
        max_truncated=values["max_truncated"],
        max_error=values["max_error"],
        markdown=values["markdown"] or None,
        early_stop=early_stop,
        early_stop_alpha=float(values["early_stop_alpha"]),
        progress=values["progress"],
        repeats=int(repeats),
        vllm_config=values["config"] or None,
        shard=shard,
    )
