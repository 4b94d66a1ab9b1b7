"""The checked-in JSON Schema of the report is valid and names the report's version."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import jsonschema

from pytest_gsm8k.core.records import REPORT_SCHEMA


def schema() -> dict[str, Any]:
    text = resources.files("pytest_gsm8k").joinpath("schema/report.schema.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def test_the_schema_is_valid_and_names_its_version() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    assert schema()["properties"]["schema"] == {"const": REPORT_SCHEMA}
