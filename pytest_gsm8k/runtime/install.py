"""The pip command that adds an extra (``local``: the llama.cpp model; ``hub``: a hub
dataset) to pytest-gsm8k where it was installed from: a clone, an archive or a git URL, not
an index, where a bare ``pip install 'pytest-gsm8k[local]'`` would look in vain."""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Mapping
from typing import Any


def install_command(direct_url: Mapping[str, Any] | None, extra: str = "local") -> str:
    """The command for pip's install record (PEP 610 ``direct_url.json``; None: an index):
    the clone's folder (editable when it was), else the archive's or repository's URL."""
    import urllib.request

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
    from importlib import metadata

    for dist in metadata.distributions(name="pytest-gsm8k"):
        with contextlib.suppress(ValueError, OSError):
            if isinstance(data := json.loads(dist.read_text("direct_url.json") or "0"), Mapping):
                return install_command(data, extra)
    return install_command(None, extra)
