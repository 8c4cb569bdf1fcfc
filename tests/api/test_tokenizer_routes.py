"""vLLM's tokenizer routes on the engine double (a byte tokenizer: id = byte + 3, BOS 1)."""

from __future__ import annotations

from starlette.testclient import TestClient

from kiln.api.contract import contract


def test_tokenize_a_prompt(client: TestClient) -> None:
    r = client.post("/tokenize", json={"prompt": "hi", "return_token_strs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert contract().first_violation("TokenizeResponse", body) is None
    assert body["tokens"] == [1, ord("h") + 3, ord("i") + 3] and body["count"] == 3
    assert body["max_model_len"] == 4096 and len(body["token_strs"]) == 3
    plain = client.post("/tokenize", json={"prompt": "hi", "add_special_tokens": False}).json()
    assert plain["tokens"] == [ord("h") + 3, ord("i") + 3] and plain["token_strs"] is None


def test_tokenize_messages_as_chat_renders_them(client: TestClient) -> None:
    msg = [{"role": "user", "content": "yo"}]
    body = client.post("/tokenize", json={"messages": msg}).json()
    text = "<user>yo\n<assistant>"  # the double's template
    assert body["tokens"] == [b + 3 for b in text.encode()]
    bare = client.post("/tokenize", json={"messages": msg, "add_generation_prompt": False}).json()
    assert bare["tokens"] == [b + 3 for b in b"<user>yo\n"]


def test_tokenize_needs_exactly_one_input(client: TestClient) -> None:
    for body in ({}, {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}):
        r = client.post("/tokenize", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_detokenize(client: TestClient) -> None:
    r = client.post("/detokenize", json={"tokens": [ord("o") + 3, ord("k") + 3]})
    assert r.status_code == 200 and r.json() == {"prompt": "ok"}
    bad = client.post("/detokenize", json={"tokens": [5, 1000]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_tokenizer_info(client: TestClient) -> None:
    body = client.get("/tokenizer_info").json()
    assert contract().first_violation("TokenizerInfoResponse", body) is None
    assert body["vocab_size"] == 1000 and body["eos_token_ids"] == [2]


def test_an_api_key_guards_the_tokenizer_routes() -> None:
    from kiln.api.app import build_app
    from kiln.config import ServerConfig
    from tests.api.fake_backend import FakeBackend

    with TestClient(build_app(ServerConfig(api_keys=("k1",)), FakeBackend())) as c:
        assert c.post("/tokenize", json={"prompt": "a"}).status_code == 401
        assert c.get("/tokenizer_info").status_code == 401
        ok = c.post("/detokenize", json={"tokens": [70]}, headers={"authorization": "Bearer k1"})
        assert ok.status_code == 200
