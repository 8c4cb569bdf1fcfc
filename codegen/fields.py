"""Field groups: fields that several requests share, each defined once in the contract.

A field group is a `$defs` entry marked `"x-kiln-field-group": true`: an object schema with
`properties` only (no `required`, no rules). A definition includes it with an `allOf` branch that
is nothing but a local `$ref` to the group (`{"$ref": "#/$defs/SamplingFields"}`); JSON Schema
then checks the group's properties on the definition's instances, as if they were its own.

The validator reads that composition as it is. The struct generator and the OpenAPI bundle are
given each including definition *flattened*: each included group's properties in `allOf` order,
then its own (as a base class's fields come first), the include branches removed, so that a request is still one struct and one
object schema (and the served document can still bound a field per route). A name both a
definition and a group it includes define, or two of its groups define, fails generation: each
field is defined in one place.
"""

from __future__ import annotations

import copy
from typing import Any

MARK = "x-kiln-field-group"
LOCAL = "#/$defs/"
GROUP_KEYS = frozenset({"description", "type", "properties", MARK})


class FieldGroupError(ValueError):
    """A field group or an include the flattening cannot map."""


def groups(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The document's field groups by name, each checked to be a plain bag of properties."""
    found: dict[str, dict[str, Any]] = {}
    for name, definition in doc.get("$defs", {}).items():
        if not (isinstance(definition, dict) and definition.get(MARK) is True):
            continue
        extra = sorted(set(definition) - GROUP_KEYS)
        if extra or definition.get("type") != "object" or not definition.get("properties"):
            raise FieldGroupError(f"field group {name} must be an object schema with properties "
                                  f"only (it has {extra or 'no properties'})")
        found[name] = definition
    return found


def included(branch: Any, known: dict[str, Any]) -> str | None:
    """The group an `allOf` branch includes, else None (the branch is a rule)."""
    if not (isinstance(branch, dict) and set(branch) == {"$ref"}):
        return None
    ref = branch["$ref"]
    if not (isinstance(ref, str) and ref.startswith(LOCAL)):
        return None
    name = ref.removeprefix(LOCAL)
    return name if name in known else None


def includes(definition: Any, known: dict[str, Any]) -> list[str]:
    """The groups a definition includes, in `allOf` order."""
    if not isinstance(definition, dict):
        return []
    return [g for b in definition.get("allOf", []) if (g := included(b, known)) is not None]


def flatten_definition(name: str, definition: dict[str, Any],
                       known: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``definition`` with its included groups' properties as its own (module doc)."""
    names = includes(definition, known)
    if not names:
        return definition
    props: dict[str, Any] = {}
    where: dict[str, str] = {}
    for source, fields in [*((g, known[g]["properties"]) for g in names),
                           (name, definition.get("properties", {}))]:
        for field, schema in fields.items():
            if field in props:
                raise FieldGroupError(f"{name}.{field} is defined twice ({where[field]}, {source})")
            props[field], where[field] = copy.deepcopy(schema), source
    rules = [b for b in definition["allOf"] if included(b, known) is None]
    flat: dict[str, Any] = {}
    for key, value in definition.items():  # the definition's key order
        if key == "properties":
            flat[key] = props
        elif key == "allOf":
            if rules:
                flat[key] = rules
        else:
            flat[key] = value
    flat.setdefault("properties", props)
    return flat


def flatten(doc: dict[str, Any]) -> dict[str, Any]:
    """The schema document with every definition that includes field groups flattened (module
    doc), as a new document (``doc`` itself when it has no group; ``doc`` is never changed).
    The groups themselves stay (a field's `$ref` may point into one)."""
    known = groups(doc)
    if not known:
        return doc
    out = dict(doc)
    out["$defs"] = {name: flatten_definition(name, d, known) if name not in known else d
                    for name, d in doc["$defs"].items()}
    return out
