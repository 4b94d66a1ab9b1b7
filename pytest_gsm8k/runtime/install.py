"""The pip command that adds one of pytest-gsm8k's extras to the install a user has.

pytest-gsm8k is installed from a clone, a wheel or sdist, or a git URL, not from an index,
so a bare ``pip install 'pytest-gsm8k[local]'`` would look for it where it is not. A missing
extra (``local`` for the llama.cpp model, ``hub`` for a dataset from the Hugging Face hub)
is reported with the command that adds it to the same source.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

DIST_NAME = "pytest-gsm8k"
"""The distribution whose install record (PEP 610 ``direct_url.json``) names its source."""


def install_command(direct_url: Mapping[str, Any] | None, extra: str = "local") -> str:
    """The pip command that adds ``extra`` to pytest-gsm8k as it was installed.

    ``direct_url`` is the install record pip wrote (None: installed from an index, or no
    record), and the command names the same source: the clone's folder (editable when it
    was), the archive's or the repository's URL at the installed commit.
    """
    import urllib.request

    record: Mapping[str, Any] = direct_url or {}
    url = str(record.get("url") or "")
    if not url:
        return "pip install " + shlex.quote(f"{DIST_NAME}[{extra}]")
    dir_info = record.get("dir_info")
    if isinstance(dir_info, Mapping) and url.startswith("file://"):
        folder = urllib.request.url2pathname(url.removeprefix("file://"))
        editable = "-e " if dir_info.get("editable") else ""
        return f"pip install {editable}" + shlex.quote(f"{folder}[{extra}]")
    vcs_info = record.get("vcs_info")
    if isinstance(vcs_info, Mapping):
        revision = vcs_info.get("commit_id") or vcs_info.get("requested_revision")
        url = f"{vcs_info.get('vcs', 'git')}+{url}" + (f"@{revision}" if revision else "")
    return "pip install " + shlex.quote(f"{DIST_NAME}[{extra}] @ {url}")


def install_hint(extra: str = "local") -> str:
    """:func:`install_command` for the installed pytest-gsm8k, from the install record of
    the first of its distributions that has one (a clone's folder on ``sys.path`` also
    shows its ``.egg-info``, which has none)."""
    from importlib import metadata

    for dist in metadata.distributions(name=DIST_NAME):
        try:
            text = dist.read_text("direct_url.json")
            data = json.loads(text) if text else None
        except (ValueError, OSError):
            continue
        if isinstance(data, Mapping):
            return install_command(data, extra)
    return install_command(None, extra)
