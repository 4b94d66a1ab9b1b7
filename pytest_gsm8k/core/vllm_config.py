"""vLLM's GSM8K CI configs, parsed as its ``test_gsm8k_correctness.py`` reads them (defaults
as of commit 05d96d79 and the version with ``min_acceptance_length``), so a config gates exactly
as there. Pure. Refused in one line: unknown fields, keys given twice, anchors and aliases."""

from __future__ import annotations

import math
import shlex
from collections.abc import Hashable
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

import yaml

from pytest_gsm8k.core import scrub
from pytest_gsm8k.core.settings import WAIT, out_of_range

#: what vLLM's test adds to every config's ``server_args``, then its RemoteOpenAIServer's seed
TEST_FLAGS = ("--trust-remote-code", "--disable-uvicorn-access-log", "--seed", "0")
#: found in vLLM's configs, never read by its test (so neither here)
IGNORED = ("max_model_len",)
#: fields a run here cannot honour: refused with the reason
UNSUPPORTED = {
    "min_acceptance_length": "the speculative-decoding acceptance check reads vLLM's "
    "/metrics counters, which this plugin does not gate; run this config with vLLM's own test",
}


class ConfigError(Exception):
    """A config that cannot be run as vLLM's test would run it: one line, naming the file."""


def _field(default: Any, kind: tuple[type, str] | None = None, /, **bounds: float) -> Any:
    """A field read from the file: a number (an integer if its type says so) in ``bounds``
    (settings.out_of_range's), or else of ``kind`` (a type, and it in words); ``default``
    MISSING: required."""
    return field(default=default, metadata={"kind": kind, "bounds": bounds})


@dataclass(frozen=True)
class VllmConfig:
    """One config, with vLLM's test's defaults filled in; each field read from the file is
    declared here once, with its type and range."""

    name: str  # the file's stem: the group's name in item ids, headlines and reports
    source: str  # the file as shown in messages
    model_name: str
    accuracy_threshold: float = _field(MISSING, ge=0, le=1)
    num_questions: int = _field(MISSING, ge=1)
    num_fewshot: int = _field(MISSING, ge=0)
    tolerance: float = _field(0.08, ge=0, le=1)
    startup_max_wait_seconds: float = _field(1200.0, **WAIT)
    request_timeout_seconds: float = _field(600.0, **WAIT)
    rocm_request_timeout_seconds: float = _field(600.0, **WAIT)  # checked, never used here
    max_tokens: int = _field(256, ge=1)
    temperature: float | None = _field(0.0, ge=0, le=2)  # None (so nullable): left to the server
    seed: int | None = _field(42, ge=0)
    max_concurrency: int | None = _field(None, ge=1)
    server_args: tuple[str, ...] = _field((), (str, "a string"))  # split as vLLM's test (shlex)
    env: tuple[tuple[str, str], ...] = _field((), (dict, "a mapping of variables"))
    gen_prefix: str = _field("", (str, "a string"))
    use_chat_completions: bool = _field(False, (bool, "true or false"))
    given: tuple[str, ...] = ()  # the fields given, in file order (the report)

    def serve_args(self) -> tuple[str, ...]:
        return (*self.server_args, *TEST_FLAGS)

    def secrets(self) -> list[str]:
        return scrub.secret_args(self.server_args)[1] + scrub.secret_env(self.env)

    def serve_env(self) -> dict[str, str]:
        """The server's environment on top of the run's, as vLLM's test builds it."""
        env = {"VLLM_WORKER_MULTIPROC_METHOD": "spawn", **dict(self.env)}
        return {**env, "VLLM_ENGINE_READY_TIMEOUT_S": str(int(self.startup_max_wait_seconds))}


_FIELDS = {f.name: f for f in fields(VllmConfig) if f.metadata}
REQUIRED = ("model_name", *(n for n, f in _FIELDS.items() if f.default is MISSING))
KNOWN = ("model_name", *_FIELDS, *UNSUPPORTED)


def _shown(value: Any) -> str:
    """A user's value in an error: its repr, secret-named assignments hidden, cut to a
    readable length; a list or mapping by its kind only (a key inside is no assignment)."""
    if isinstance(value, list | dict | set):
        return "a mapping" if isinstance(value, dict) else f"a {type(value).__name__}"
    return scrub.clip(scrub.redact_options(repr(value)[:200]), 60)  # a bounded text to search


def clip(key: object) -> str:
    """A name (a key, a file) as messages show it: unquoted, escapes shown, cut short in its
    middle (a path's end is the file's name: what is wrong)."""
    shown = repr(str(key))[1:-1]
    return shown if len(shown) <= 60 else f"{shown[:28]}...{shown[-29:]}"


class _Loader(yaml.SafeLoader):
    """``safe_load`` that refuses anchors and aliases (before anything expands) and a key
    given twice in one mapping (which ``safe_load`` resolves silently: the later wins)."""

    source = ""

    def _refuse(self, mark: yaml.Mark, why: str) -> ConfigError:
        return ConfigError(f"{self.source}:{mark.line + 1}: {why}")

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            why = "anchors and aliases are not supported (vLLM's configs use none)"
            raise self._refuse(event.start_mark, why + ": write the value out")
        return super().compose_node(parent, index)

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, Hashable):
                continue  # safe_load's own check refuses it
            if key in first:
                why = f"{clip(key)}: given twice (first on line {first[key]})"
                raise self._refuse(key_node.start_mark, why)
            first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


def _load(text: str, source: str) -> tuple[Any, dict[str, yaml.Node]]:
    """The document in ``text`` and its top-level keys' value nodes (for lines in errors)."""
    loader = _Loader(text)
    loader.source = source
    try:
        root = loader.get_single_node()
        data = None if root is None else loader.construct_document(root)
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: an integer Python cannot convert
        mark = getattr(exc, "problem_mark", None)
        at = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}{at}: not valid YAML ({problem[:200]})") from None
    except RecursionError:  # lists or mappings nested thousands deep: no config is
        raise ConfigError(f"{source}: nested too deeply (vLLM's configs are flat)") from None
    finally:
        loader.dispose()
    keys = root.value if isinstance(root, yaml.MappingNode) else []
    return data, {str(k.value): v for k, v in keys if isinstance(k, yaml.ScalarNode)}


def _bounded(raw: Any, where: str, f: Field[Any]) -> Any:
    integer = str(f.type).startswith("int")
    fits = isinstance(raw, int) or (not integer and isinstance(raw, float) and math.isfinite(raw))
    if isinstance(raw, bool) or not fits:
        raise ConfigError(
            f"{where}: expected {'an integer' if integer else 'a number'}, got {_shown(raw)}"
        )
    if problem := out_of_range(raw, **f.metadata["bounds"]):
        raise ConfigError(f"{where}: {problem}, got {_shown(raw)}")
    return raw if integer else float(raw)


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
        if not isinstance(key, str) or key not in (*KNOWN, *IGNORED):
            raise ConfigError(
                f"{where(str(key))}: unknown field (vLLM's test reads {', '.join(KNOWN)})"
            )
        if key in UNSUPPORTED:
            raise ConfigError(f"{where(key)}: not supported: {UNSUPPORTED[key]}")
    for key in REQUIRED:
        if key not in data:
            raise ConfigError(f"{source}: {key}: missing (vLLM's test requires it)")
    model = data["model_name"]
    # shown on every line that names the config's model, and passed to the server
    if not isinstance(model, str) or not model.strip() or len(model) > 1000 or "\x00" in model:
        raise ConfigError(
            f"{where('model_name')}: expected a model id (at most 1000 characters, no NUL), "
            f"got {_shown(model)}"
        )
    values: dict[str, Any] = {"model_name": model.strip()}
    for key, f in _FIELDS.items():
        raw = data.get(key)
        if f.metadata["kind"] is None and key in data:
            nulled = raw is None and str(f.type).endswith("None")
            values[key] = None if nulled else _bounded(raw, where(key), f)
        elif f.metadata["kind"] and (raw is not None or (f.type == "bool" and key in data)):
            kind, what = f.metadata["kind"]
            if not isinstance(raw, kind):
                raise ConfigError(f"{where(key)}: expected {what}, got {_shown(raw)}")
            values[key] = raw
    if "server_args" in values:
        try:
            values["server_args"] = args = tuple(shlex.split(values["server_args"]))
        except ValueError as exc:
            raise ConfigError(f"{where('server_args')}: cannot split ({exc})") from None
        if flag := next((f for f in ("--port", "-p") if f in args), None):
            raise ConfigError(
                f"{where('server_args')}: {flag} is chosen by the run (a free port), "
                "as vLLM's test refuses it too"
            )
    for key, value in values.get("env", {}).items():
        if not isinstance(key, str) or not key or "=" in key:
            raise ConfigError(f"{where('env')}: {_shown(key)} is not a variable name")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise ConfigError(
                f"{where('env')}.{clip(key)}: expected a string (quote it), got {_shown(value)}"
            )
    values["env"] = tuple((key, str(value)) for key, value in values.get("env", {}).items())
    return VllmConfig(name=name, source=source, given=tuple(data), **values)


def parse_list(text: str, source: str) -> list[tuple[int, str]]:
    """The config names of a ``models-*.txt`` with their lines, as vLLM's conftest reads it."""
    lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), start=1)]
    out = [(number, line) for number, line in lines if line and not line.startswith("#")]
    if not out:
        raise ConfigError(f"{source}: names no config file")
    return out
