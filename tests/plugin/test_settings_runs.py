"""Options on the command line: every option has its flag and ini twin, and a non-finite
number is one usage error."""

from __future__ import annotations

import pytest

from pytest_gsm8k.core.settings import OPTIONS


def test_every_option_has_a_flag_and_an_ini_twin(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help")
    text = result.stdout.str()
    for option in OPTIONS:
        assert option.flag in text, option.flag
        assert option.dest in text, option.dest  # listed under [pytest] ini-options


def test_a_non_finite_number_on_the_command_line_is_one_usage_error(
    pytester: pytest.Pytester,
) -> None:
    result = pytester.runpytest("--gsm8k-model=m", "--gsm8k-timeout=inf", "-n", "2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    text = result.stdout.str() + result.stderr.str()
    lines = [line for line in text.splitlines() if "gsm8k-timeout" in line]
    assert lines == ["ERROR: gsm8k: --gsm8k-timeout: expected a finite number, got 'inf'"], text
    assert "Traceback" not in text
