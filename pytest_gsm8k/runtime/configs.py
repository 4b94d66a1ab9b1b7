"""``--gsm8k-config PATH``: vLLM's GSM8K configs from a ``.yaml`` file, a folder or a
``models-*.txt`` list, each named by its file's stem. The matrix never shrinks unseen: where
vLLM's conftest skips a missing file, an entry meant as a config and not one is refused."""

from __future__ import annotations

from pathlib import Path

from pytest_gsm8k.core.scrub import printable
from pytest_gsm8k.core.vllm_config import ConfigError, VllmConfig, clip, parse, parse_list

SUFFIXES = (".yaml", ".yml")


def _read(path: Path, shown: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{shown}: cannot read ({exc})") from None


def _one(path: Path) -> VllmConfig:
    # shown everywhere (ids, gate names, outputs): escaped once, here, so that a file name
    # holding a newline or an escape forges no line anywhere
    shown = printable(str(path))
    return parse(_read(path, shown), shown, printable(path.stem))


def _suffix(path: Path) -> bool:
    """Whether ``path`` is named as a config (a suffix in capitals is refused, not skipped)."""
    if path.suffix.lower() not in SUFFIXES:
        return False
    if path.suffix not in SUFFIXES:
        raise ConfigError(
            f"{printable(str(path))}: a config's name must end in .yaml or .yml (lower case)"
        )
    return True


def _folder(folder: Path) -> list[Path]:
    """The folder's configs, in name order; what may be meant as one and is not is refused."""
    files = []
    for entry in sorted(folder.iterdir()):
        if entry.is_symlink() and not entry.exists():
            raise ConfigError(
                f"{printable(str(entry))}: a broken link (to nothing, or a loop): fix or remove it"
            )
        if not _suffix(entry):
            continue
        if not entry.is_file():
            raise ConfigError(f"{printable(str(entry))}: not a file (a config is a .yaml file)")
        files.append(entry)
    return files


def load(path: str) -> tuple[VllmConfig, ...]:
    """The configs ``path`` names, in run order; ConfigError (one line) otherwise."""
    where, configs = Path(path).expanduser(), []
    try:
        if where.is_dir():
            if not (files := _folder(where)):
                raise ConfigError(f"--gsm8k-config {path}: the folder holds no .yaml config")
            configs = [_one(p) for p in files]
        elif not where.is_file():
            raise ConfigError(f"--gsm8k-config {clip(path)}: no such file or folder")
        elif _suffix(where):
            configs = [_one(where)]
        else:
            for number, name in parse_list(_read(where, str(where)), str(where)):
                if not (where.parent / name).is_file():
                    raise ConfigError(f"{where}:{number}: no config file {clip(name)}")
                configs.append(_one(where.parent / name))
    except OSError as exc:  # a name too long, a folder that cannot be listed
        raise ConfigError(f"--gsm8k-config {clip(path)}: cannot read ({exc.strerror})") from None
    seen: dict[str, VllmConfig] = {}
    for config in configs:
        if (other := seen.setdefault(config.name, config)) is not config:
            raise ConfigError(
                f"--gsm8k-config {path}: two configs are named {config.name!r} "
                f"({other.source} and {config.source})"
            )
    return tuple(configs)
