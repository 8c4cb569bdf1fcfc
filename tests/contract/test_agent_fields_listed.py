"""contract/CHANGELOG.md lists every request field of the agent APIs as honoured or refused: a
field added to either request without a word on it fails here."""

from __future__ import annotations

import pytest

from tests.contract.contract_files import CONTRACT_DIR, api_defs

REQUESTS = ("ResponsesCreateRequest", "MessagesCreateRequest", "MessagesCountTokensRequest")


@pytest.mark.parametrize("name", REQUESTS)
def test_every_field_is_listed(name: str) -> None:
    text = (CONTRACT_DIR / "CHANGELOG.md").read_text(encoding="utf-8")
    section = text[text.index("## Issue 46"):]
    missing = [f for f in api_defs()[name]["properties"] if f"`{f}`" not in section]
    assert not missing, f"{name}: contract/CHANGELOG.md says nothing of {missing}"
