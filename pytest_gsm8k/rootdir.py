"""The rootdir and ini file as pytest finds them from the test paths alone, never from the
value of a gsm8k option written with a space.

pytest reads the command line twice. The first reading, before any installed plugin is
loaded, decides the rootdir and the ini file (``Config.parse`` ->
``findpaths.determine_setup``); the plugin's options are unknown then, so in
``--gsm8k-report /abs/r.json`` the value is read as a positional argument, and once the
file exists (the second run) ``/abs`` is a rootdir candidate: the rootdir moves to ``/abs``
or an ancestor, the project's ini file (testpaths, markers, ``gsm8k_*`` keys) is not read,
its conftests fall outside the confcutdir and the baseline under the rootdir is not found.
``--gsm8k-report=/abs/r.json`` is one token and never a candidate (pytest-dev/pytest#8846).

:func:`settle` runs as the first ``pytest_load_initial_conftests``, once the options are
known and before anything has used the rootdir (conftests, testpaths, the cache, the
plan): it decides the setup again with pytest's own function from the real test paths
and, where that differs, installs it as pytest would have: rootdir, ini file, the ini's
``addopts``, ``pythonpath`` and the confcutdir. pytest has no public way to do this; the
attributes set are those ``Config.parse`` sets.
"""

from __future__ import annotations

import copy
import inspect
import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_gsm8k.core.settings import OPTIONS

#: the options that take a value (a bool option is a flag alone)
VALUED = frozenset(o.flag for o in OPTIONS if o.kind != "bool")


def spaced_values(args: list[str]) -> list[str]:
    """The values of gsm8k options written as a separate argument (``--gsm8k-data PATH``)."""
    return [value for flag, value in itertools.pairwise(args) if flag in VALUED]


def settle(config: pytest.Config, parser: pytest.Parser, args: list[str]) -> None:
    """Give the run the rootdir and ini file its test paths alone give (see the module).

    ``args`` is the list pytest parses next (``addopts`` first); it is changed in place
    when the ini file changes, so the new file's ``addopts`` apply and the old one's not.
    """
    from _pytest.config.findpaths import determine_setup

    if not spaced_values(args):
        return
    old_addopts = [str(a) for a in config.getini("addopts")]
    given = list(args)
    if old_addopts and given[: len(old_addopts)] == old_addopts:
        given = given[len(old_addopts) :]
    namespace = parser.parse_known_args(given, namespace=copy.copy(config.option))
    kwargs: dict[str, Any] = {
        "inifile": namespace.inifilename,
        "args": list(namespace.file_or_dir),
        "rootdir_cmd_arg": namespace.rootdir or None,
        "invocation_dir": config.invocation_params.dir,
    }
    if "override_ini" in inspect.signature(determine_setup).parameters:
        kwargs["override_ini"] = namespace.override_ini
    found = determine_setup(**kwargs)
    rootpath, inipath, inicfg = found[0], found[1], found[2]
    if (rootpath, inipath) == (config.rootpath, config.inipath):
        return
    for path in config.getini("pythonpath"):  # the wrong file's, put on sys.path already
        if str(path) in sys.path:
            sys.path.remove(str(path))
    config._rootpath = rootpath
    config._inipath = inipath
    if hasattr(config, "_inicfg"):  # pytest 9
        config._inicfg = inicfg
        config._ignored_config_files = found[3] if len(found) > 3 else []
    else:  # pytest 8 keeps it public (and untyped for pytest 9's stubs)
        setattr(config, "inicfg", inicfg)  # noqa: B010
    config._inicache.clear()
    parser.extra_info["rootdir"] = str(rootpath)
    parser.extra_info["inifile"] = str(inipath)
    addopts = [str(a) for a in config.getini("addopts")]
    args[:] = addopts + given
    if addopts:
        config.pluginmanager.consider_preparse(addopts, exclude_only=False)
    config.known_args_namespace = parser.parse_known_args(args, namespace=copy.copy(config.option))
    if addopts and hasattr(config, "_inicfg"):  # pytest 9: -o in addopts, as parse applies it
        from _pytest.config.findpaths import parse_override_ini

        config._inicfg.update(parse_override_ini(config.known_args_namespace.override_ini))
        config._inicache.clear()
    if config.known_args_namespace.confcutdir is None:
        config.known_args_namespace.confcutdir = str(
            inipath.parent if inipath is not None else rootpath
        )
    for path in reversed(config.getini("pythonpath")):
        sys.path.insert(0, str(Path(path)))
