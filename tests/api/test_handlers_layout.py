"""kiln/api/handlers holds only route handlers: every module there serves a route of
``HANDLERS``; what they share sits beside them, named for what it holds (``kiln.api.requests``:
a wire request to engine work; ``kiln.api.replies``: engine outputs to the wire;
``kiln.api.structured``: structured-output compilation), and none of those imports a handler."""

from __future__ import annotations

import ast
from pathlib import Path

import kiln.api
from kiln.api.handlers import HANDLERS

API = Path(kiln.api.__file__).parent


def test_every_module_in_handlers_serves_a_route() -> None:
    modules = {f"kiln.api.handlers.{p.stem}" for p in (API / "handlers").glob("*.py")
               if p.stem != "__init__"}
    assert modules == {endpoint.__module__ for endpoint in HANDLERS.values()}


def test_the_shared_stages_never_import_a_handler() -> None:
    found = []
    for package in ("requests", "replies", "structured"):
        for path in sorted((API / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                found += [f"{package}/{path.name}: {n}" for n in names
                          if n == "kiln.api.handlers" or n.startswith("kiln.api.handlers.")]
    assert found == []
