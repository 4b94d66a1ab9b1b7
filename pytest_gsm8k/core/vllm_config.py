"""vLLM's GSM8K CI configs (``tests/evals/gsm8k/configs/*.yaml``): parsed and checked. Pure.

Every field vLLM's ``tests/evals/gsm8k/test_gsm8k_correctness.py`` reads is known here with
its default there (``tolerance`` as of commit 05d96d7991cd3540989fa6038c7704bb54e1d310; the
request fields, ``VLLM_ENGINE_READY_TIMEOUT_S`` and the 1200 s startup default in the version
that reads ``min_acceptance_length``), so a config gates exactly as there: accuracy over the
first ``num_questions`` test problems ``>= accuracy_threshold - tolerance``. Refused, in one
line naming file, line and field: an unknown field (a newer vLLM may give it a meaning), one
a run here cannot honour, a key given twice (YAML keeps the later silently), and anchors or
aliases (a few hundred bytes of them expand to gigabytes).
"""

from __future__ import annotations

import math
import reprlib
import shlex
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import yaml

from pytest_gsm8k.core.scrub import secret_args, secret_env

#: what vLLM's test adds to every config's ``server_args``
TEST_FLAGS = ("--trust-remote-code", "--disable-uvicorn-access-log")
#: what vLLM's RemoteOpenAIServer (tests/utils.py) adds after them: the seed (its default)
SERVER_SEED_FLAGS = ("--seed", "0")
#: environment vLLM's RemoteOpenAIServer sets before the config's ``env``
SERVER_ENV = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
#: set by the test after the config's ``env``, from ``startup_max_wait_seconds``
READY_TIMEOUT_ENV = "VLLM_ENGINE_READY_TIMEOUT_S"
DEFAULT_TOLERANCE = 0.08
DEFAULT_STARTUP_MAX_WAIT_SECONDS = 1200.0
DEFAULT_REQUEST_TIMEOUT_SECONDS = 600.0
DEFAULT_MAX_TOKENS = 256
DEFAULT_SEED = 42

REQUIRED = ("model_name", "accuracy_threshold", "num_questions", "num_fewshot")
#: fields vLLM's test reads, beside the required ones
OPTIONAL = (
    "tolerance",
    "server_args",
    "env",
    "startup_max_wait_seconds",
    "request_timeout_seconds",
    "rocm_request_timeout_seconds",
    "max_tokens",
    "use_chat_completions",
    "temperature",
    "seed",
    "gen_prefix",
    "max_concurrency",
    "min_acceptance_length",
)
#: fields found in vLLM's configs that its test never reads (so neither does a run here)
IGNORED = ("max_model_len",)
#: fields a run here cannot honour: refused with the reason
UNSUPPORTED = {
    "min_acceptance_length": "the speculative-decoding acceptance check reads vLLM's "
    "/metrics counters, which this plugin does not gate; run this config with vLLM's own test",
}


class ConfigError(Exception):
    """A config that cannot be run as vLLM's test would run it: one line, naming the file."""


@dataclass(frozen=True)
class VllmConfig:
    """One config, with vLLM's test's defaults filled in."""

    #: the file's stem: the group's name in item ids, headlines and reports
    name: str
    #: the file as shown in messages
    source: str
    model_name: str
    accuracy_threshold: float
    num_questions: int
    num_fewshot: int
    tolerance: float = DEFAULT_TOLERANCE
    #: ``server_args`` split as vLLM's test splits it (shlex)
    server_args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    startup_max_wait_seconds: float = DEFAULT_STARTUP_MAX_WAIT_SECONDS
    request_timeout_seconds: float = DEFAULT_REQUEST_TIMEOUT_SECONDS
    max_tokens: int = DEFAULT_MAX_TOKENS
    use_chat_completions: bool = False
    #: None: left out of the request (the server's default), as vLLM's script does
    temperature: float | None = 0.0
    seed: int | None = DEFAULT_SEED
    gen_prefix: str = ""
    max_concurrency: int | None = None
    #: the fields given, in file order (for the report)
    given: tuple[str, ...] = field(default=())

    @property
    def floor(self) -> float:
        """The accuracy the gate needs, computed as vLLM's test computes it."""
        return self.accuracy_threshold - self.tolerance

    def serve_args(self) -> tuple[str, ...]:
        """``server_args`` plus the flags vLLM's test and its server wrapper add."""
        return (*self.server_args, *TEST_FLAGS, *SERVER_SEED_FLAGS)

    def secrets(self) -> list[str]:
        """What the server is given that is a secret (an ``--api-key``'s value, an ``env``
        token): the run scrubs it from everything it shows and stores."""
        return secret_args(self.server_args)[1] + secret_env(self.env)

    def serve_env(self) -> dict[str, str]:
        """The server's environment on top of the run's: as vLLM's test builds it."""
        env = dict(SERVER_ENV)
        env.update(dict(self.env))
        env[READY_TIMEOUT_ENV] = str(int(self.startup_max_wait_seconds))
        return env


#: a user's value in an error: its repr, cut to a readable length
_SHOW = reprlib.Repr()
_SHOW.maxstring = _SHOW.maxother = 60


def _shown(value: Any) -> str:
    return _SHOW.repr(value)


def clip(key: object) -> str:
    """A name (a key, a file) as messages show it: unquoted, escapes shown, cut short."""
    return _SHOW.repr(str(key))[1:-1]


class _Refused(Exception):
    """What YAML allows and a config may not use, at ``mark``."""

    def __init__(self, mark: yaml.Mark, message: str) -> None:
        super().__init__(message)
        self.line = mark.line + 1


class _Loader(yaml.SafeLoader):
    """``safe_load`` that refuses anchors and aliases (before anything expands) and a key
    given twice in one mapping (which ``safe_load`` resolves silently: the later wins)."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise _Refused(
                event.start_mark,
                "anchors and aliases are not supported (vLLM's configs use none): "
                "write the value out",
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # safe_load's own check refuses it
            if key in first:
                raise _Refused(
                    key_node.start_mark, f"{clip(key)}: given twice (first on line {first[key]})"
                )
            first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _load(text: str, source: str) -> tuple[Any, dict[str, yaml.Node]]:
    """The document in ``text`` and its top-level keys' value nodes (for lines in errors)."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        data = None if root is None else loader.construct_document(root)
    except _Refused as exc:
        raise ConfigError(f"{source}:{exc.line}: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}{at}: not valid YAML ({problem[:200]})") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise ConfigError(f"{source}: not valid YAML ({str(exc)[:200]})") from None
    except RecursionError:  # lists or mappings nested thousands deep: no config is
        raise ConfigError(f"{source}: nested too deeply (vLLM's configs are flat)") from None
    finally:
        loader.dispose()
    if not isinstance(root, yaml.MappingNode):
        return data, {}
    return data, {str(k.value): v for k, v in root.value if isinstance(k, yaml.ScalarNode)}


#: the numeric fields: (an integer, lowest, highest, the lowest excluded); None is allowed
#: (left to the server, as vLLM's script leaves it) where ``_NULLABLE`` says so
_BOUNDS: dict[str, tuple[bool, float, float | None, bool]] = {
    "accuracy_threshold": (False, 0, 1, False),
    "num_questions": (True, 1, None, False),
    "num_fewshot": (True, 0, None, False),
    "tolerance": (False, 0, 1, False),
    "startup_max_wait_seconds": (False, 0, 1e6, True),
    "request_timeout_seconds": (False, 0, 1e6, True),
    "rocm_request_timeout_seconds": (False, 0, 1e6, True),  # checked, never used here
    "max_tokens": (True, 1, None, False),
    "temperature": (False, 0, 2, False),
    "seed": (True, 0, None, False),
    "max_concurrency": (True, 1, None, False),
}
_NULLABLE = ("temperature", "seed", "max_concurrency")


def _bounded(
    raw: Any, where: str, integer: bool, low: float, high: float | None, open_low: bool
) -> Any:
    """``raw`` as the field's number, in its range; ConfigError naming it otherwise."""
    fits = isinstance(raw, int) or (not integer and isinstance(raw, float) and math.isfinite(raw))
    if isinstance(raw, bool) or not fits:
        raise ConfigError(
            f"{where}: expected {'an integer' if integer else 'a number'}, got {_shown(raw)}"
        )
    if raw < low or (open_low and raw == low) or (high is not None and raw > high):
        bound = f"{'>' if open_low else '>='} {low:g}" + (f" and <= {high:g}" if high else "")
        raise ConfigError(f"{where}: must be {bound}, got {_shown(raw)}")
    return raw if integer else float(raw)


#: the longest model id a config may name (Hugging Face's repo ids are at most 96 characters;
#: a local path may be longer)
MAX_MODEL_NAME = 1000


def parse(text: str, source: str, name: str) -> VllmConfig:
    """The config in ``text`` (the file ``source``, named ``name`` in ids); ConfigError else."""
    data, nodes = _load(text, source)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: expected a mapping of vLLM's config fields (model_name, "
            f"accuracy_threshold, ...), got {type(data).__name__}"
        )

    def where(key: str) -> str:
        node = nodes.get(key)
        line = f":{node.start_mark.line + 1}" if node is not None else ""
        return f"{source}{line}: {clip(key)}"

    for key in data:
        if not isinstance(key, str) or key not in (*REQUIRED, *OPTIONAL, *IGNORED):
            raise ConfigError(
                f"{where(str(key))}: unknown field (vLLM's test reads "
                f"{', '.join((*REQUIRED, *OPTIONAL))})"
            )
        if key in UNSUPPORTED:
            raise ConfigError(f"{where(key)}: not supported: {UNSUPPORTED[key]}")
    for key in REQUIRED:
        if key not in data:
            raise ConfigError(f"{source}: {key}: missing (vLLM's test requires it)")

    model = data["model_name"]
    if not isinstance(model, str) or not model.strip():
        raise ConfigError(f"{where('model_name')}: expected a model id, got {_shown(model)}")
    if len(model) > MAX_MODEL_NAME or "\x00" in model:
        # shown on every line that names the config's model, and passed to the server
        raise ConfigError(
            f"{where('model_name')}: expected a model id (at most {MAX_MODEL_NAME} characters, "
            f"no NUL), got {_shown(model)}"
        )
    values: dict[str, Any] = {"model_name": model.strip()}
    for key, bounds in _BOUNDS.items():
        if key in data:
            raw = data[key]
            nulled = raw is None and key in _NULLABLE
            values[key] = None if nulled else _bounded(raw, where(key), *bounds)
    values.pop("rocm_request_timeout_seconds", None)
    if data.get("server_args") is not None:
        raw = data["server_args"]
        if not isinstance(raw, str):
            raise ConfigError(f"{where('server_args')}: expected a string, got {_shown(raw)}")
        try:
            values["server_args"] = tuple(shlex.split(raw))
        except ValueError as exc:
            raise ConfigError(f"{where('server_args')}: cannot split ({exc})") from None
        for flag in ("--port", "-p"):
            if flag in values["server_args"]:
                raise ConfigError(
                    f"{where('server_args')}: {flag} is chosen by the run (a free port), "
                    "as vLLM's test refuses it too"
                )
    if data.get("env") is not None:
        env = data["env"]
        if not isinstance(env, dict):
            raise ConfigError(f"{where('env')}: expected a mapping of variables, got {_shown(env)}")
        pairs: list[tuple[str, str]] = []
        for key, value in env.items():
            if not isinstance(key, str) or not key or "=" in key:
                raise ConfigError(f"{where('env')}: {_shown(key)} is not a variable name")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                raise ConfigError(
                    f"{where('env')}.{clip(key)}: expected a string (quote it), got {_shown(value)}"
                )
            pairs.append((key, str(value)))
        values["env"] = tuple(pairs)
    if "use_chat_completions" in data:
        chat = data["use_chat_completions"]
        if not isinstance(chat, bool):
            raise ConfigError(
                f"{where('use_chat_completions')}: expected true or false, got {_shown(chat)}"
            )
        values["use_chat_completions"] = chat
    if data.get("gen_prefix") not in (None, ""):
        prefix = data["gen_prefix"]
        if not isinstance(prefix, str):
            raise ConfigError(f"{where('gen_prefix')}: expected a string, got {_shown(prefix)}")
        values["gen_prefix"] = prefix
    return VllmConfig(name=name, source=source, given=tuple(data), **values)


def parse_list(text: str, source: str) -> list[tuple[int, str]]:
    """The config file names of a vLLM list file (``configs/models-*.txt``), with their line
    numbers: one per line, blank lines and ``#`` comments skipped, as vLLM's conftest reads it."""
    out: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            out.append((number, line))
    if not out:
        raise ConfigError(f"{source}: names no config file")
    return out
