"""Load the contract files and build validators for their definitions."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs
import referencing
from jsonschema import Draft202012Validator
from referencing.jsonschema import DRAFT202012

from codegen.fields import flatten, groups, included, includes

CONTRACT_DIR = Path(__file__).resolve().parents[2] / "contract"
MAIN_FILE = "kiln-inference-v1.schema.json"
TB_FILE = "thinking-budget-v1.schema.json"
API_FILES = ("responses-v1.schema.json", "messages-v1.schema.json",  # the agent clients' APIs
             "training-v1.schema.json",  # a training loop's routes
             "conversations-v1.schema.json")  # and the stored conversations (/ui's)


@cache
def load(name: str) -> Any:
    return json.loads((CONTRACT_DIR / name).read_text(encoding="utf-8"))


def main_schema() -> dict[str, Any]:
    schema: dict[str, Any] = load(MAIN_FILE)
    return schema


@cache
def flat_main_schema() -> dict[str, Any]:
    """The main file with each request's field groups flattened into it (codegen/fields.py):
    the fields a request takes, as the generated struct and the OpenAPI document have them."""
    schema: dict[str, Any] = flatten(main_schema())
    return schema


def field_groups() -> dict[str, dict[str, Any]]:
    """The main file's field groups (``x-kiln-field-group``) by name."""
    return groups(main_schema())


def included_groups(definition: str) -> list[str]:
    """The field groups a main-file definition includes, in ``allOf`` order."""
    return includes(main_schema()["$defs"][definition], field_groups())


def rule_branches(definition: dict[str, Any]) -> list[tuple[int, Any]]:
    """A definition's ``allOf`` branches that state a rule, with their index (the branches that
    include a field group are no rule)."""
    known = field_groups()
    return [(i, b) for i, b in enumerate(definition.get("allOf", []))
            if included(b, known) is None]


def tb_schema() -> dict[str, Any]:
    schema: dict[str, Any] = load(TB_FILE)
    return schema


def api_defs() -> dict[str, Any]:
    """Every definition of the API files, by name (the names carry the API's prefix)."""
    out: dict[str, Any] = {}
    for name in API_FILES:
        out.update(load(name)["$defs"])
    return out


def routes() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = load("routes.json")
    return data


def def_uri(name: str, file: str = MAIN_FILE) -> str:
    schema = main_schema() if file == MAIN_FILE else tb_schema()
    return f"{schema['$id']}#/$defs/{name}"


@cache
def rs_registry() -> jsonschema_rs.Registry:
    return jsonschema_rs.Registry(
        [(main_schema()["$id"], main_schema()), (tb_schema()["$id"], tb_schema())]
    )


@cache
def rs_validator(name: str, file: str = MAIN_FILE) -> Any:
    """A jsonschema_rs validator for one definition (``$ref`` wrapper + registry of both files)."""
    return jsonschema_rs.validator_for({"$ref": def_uri(name, file)}, registry=rs_registry())


@cache
def py_validator(name: str, file: str = MAIN_FILE) -> Draft202012Validator:
    """The ``jsonschema`` package's validator for one definition (second opinion)."""
    registry: referencing.Registry[Any] = referencing.Registry().with_resources(
        [
            (main_schema()["$id"], DRAFT202012.create_resource(main_schema())),
            (tb_schema()["$id"], DRAFT202012.create_resource(tb_schema())),
        ]
    )
    return Draft202012Validator({"$ref": def_uri(name, file)}, registry=registry)
