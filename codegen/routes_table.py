"""Render `contract/routes.json` as a typed Python route table."""

from __future__ import annotations

import json
from typing import Any

from codegen.paths import Layout, banner


def render_routes(layout: Layout, digest: str) -> str:
    routes: list[dict[str, Any]] = json.loads(layout.routes.read_text(encoding="utf-8"))
    lines = [
        banner(digest),
        '"""The route table of the Kiln contract (method, path, request and response types)."""',
        "",
        "from __future__ import annotations",
        "",
        "from dataclasses import dataclass",
        "",
        "",
        "@dataclass(frozen=True)",
        "class Route:",
        "    operation_id: str",
        "    method: str",
        "    path: str",
        "    request: str | None",
        "    response: str | None",
        "    media_types: tuple[str, ...]",
        "    streaming: bool",
        "",
        "",
        "ROUTES: tuple[Route, ...] = (",
    ]
    for r in routes:
        ok = r.get("responses", {}).get("200", {}).get("media_types", {})
        response = ok.get("application/json")
        if response is None and ok:
            response = next(iter(ok.values()))
        media = tuple(ok.keys())
        lines.append(
            "    Route("
            f"operation_id={r['operation_id']!r}, method={r['method'].upper()!r}, "
            f"path={r['path']!r}, request={r.get('request')!r}, response={response!r}, "
            f"media_types={media!r}, streaming={bool(r.get('streaming', False))!r}),"
        )
    lines += [")", ""]
    return "\n".join(lines)
