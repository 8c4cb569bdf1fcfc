"""The codegen view: the contract minus assertion-only composition, plus the closed-object map.

datamodel-code-generator cannot express `not` / `if` / `then` (it drops them silently) and turns
`anyOf`/`oneOf` branches that only list `required` into untagged Structs that msgspec refuses to
decode. The request validator enforces those rules from the contract itself, so the struct
generator is given a copy without them. A definition that includes field groups (the sampling
fields chat, completions and batch share: codegen/fields.py) is given flattened, one struct with
every field, and the groups themselves are left out (they are no wire type).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from codegen.fields import flatten, groups
from codegen.paths import API_SCHEMAS, MAIN_SCHEMA

ASSERTION_ONLY = frozenset({"not", "if", "then", "else"})
# A definition marked `"x-kiln-struct": "raw"` is a union msgspec cannot decode (OpenAI's
# Responses input item may leave out its `type` tag): the struct holds it as a plain object,
# which the validator has checked against the whole definition before the handler reads it.
RAW = "x-kiln-struct"
_REQUIRED_ONLY = frozenset({"required"})


def _is_assertion_branch(node: Any) -> bool:
    return isinstance(node, dict) and bool(node) and set(node) <= ASSERTION_ONLY | {"description"}


def _is_required_only(node: Any) -> bool:
    return isinstance(node, dict) and bool(node) and set(node) <= _REQUIRED_ONLY | {"description"}


def strip_assertions(node: Any) -> Any:
    """Return a deep copy of `node` without assertion-only composition."""
    if isinstance(node, list):
        return [strip_assertions(item) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get(RAW) == "raw":
        return {"description": node.get("description", "")}  # any value: the validator has checked it
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ASSERTION_ONLY:
            continue
        if key == "allOf" and isinstance(value, list):
            kept = [strip_assertions(v) for v in value if not _is_assertion_branch(v)]
            if kept:
                out[key] = kept
            continue
        if key in ("anyOf", "oneOf") and isinstance(value, list):
            kept = _one_array([strip_assertions(v) for v in value if not _is_required_only(v)])
            if kept:
                out[key] = kept
            continue
        out[key] = strip_assertions(value)
    return out


def _one_array(branches: list[Any]) -> list[Any]:
    """msgspec refuses a union of two array types (a completions prompt is token IDs, a list of
    them, or a list of texts): such branches become one plain array, whose items the contract's
    own validator has already checked."""
    arrays = [b for b in branches if isinstance(b, dict) and b.get("type") == "array"]
    if len(arrays) < 2:
        return branches
    first = branches.index(arrays[0])
    rest = [b for b in branches if not (isinstance(b, dict) and b.get("type") == "array")]
    return [*rest[:first], {"type": "array"}, *rest[first:]]


def _class_name(name: str) -> str:
    return name[:1].upper() + name[1:]


def _collect_closed(name: str, node: Any, closed: dict[str, Any]) -> None:
    if not isinstance(node, dict):
        return
    if node.get("additionalProperties") is False:
        closed[_class_name(name)] = {"base_class_kwargs": {"forbid_unknown_fields": True}}
    for prop, sub in node.get("properties", {}).items():
        # inline object properties become classes named after the property
        if isinstance(sub, dict) and "$ref" not in sub:
            _collect_closed(prop, sub, closed)
            items = sub.get("items")
            if isinstance(items, dict) and "$ref" not in items:
                _collect_closed(prop, items, closed)


def closed_objects(schemas: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """`--extra-template-data` map giving every closed object `forbid_unknown_fields`.

    Keys are the class names datamodel-code-generator uses: the `$defs` name (or, for an inline
    object, the property name) with the first letter upper-cased (`record` -> `Record`).
    """
    closed: dict[str, Any] = {}
    for doc in schemas.values():
        for name, definition in sorted(doc.get("$defs", {}).items()):
            _collect_closed(name, definition, closed)
    return dict(sorted(closed.items()))


def _local_refs(node: Any) -> Any:
    """An API file's refs to the main file's definitions, made local (they sit beside them)."""
    if isinstance(node, list):
        return [_local_refs(v) for v in node]
    if not isinstance(node, dict):
        return node
    return {k: (v.removeprefix(MAIN_SCHEMA) if k == "$ref" and isinstance(v, str)
                else _local_refs(v)) for k, v in node.items()}


def _merge_api_defs(docs: dict[str, dict[str, Any]], dest: Path) -> None:
    """The API files' (API_SCHEMAS) definitions join the main file's in its view, where the
    generator writes a struct for every definition (a sibling's are written only where the main
    file refers to them). Their refs are local to their file, so they hold in the main one; a
    name defined twice fails generation. The contract itself is unchanged."""
    main = docs.get(MAIN_SCHEMA)
    if main is None:
        return
    view = strip_assertions(main)
    for name in API_SCHEMAS:
        for key, definition in docs.get(name, {}).get("$defs", {}).items():
            if key in view["$defs"]:
                raise ValueError(f"{name} defines {key}, which is defined already")
            view["$defs"][key] = _local_refs(strip_assertions(definition))
    (dest / MAIN_SCHEMA).write_text(json.dumps(view, indent=2, ensure_ascii=False) + "\n",
                                    encoding="utf-8")


def _without_groups(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` flattened (codegen/fields.py), its field groups left out."""
    known = groups(doc)
    if not known:
        return doc
    flat = flatten(doc)
    return {**flat, "$defs": {k: v for k, v in flat["$defs"].items() if k not in known}}


def write_view(files: list[Path], dest: Path) -> Path:
    """Write the stripped copies of the schema files and the closed map; return the map path."""
    dest.mkdir(parents=True, exist_ok=True)
    docs: dict[str, dict[str, Any]] = {}
    for path in files:
        if not path.name.endswith(".schema.json"):
            continue
        doc = _without_groups(json.loads(path.read_text(encoding="utf-8")))
        docs[path.name] = doc
        (dest / path.name).write_text(
            json.dumps(strip_assertions(doc), indent=2, ensure_ascii=False) + "\n",
            encoding="utf-8",
        )
    _merge_api_defs(docs, dest)
    closed_path = dest / "closed-objects.json"
    closed_path.write_text(json.dumps(closed_objects(docs), indent=2) + "\n", encoding="utf-8")
    return closed_path
