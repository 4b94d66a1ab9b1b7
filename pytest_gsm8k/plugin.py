"""pytest's entry point: the options, the role plugin each process needs (roles.py), the
GSM8K items' parametrization. The work is done by the session object (session.py), the pure
core and the runtime; fixtures live in fixtures.py.
"""

from __future__ import annotations

import atexit
import gc
import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_gsm8k import ROLE_NAME
from pytest_gsm8k.core.settings import (
    OPTIONS,
    Option,
    SettingsError,
    build_settings,
    convert_bool,
)
from pytest_gsm8k.fixtures import (  # noqa: F401 - registered with pytest from here
    GSM8KOutcome,
    gsm8k_model,
    gsm8k_outcome,
    gsm8k_problem,
    gsm8k_protocol,
)

# pytest imports this module in every session of every repository the plugin is installed
# in: at module level only pytest, the option table and the fixtures' definitions. The rest
# is imported where it is used, once a session has GSM8K work (issue 34: a suite that does
# not use the plugin should not pay for it; tests/plugin/test_inert.py pins the modules).

#: the marker every GSM8K item carries: ``-m gsm8k`` selects the gate, ``-m "not gsm8k"`` the rest
GSM8K_MARK = pytest.mark.gsm8k

# -- options -------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("gsm8k", "GSM8K evaluation (pytest-gsm8k)")
    for option in OPTIONS:
        if option.kind == "bool":
            group.addoption(
                option.flag, action="store_true", default=None, dest=option.dest, help=option.help
            )
            # A string, converted by settings: pytest's own "bool" conversion fails with a
            # message that does not name the option (pytest 9.2: a bare UsageError).
            parser.addini(option.dest, option.help, default=None)
        elif option.kind == "list":
            group.addoption(
                option.flag,
                action="append",
                default=None,
                dest=option.dest,
                metavar=option.metavar,
                help=option.help,
            )
            parser.addini(option.dest, option.help, type="linelist", default=None)
        else:
            shown = f" (default {option.default})" if option.default not in (None, "") else ""
            group.addoption(
                option.flag,
                default=None,
                dest=option.dest,
                metavar=option.metavar or option.name.upper(),
                help=option.help + shown,
            )
            parser.addini(option.dest, option.help, default=None)


def _spaced_paths(config: pytest.Config) -> Iterator[str]:
    """Before it knows our options pytest picks its rootdir from them (pytest-dev/pytest#8846)."""
    at, valued = config.invocation_params, {o.flag for o in OPTIONS if o.kind != "bool"}
    pairs = itertools.pairwise(str(a) for a in at.args)
    if flags := [f for f, v in pairs if f in valued and os.path.exists(at.dir / v)]:
        why = f"pytest took the value for a test path to the rootdir ({config.rootpath}) and ini"
        yield f"{', '.join(flags)} written with a space: {why}; write {flags[0]}=PATH"


def _read_option(config: pytest.Config, option: Option) -> Any:
    """Command line first, then the ini twin; None when neither is set."""
    value = config.getoption(option.dest)
    if value is not None:
        return value
    ini = config.getini(option.dest)
    if ini in (None, "", []):
        return None
    if option.kind == "bool" and isinstance(ini, str):
        try:
            return convert_bool(ini)
        except ValueError:
            raise SettingsError(f"ini {option.dest}: expected true or false, got {ini!r}") from None
    return ini


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gsm8k: a GSM8K problem item (-m gsm8k: only the gate)")
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
    worker = hasattr(config, "workerinput")
    if not worker:  # once, not once per xdist worker
        for note in [*notes, *_spaced_paths(config)]:
            config.issue_config_time_warning(pytest.PytestWarning(f"gsm8k: {note}"), stacklevel=2)
    from pytest_gsm8k.roles import role_for

    role = role_for(
        config, settings, os.urandom(16).hex(), time.time(), lambda: _on_sigterm(config)
    )
    # The session is made now when the session start has work for it (a model to reach or a
    # server to start, an output to check) or a gsm8k option is on the command line (with no
    # model it is refused after collection); ini values alone, as README's "In your
    # repository" sets them, wait for a GSM8K item: the repository's other runs do not pay.
    given = any(config.getoption(option.dest) is not None for option in OPTIONS)
    if given or role.asked or settings.report or settings.html or settings.markdown:
        role.session  # noqa: B018 - made here, on purpose
    config.pluginmanager.register(role, ROLE_NAME)
    # Registered before the builtin unraisableexception plugin's cleanup, so it runs after
    # that one's gc passes (see Role.freeze); it does nothing if nothing was frozen. An xdist
    # worker's process ends right after: leaving its objects frozen spares the interpreter's
    # final collection too, which the controller waits for.
    if not worker:
        config.add_cleanup(_unfreeze_until_exit)


_freeze_at_exit = False


def _unfreeze_until_exit() -> None:
    """Give the objects frozen for the run back to the collector (pytest may run again in
    this process: pytester, an IDE), and freeze whatever is left once the interpreter exits.

    At exit CPython walks every object it tracks in two full collections, a visible part
    of a full run's wall time spent on memory the operating system takes back anyway.
    Frozen objects are still freed by reference counting when modules are cleared, and
    atexit hooks (logging's flush, weakref finalizers) still run: only cyclic garbage left
    at exit is not collected.
    """
    global _freeze_at_exit
    if gc.get_freeze_count() and not _freeze_at_exit:
        _freeze_at_exit = True
        atexit.register(gc.freeze)
    gc.unfreeze()


def _on_sigterm(config: pytest.Config) -> None:
    """SIGTERM (a CI job cancelled, ``timeout``, ``kill``) ends the run like Ctrl-C: the
    summary is printed, the report written, xdist's workers stopped. Only in the main
    process, only over the default handler, restored when pytest unconfigures."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return  # somebody else's handler: leave it alone

    from pytest_gsm8k.roles import SIGTERM_MESSAGE

    def on_sigterm(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
        raise KeyboardInterrupt(SIGTERM_MESSAGE)

    signal.signal(signal.SIGTERM, on_sigterm)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)

    config.add_cleanup(restore)


def pytest_unconfigure(config: pytest.Config) -> None:
    role = config.pluginmanager.get_plugin(ROLE_NAME)
    if role is not None:
        if not role.idle():
            role.session.close()
        config.pluginmanager.unregister(role, ROLE_NAME)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "gsm8k_problem" not in metafunc.fixturenames:
        return
    from pytest_gsm8k.core.dataset import DatasetError
    from pytest_gsm8k.session import get_session

    state = get_session(metafunc.config)
    try:
        problems = state.plan.run_order
    except DatasetError as exc:
        if state.is_worker:
            # An xdist worker cannot end the session with a usage error (the controller,
            # which never collects, would crash); a CollectError is one line per module.
            raise pytest.Collector.CollectError(f"gsm8k: {exc}") from None
        # Raised here (inside a collector) it would become a collection error with a
        # traceback; the role's pytest_collection_finish raises it as one usage-error line.
        state.run.fail_data(f"gsm8k: {exc}")
        return
    # Every item of a problem carries the ``gsm8k`` marker (the built-in test's and a
    # user's own), so ``pytest -m gsm8k`` runs only the gate in a repository with other tests.
    metafunc.parametrize(
        "gsm8k_problem", [pytest.param(p, id=p.id, marks=GSM8K_MARK) for p in problems]
    )
