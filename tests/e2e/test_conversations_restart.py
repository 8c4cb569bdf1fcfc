"""Conversations kept under --data-dir survive a restart of a live `kiln serve` (default model),
beside the stored responses in the same database; without --data-dir a restart forgets them and
the list says they were kept in memory."""

from __future__ import annotations

from pathlib import Path

import httpx

from kiln.testing import running_server
from tests import HANG_S

MESSAGES = [{"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi!", "meta": {"token_ids": [1, 2]}}]


def test_conversations_survive_a_restart_with_a_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    args = ["--data-dir", str(data)]
    with running_server(args, log_path=tmp_path / "first.log") as server:
        made = httpx.post(server.url + "/v1/conversations", timeout=HANG_S,
                          json={"title": "Kept", "messages": MESSAGES}).json()
        stored = httpx.post(server.url + "/v1/responses", timeout=HANG_S,
                            json={"input": "Hi", "max_output_tokens": 2}).json()
    with running_server(args, log_path=tmp_path / "second.log") as server:
        listed = httpx.get(server.url + "/v1/conversations", timeout=HANG_S).json()
        assert listed["storage"] == "sqlite"
        assert [c["id"] for c in listed["data"]] == [made["id"]]
        got = httpx.get(f"{server.url}/v1/conversations/{made['id']}", timeout=HANG_S).json()
        assert got == made
        again = httpx.get(f"{server.url}/v1/responses/{stored['id']}", timeout=HANG_S)
        assert again.status_code == 200  # one database file holds both
    assert sorted(p.name for p in data.iterdir() if p.suffix == ".sqlite3") == ["kiln.sqlite3"]

    with running_server([], log_path=tmp_path / "memory.log") as server:
        listed = httpx.get(server.url + "/v1/conversations", timeout=HANG_S).json()
        assert listed == {"object": "list", "data": [], "storage": "memory"}
