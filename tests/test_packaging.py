"""pyproject.toml names every package of the tree (a wheel built from it holds them all)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_is_listed() -> None:
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
                 ["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts)
               for top in ("kiln", "kiln_kernels", "codegen")
               for p in (ROOT / top).rglob("__init__.py")}
    assert listed == on_disk
