"""pyproject.toml's requires-python says 3.10, and only 3.11 runs here: what can be checked
from 3.11 is checked (mypy --python-version 3.10 checks the standard library's names)."""

from __future__ import annotations

import ast
from re import _parser  # type: ignore[attr-defined]  # 3.11's parser: the opcodes by name

from helpers import REPO


def test_the_package_holds_no_syntax_or_regular_expression_that_python_3_10_refuses() -> None:
    """Python 3.10 parses every file, and no pattern given to ``re`` holds 3.11's possessive
    quantifiers or atomic groups: 3.10's re refuses them when the module is imported, and a
    plugin that fails to import stops every pytest run in that environment."""
    refused = []
    for path in sorted((REPO / "pytest_gsm8k").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(source, str(path), feature_version=(3, 10))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "re"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                opcodes = repr(_parser.parse(node.args[0].value))
                if "POSSESSIVE_REPEAT" in opcodes or "ATOMIC_GROUP" in opcodes:
                    refused.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not refused
