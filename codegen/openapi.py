"""Bundle the contract into an OpenAPI 3.1 document.

OAS 3.1 schemas are JSON Schema 2020-12, so every `$defs` entry is copied verbatim into
`components/schemas`; only `$ref`s are rewritten, and a definition that includes field groups
(codegen/fields.py) is written flattened: one object schema with every field, so that a client
or a fuzzer reads one request object and the served document can bound a shared field per route.
The groups are copied too (a field's `$ref` may point into one). Paths come from
`contract/routes.json`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from codegen.fields import flatten
from codegen.paths import API_SCHEMAS, MAIN_SCHEMA, Layout

# a sibling's definitions are named with its prefix; the API files' names carry their own
SIBLING_PREFIX = {"thinking-budget-v1.schema.json": "ThinkingBudget_",
                  **{name: "" for name in API_SCHEMAS}}
SSE_EVENT = "ChatCompletionStreamEvent"


class BundleError(ValueError):
    """The contract holds something the bundler cannot map."""


def _rewrite_ref(ref: str, current: str) -> str:
    target, _, fragment = ref.partition("#")
    target = target or current
    if not fragment.startswith("/$defs/"):
        raise BundleError(f"unsupported $ref {ref!r} in {current}")
    name = fragment.removeprefix("/$defs/")
    if target == MAIN_SCHEMA:
        return f"#/components/schemas/{name}"
    if target in SIBLING_PREFIX:
        return f"#/components/schemas/{SIBLING_PREFIX[target]}{name}"
    raise BundleError(f"external $ref {ref!r} in {current} is not part of the contract")


def _rewrite(node: Any, current: str) -> Any:
    if isinstance(node, list):
        return [_rewrite(v, current) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str):
            out[key] = _rewrite_ref(value, current)
        elif key in ("$id", "$schema"):
            continue
        else:
            out[key] = _rewrite(value, current)
    return out


def _schema_ref(name: str | None) -> dict[str, Any]:
    if name is None:
        return {"type": "string"}
    return {"$ref": f"#/components/schemas/{name}"}


def _sse_event_schema(main: dict[str, Any]) -> dict[str, Any]:
    """Per-event schema for the chat SSE stream (OAS < 3.2 has no itemSchema).

    Each parsed event's `data` is either the `[DONE]` sentinel or JSON matching one of the
    contract's `x-kiln-event-schemas` (or the error envelope sent when generation fails
    mid-stream).
    """
    stream = main["$defs"].get("ChatCompletionChunkStream", {})
    events = [_rewrite(e, MAIN_SCHEMA) for e in stream.get("x-kiln-event-schemas", [])]
    events.append(_schema_ref("ErrorResponse"))
    return {
        "type": "object",
        "description": "One server-sent event of the chat completion stream.",
        "required": ["data"],
        "properties": {
            "data": {
                "type": "string",
                "anyOf": [
                    {"const": "[DONE]"},
                    {
                        "contentMediaType": "application/json",
                        "contentSchema": {"anyOf": events},
                    },
                ],
            }
        },
    }


def _event_of(name: str) -> dict[str, Any]:
    """One server-sent event whose data is `[DONE]` or JSON of definition ``name`` (or the
    error envelope)."""
    events = [_schema_ref(name), _schema_ref("ErrorResponse")]
    return {
        "type": "object",
        "required": ["data"],
        "properties": {"data": {"type": "string", "anyOf": [
            {"const": "[DONE]"},
            {"contentMediaType": "application/json", "contentSchema": {"anyOf": events}},
        ]}},
    }


def _operation(route: dict[str, Any], examples: dict[str, Any]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": route["operation_id"],
        "summary": route.get("summary", ""),
        "tags": [route.get("tag", "kiln")],
        "responses": {},
    }
    params = re.findall(r"{([^}]+)}", route["path"])
    typed = route.get("path_parameters", {})  # a path parameter's contract $defs name
    if params:
        op["parameters"] = [
            {"name": p, "in": "path", "required": True,
             "schema": _schema_ref(typed[p]) if p in typed else {"type": "string"}}
            for p in params
        ]
    request = route.get("request")
    if request:
        media: dict[str, Any] = {"schema": _schema_ref(request)}
        if request in examples:
            media["examples"] = {
                f"example{i}": {"value": v} for i, v in enumerate(examples[request])
            }
        op["requestBody"] = {"required": True, "content": {"application/json": media}}
    for status, resp in sorted(route.get("responses", {}).items()):
        content: dict[str, Any] = {}
        for media_type, name in resp.get("media_types", {}).items():
            if media_type == "text/event-stream" and name != "ChatCompletionChunkStream":
                content[media_type] = {"schema": _event_of(name)}
            elif media_type == "text/event-stream":
                content[media_type] = {"schema": _schema_ref(SSE_EVENT)}
            else:
                content[media_type] = {"schema": _schema_ref(name)}
        entry: dict[str, Any] = {"description": resp.get("description", f"HTTP {status}")}
        if content:
            entry["content"] = content
        op["responses"][str(status)] = entry
    return op


def build_openapi(layout: Layout) -> dict[str, Any]:
    main = flatten(json.loads(layout.main_schema.read_text(encoding="utf-8")))
    schemas: dict[str, Any] = {}
    for name, definition in main["$defs"].items():
        schemas[name] = _rewrite(definition, MAIN_SCHEMA)
    for filename, prefix in SIBLING_PREFIX.items():
        path: Path = layout.contract_dir / filename
        if path.exists():
            sibling = flatten(json.loads(path.read_text(encoding="utf-8")))
            for name, definition in sibling.get("$defs", {}).items():
                if prefix + name in schemas:
                    raise BundleError(f"{filename} defines {name}, which is defined already")
                schemas[prefix + name] = _rewrite(definition, filename)
    schemas[SSE_EVENT] = _sse_event_schema(main)
    routes = json.loads(layout.routes.read_text(encoding="utf-8"))
    examples = dict(main.get("x-kiln-examples", {}))
    for filename in API_SCHEMAS:
        path = layout.contract_dir / filename
        if path.exists():
            examples.update(json.loads(path.read_text(encoding="utf-8")).get("x-kiln-examples", {}))
    paths: dict[str, Any] = {}
    for route in routes:
        paths.setdefault(route["path"], {})[route["method"].lower()] = _operation(route, examples)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": main.get("title", "Kiln inference API"),
            "version": "1.0.0",
            "description": main.get("description", ""),
        },
        "servers": [{"url": "http://127.0.0.1:8420"}],
        "paths": paths,
        "components": {"schemas": dict(sorted(schemas.items()))},
    }


def render_openapi(layout: Layout, digest: str) -> str:
    doc = build_openapi(layout)
    doc["info"]["x-contract-sha256"] = digest
    return json.dumps(doc, indent=2, ensure_ascii=False, sort_keys=False) + "\n"
