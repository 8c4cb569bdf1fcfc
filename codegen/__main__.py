"""`python -m codegen [--check]`: regenerate kiln/api/_generated from contract/, or verify it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from codegen.openapi import render_openapi
from codegen.paths import DEFAULT_LAYOUT, Layout, contract_sha256
from codegen.routes_table import render_routes
from codegen.wire import render_wire

OUTPUTS: dict[str, Callable[[Layout, str], str]] = {
    "wire.py": render_wire,
    "openapi.json": render_openapi,
    "routes.py": render_routes,
}
INIT = '"""Generated from contract/ by `python -m codegen`. Never edit these files."""\n'


def render_all(layout: Layout) -> dict[str, str]:
    digest = contract_sha256(layout)
    files = {name: render(layout, digest) for name, render in OUTPUTS.items()}
    files["__init__.py"] = INIT
    # verbatim copies: the runtime validator checks requests against the contract itself
    for path in layout.contract_files():
        if path.name.endswith(".schema.json"):
            files[path.name] = path.read_text(encoding="utf-8")
    return files


def stale_files(layout: Layout) -> list[str]:
    """Names of generated files that differ from (or are missing next to) a fresh render."""
    stale = []
    for name, text in render_all(layout).items():
        path: Path = layout.out_dir / name
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            stale.append(name)
    return stale


def write_all(layout: Layout) -> list[str]:
    layout.out_dir.mkdir(parents=True, exist_ok=True)
    files = render_all(layout)
    for name, text in files.items():
        (layout.out_dir / name).write_text(text, encoding="utf-8")
    return sorted(files)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m codegen", description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if generated files are stale")
    parser.add_argument("--contract", type=Path, default=DEFAULT_LAYOUT.contract_dir)
    parser.add_argument("--out", type=Path, default=DEFAULT_LAYOUT.out_dir)
    args = parser.parse_args(argv)
    layout = Layout(args.contract, args.out)
    if args.check:
        stale = stale_files(layout)
        if stale:
            print(f"stale or edited generated files: {', '.join(stale)}; run `make generate`")
            return 2
        print("generated files are up to date")
        return 0
    for name in write_all(layout):
        print(f"wrote {layout.out_dir / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
