"""``--gsm8k-config PATH``: vLLM's GSM8K configs read from a file, a folder or a list file.

* a ``.yaml``/``.yml`` file: one config;
* a folder: every ``.yaml``/``.yml`` file in it (not below it), in name order;
* a ``.txt`` list file (vLLM's ``configs/models-*.txt``): the configs it names, one per
  line, relative to the list file's folder, in its order. vLLM's conftest skips a name
  whose file is missing with a printed line; here it is an error naming the line, so a
  matrix never shrinks unseen.

Each config is named by its file's stem, as vLLM's own item ids are, fit for one line
(``core.scrub.printable``); two configs with the same name are refused.
"""

from __future__ import annotations

from pathlib import Path

from pytest_gsm8k.core.scrub import printable
from pytest_gsm8k.core.vllm_config import ConfigError, VllmConfig, parse, parse_list

SUFFIXES = (".yaml", ".yml")


def _read(path: Path, shown: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{shown}: cannot read ({exc})") from None


def _one(path: Path) -> VllmConfig:
    # the name and the path are shown everywhere (ids, gate names, every output): escaped once,
    # here, so a file name holding a newline or an escape forges no line anywhere
    shown = printable(str(path))
    return parse(_read(path, shown), shown, printable(path.stem))


def load(path: str) -> tuple[VllmConfig, ...]:
    """The configs ``path`` names, in run order; ConfigError (one line) otherwise."""
    where = Path(path).expanduser()
    if where.is_dir():
        files = sorted(p for p in where.iterdir() if p.suffix in SUFFIXES and p.is_file())
        if not files:
            raise ConfigError(f"--gsm8k-config {path}: the folder holds no .yaml config")
        configs = [_one(p) for p in files]
    elif where.is_file() and where.suffix in SUFFIXES:
        configs = [_one(where)]
    elif where.is_file():
        text = _read(where, str(where))
        configs = []
        for number, name in parse_list(text, str(where)):
            target = where.parent / name
            if not target.is_file():
                raise ConfigError(f"{where}:{number}: no config file {target}")
            configs.append(_one(target))
    else:
        raise ConfigError(f"--gsm8k-config {path}: no such file or folder")
    seen: dict[str, str] = {}
    for config in configs:
        if config.name in seen:
            raise ConfigError(
                f"--gsm8k-config {path}: two configs are named {config.name!r} "
                f"({seen[config.name]} and {config.source})"
            )
        seen[config.name] = config.source
    return tuple(configs)
