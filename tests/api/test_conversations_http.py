"""/v1/conversations over HTTP (the engine test double): create, list, get, rename, rewrite,
delete, export; every bad input a 4xx in the error envelope; the list says where they are kept;
the API key guards them; under --data-dir a new app over the same directory finds them (one
database file, shared with the stored responses)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from kiln.database import FILE_NAME
from tests.api.fake_backend import FakeBackend
from tests.e2e.named_sse import check

MESSAGES = [
    {"role": "user", "content": "Name one primary color."},
    {"role": "assistant", "content": "Red.", "reasoning_content": "Any of three.",
     "meta": {"ttft_ms": 12.5, "token_ids": [1, 2, 3]}},
]
UNKNOWN = "conv_" + "0" * 32


def client_for(**config: Any) -> TestClient:
    app = build_app(ServerConfig(max_body_bytes=64 * 1024, **config), FakeBackend())
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture
def c() -> Iterator[TestClient]:
    with client_for() as client:
        yield client


def create(c: TestClient, **body: Any) -> dict[str, Any]:
    r = c.post("/v1/conversations", json=body)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    check("ConversationObject", data)
    return data


def test_create_get_list_rename_rewrite_delete(c: TestClient) -> None:
    empty = create(c)
    assert empty["title"] == "New conversation" and empty["messages"] == []
    full = create(c, title="Colors", messages=MESSAGES, settings={"temperature": 0.5})
    assert c.get(f"/v1/conversations/{full['id']}").json() == full

    listed = c.get("/v1/conversations").json()
    check("ConversationList", listed)
    assert listed["storage"] == "memory"
    assert [x["id"] for x in listed["data"]] == [full["id"], empty["id"]]  # newest change first
    assert listed["data"][0]["message_count"] == 2

    renamed = c.patch(f"/v1/conversations/{empty['id']}", json={"title": "Renamed"}).json()
    assert renamed["title"] == "Renamed" and renamed["messages"] == []
    assert c.get("/v1/conversations").json()["data"][0]["id"] == empty["id"]  # changed last

    rewritten = c.patch(f"/v1/conversations/{full['id']}", json={"messages": MESSAGES[:1]}).json()
    assert rewritten["messages"] == MESSAGES[:1] and rewritten["title"] == "Colors"
    assert rewritten["settings"] == {"temperature": 0.5}

    r = c.delete(f"/v1/conversations/{full['id']}")
    assert r.status_code == 200
    assert r.json() == {"id": full["id"], "object": "conversation.deleted", "deleted": True}
    check("ConversationDeleted", r.json())
    assert c.get(f"/v1/conversations/{full['id']}").status_code == 404
    assert [x["id"] for x in c.get("/v1/conversations").json()["data"]] == [empty["id"]]


def test_export_is_chat_format_as_a_download(c: TestClient) -> None:
    conv = create(c, title="Colors", messages=[*MESSAGES, {"role": "user", "content": "Why?"}])
    r = c.get(f"/v1/conversations/{conv['id']}/export")
    assert r.status_code == 200
    assert r.headers["content-disposition"] == f'attachment; filename="{conv["id"]}.json"'
    body = r.json()
    check("ConversationExport", body)
    assert body["messages"] == [
        {"role": "user", "content": "Name one primary color."},
        {"role": "assistant", "content": "Red.", "reasoning_content": "Any of three."},
        {"role": "user", "content": "Why?"},
    ]
    assert body["records"] == [{}, {"ttft_ms": 12.5, "token_ids": [1, 2, 3]}, {}]


def error_of(r: Any, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    check("ErrorResponse", r.json())
    err: dict[str, Any] = r.json()["error"]
    assert err["code"] == code, err
    return err


@pytest.mark.parametrize("body", [
    {"title": ""},
    {"title": "x" * 201},
    {"title": 3},
    {"messages": [{"role": "robot", "content": "hi"}]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "user", "content": "hi", "extra": 1}]},
    {"messages": "hi"},
    {"settings": []},
    {"unknown": True},
])
def test_a_bad_body_is_a_400(c: TestClient, body: dict[str, Any]) -> None:
    error_of(c.post("/v1/conversations", json=body), 400, "invalid_conversation_request")
    conv = create(c)
    error_of(c.patch(f"/v1/conversations/{conv['id']}", json=body), 400,
             "invalid_conversation_request")


def test_other_bad_input_is_a_4xx_never_a_500(c: TestClient) -> None:
    conv = create(c)
    path = f"/v1/conversations/{conv['id']}"
    error_of(c.patch(path, json={}), 400, "invalid_conversation_request")  # nothing to change
    error_of(c.post("/v1/conversations", content=b"{not json",
                    headers={"content-type": "application/json"}), 400, "invalid_json")
    error_of(c.post("/v1/conversations", json=[1]), 400, "invalid_conversation_request")
    error_of(c.post("/v1/conversations", content=b"{}", headers={"content-type": "text/plain"}),
             415, "unsupported_media_type")
    error_of(c.post("/v1/conversations", json={"title": "x" * 70_000}), 413, "request_too_large")
    for bad in ("abc", "conv_XYZ", "conv_" + "0" * 31, "conv_" + "0" * 32 + "/x", "%2e%2e"):
        err = error_of(c.get(f"/v1/conversations/{bad}"), 400, "invalid_conversation_id")
        assert err["param"] == "conversation_id"
        error_of(c.delete(f"/v1/conversations/{bad}"), 400, "invalid_conversation_id")
    for method in ("GET", "DELETE"):
        error_of(c.request(method, f"/v1/conversations/{UNKNOWN}"), 404, "conversation_not_found")
    error_of(c.get(f"/v1/conversations/{UNKNOWN}/export"), 404, "conversation_not_found")
    error_of(c.patch(f"/v1/conversations/{UNKNOWN}", json={"title": "t"}), 404,
             "conversation_not_found")
    error_of(c.put(path, json={"title": "t"}), 405, "method_not_allowed")
    for method in ("PATCH", "DELETE", "POST"):
        r = c.request(method, f"{path}/export", json={"title": "t"})
        error_of(r, 405, "method_not_allowed")
        assert "GET" in r.headers["allow"]


def test_the_api_key_guards_the_conversations_but_not_the_page() -> None:
    with client_for(api_keys=("sesame",)) as c:
        error_of(c.get("/v1/conversations"), 401, "missing_api_key")
        error_of(c.post("/v1/conversations", json={}, headers={"authorization": "Bearer nope"}),
                 401, "invalid_api_key")
        ok = c.post("/v1/conversations", json={}, headers={"authorization": "Bearer sesame"})
        assert ok.status_code == 200
        assert c.get("/ui").status_code == 200  # the page asks for the key itself


def test_under_a_data_dir_they_survive_a_new_app(tmp_path: Path) -> None:
    with client_for(data_dir=str(tmp_path)) as c:
        conv = create(c, title="Kept", messages=MESSAGES)
        assert c.get("/v1/conversations").json()["storage"] == "sqlite"
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))] == \
        [FILE_NAME]  # one database for the stored responses and the conversations
    with client_for(data_dir=str(tmp_path)) as c:
        assert c.get(f"/v1/conversations/{conv['id']}").json() == conv
        listed = c.get("/v1/conversations").json()
        assert listed["storage"] == "sqlite" and listed["data"][0]["id"] == conv["id"]
        assert c.delete(f"/v1/conversations/{conv['id']}").status_code == 200
    with client_for(data_dir=str(tmp_path)) as c:
        assert c.get("/v1/conversations").json()["data"] == []
