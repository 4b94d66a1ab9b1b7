"""The config matrix's answer source, without pytest (runtime/matrix.py)."""

from __future__ import annotations

from pytest_gsm8k.runtime.matrix import Matrix


def _no_server(name: str) -> tuple[object, object]:
    raise AssertionError(f"config {name} was launched by a matrix never started")


def test_closing_a_matrix_twice_is_safe() -> None:
    """Its docstring says idempotent: a second close() raised 'Event loop is closed'."""
    matrix = Matrix(["a", "b"], _no_server)  # type: ignore[arg-type]
    matrix.close()
    matrix.close()
    assert matrix.loop.is_closed()
