"""pytest's entry point: the options, the role plugin each process needs (roles.py), the
GSM8K items' parametrization. pytest imports it in every session of every repository the
plugin is installed in: at module level only the option table and the fixtures' definitions
(issue 34; tests/plugin/test_inert.py pins the modules)."""

from __future__ import annotations

import atexit
import gc
import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_gsm8k import ROLE_NAME
from pytest_gsm8k.core.settings import OPTIONS, Option, SettingsError, build_settings
from pytest_gsm8k.fixtures import gsm8k_model, gsm8k_outcome, gsm8k_problem, gsm8k_protocol  # noqa: F401 (registered from here)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gsm8k", "GSM8K evaluation (pytest-gsm8k)")
    for o in OPTIONS:
        shown = (
            f" (default {o.default})" if o.kind != "bool" and o.default not in (None, "") else ""
        )
        how: dict[str, Any] = {"metavar": o.metavar or o.name.upper()}
        if o.kind == "bool":
            how = {"action": "store_true"}
        elif o.kind == "list":
            how = {"action": "append", "metavar": o.metavar}
        group.addoption(o.flag, default=None, dest=o.dest, help=o.help + shown, **how)
        # a bool's ini value is a string converted by settings: pytest's own "bool" type
        # fails with a message that does not name the option (pytest 9.2: a bare UsageError)
        ini: dict[str, Any] = {"type": "linelist"} if o.kind == "list" else {}
        parser.addini(o.dest, o.help, default=None, **ini)


def _spaced_paths(config: pytest.Config) -> Iterator[str]:
    """Before it knows our options pytest picks its rootdir from them (pytest-dev/pytest#8846)."""
    at, valued = config.invocation_params, {o.flag for o in OPTIONS if o.kind != "bool"}
    pairs = itertools.pairwise(str(a) for a in at.args)
    if flags := [f for f, v in pairs if f in valued and os.path.exists(at.dir / v)]:
        why = f"pytest took the value for a test path to the rootdir ({config.rootpath}) and ini"
        yield f"{', '.join(flags)} written with a space: {why}; write {flags[0]}=PATH"


def _read_option(config: pytest.Config, option: Option) -> Any:
    if (value := config.getoption(option.dest)) is not None:
        return value
    ini = config.getini(option.dest)
    return None if ini in (None, "", []) else ini


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gsm8k: a GSM8K problem item (-m gsm8k: only the gate)")
    if config.pluginmanager.hasplugin("syrupy"):
        # syrupy scans each test file's __snapshots__ folder and deletes (--snapshot-update)
        # or reports as unused every file no snapshot reads: the baselines are the gate's,
        # kept out of its discovery by its own --snapshot-ignore-file-extensions
        ignored = config.option.ignore_file_extensions or []
        if "gsm8k" not in ignored:
            config.option.ignore_file_extensions = [*ignored, "gsm8k"]
    notes: list[str] = []
    try:
        settings = build_settings(
            lambda o: _read_option(config, o),
            notes.append,
            lambda path: (config.invocation_params.dir / Path(path).expanduser()).exists(),
            lambda o: config.getoption(o.dest) is None,  # not on the command line: the ini's
        )
    except SettingsError as exc:
        raise pytest.UsageError(f"gsm8k: {exc}") from None
    from pytest_gsm8k.roles import role_for

    role = role_for(config, settings)
    if not hasattr(config, "workerinput"):  # once, not once per xdist worker
        for note in [*notes, *_spaced_paths(config)]:
            config.issue_config_time_warning(pytest.PytestWarning(f"gsm8k: {note}"), stacklevel=2)
        # after the unraisableexception plugin's cleanup and its gc passes; an xdist worker ends
        # right after, its objects frozen (Role.pytest_runtestloop_freeze), sparing a collection
        config.add_cleanup(lambda: _unfreeze_until_exit(role.active))
    # The session now when the session start has work for it or a gsm8k option is on the
    # command line; ini values alone (README's "In your repository") wait for a GSM8K item.
    given = any(config.getoption(option.dest) is not None for option in OPTIONS)
    if given or settings.asked or settings.report or settings.html or settings.markdown:
        role.session  # noqa: B018 - made here, on purpose
    config.pluginmanager.register(role, ROLE_NAME)


def _unfreeze_until_exit(active: bool) -> None:
    """What an active role froze back to the collector (pytest may run again here), frozen again
    at exit: CPython's full collections there cost a visible part of a run's wall time."""
    if active:
        atexit.unregister(gc.freeze)  # registered once
        atexit.register(gc.freeze)
    gc.unfreeze()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gsm8k_problem" not in metafunc.fixturenames:
        return
    from pytest_gsm8k.core.dataset import DatasetError
    from pytest_gsm8k.session import get_session

    state = get_session(metafunc.config)
    try:
        problems = state.plan.run_order
    except DatasetError as exc:
        if state.is_worker:  # a usage error would crash the controller: one line per module
            raise pytest.Collector.CollectError(f"gsm8k: {exc}") from None
        # raised here it would be a collection error with a traceback: one line after collection
        state.run.fail_data(f"gsm8k: {exc}")
        return
    # every GSM8K item is marked: ``-m gsm8k`` selects the gate, ``-m "not gsm8k"`` the rest
    metafunc.parametrize(
        "gsm8k_problem", [pytest.param(p, id=p.id, marks=pytest.mark.gsm8k) for p in problems]
    )
