"""docs/flags.md is what the settings table generates (`python -m kiln.config_doc`)."""

from __future__ import annotations

from kiln.config import SETTINGS
from kiln.config_doc import DOC, main, render


def test_flag_reference_matches_the_table() -> None:
    assert DOC.read_text(encoding="utf-8") == render(), (
        "docs/flags.md is stale: run `python -m kiln.config_doc` (or `make generate`)")
    assert main(["--check"]) == 0


def test_flag_reference_names_every_flag_and_variable() -> None:
    text = render()
    for s in SETTINGS:
        for name in (s.flag, s.env):
            if name:
                assert f"`{name}`" in text, name
