"""The served /openapi.json states the loaded model's and the server's bounds, and the server
refuses exactly past them (so a client that follows the document is never refused for them)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.api.served_openapi import below
from kiln.config import ServerConfig
from tests.api.fake_backend import VOCAB, FakeBackend

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture
def doc_client() -> Any:
    with TestClient(build_app(ServerConfig(max_logprobs=7), FakeBackend()),
                    raise_server_exceptions=False) as c:
        yield c


def test_document_carries_the_model_and_server_bounds(doc_client: TestClient) -> None:
    doc = doc_client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    cfg = ServerConfig()
    assert doc["x-kiln-served-bounds"] == {"vocab_size": VOCAB, "max_logprobs": 7,
                                           "max_model_len": FakeBackend.max_model_len,
                                           "capacity": cfg.max_num_seqs + cfg.max_waiting_requests}
    assert schemas["TokenId"]["maximum"] == VOCAB - 1
    top = schemas["ChatCompletionRequest"]["properties"]["top_logprobs"]["oneOf"]
    assert [b.get("maximum") for b in top if b.get("type") == "integer"] == [7]
    bias = schemas["ChatCompletionRequest"]["properties"]["logit_bias"]["oneOf"]
    pattern = next(b for b in bias if b.get("type") == "object")["propertyNames"]["pattern"]
    assert pattern == below(VOCAB)


def test_a_field_pointer_into_a_field_group_reads_the_served_bounds(doc_client: TestClient) -> None:
    """/inference/v1/generate's sampling parameters point at completions' fields, some of which
    live in the SamplingFields group (issue 45): the group's copy is bounded as the requests'."""
    schemas = doc_client.get("/openapi.json").json()["components"]["schemas"]
    ref = schemas["GenerateSamplingParams"]["properties"]["logit_bias"]["$ref"]
    assert ref == "#/components/schemas/SamplingFields/properties/logit_bias"
    for name in ("SamplingFields", "TextCompletionRequest"):
        bias = schemas[name]["properties"]["logit_bias"]["oneOf"]
        assert next(b for b in bias if b.get("type") == "object")["propertyNames"] == {
            "pattern": below(VOCAB)}


def test_the_server_refuses_exactly_past_the_served_bounds(doc_client: TestClient) -> None:
    ok = doc_client.post("/detokenize", json={"tokens": [VOCAB - 1]})
    past = doc_client.post("/detokenize", json={"tokens": [VOCAB]})
    assert ok.status_code == 200 and past.status_code == 400
    for top, status in ((7, 200), (8, 400)):
        r = doc_client.post("/v1/chat/completions",
                            json={"messages": MSG, "logprobs": True, "top_logprobs": top})
        assert r.status_code == status, r.text
    for key, status in ((str(VOCAB - 1), 200), (str(VOCAB), 400)):
        r = doc_client.post("/v1/chat/completions", json={"messages": MSG, "logit_bias": {key: 1}})
        assert r.status_code == status, r.text


@pytest.mark.parametrize("n", [1, 2, 9, 10, 11, 99, 100, 101, 1000, 32000, 151936])
def test_below_matches_exactly_the_decimals_under_n(n: int) -> None:
    pattern = re.compile(below(n))
    probes = set(range(min(n + 20, 2100))) | {n - 1, n, n + 1, 10 * n}
    for v in probes:
        assert bool(pattern.fullmatch(str(v))) == (v < n), v
        assert bool(pattern.fullmatch("00" + str(v))) == (v < n), v
    assert not pattern.fullmatch("") and not pattern.fullmatch("-1")


def test_generated_document_stays_model_independent() -> None:
    from kiln.api.served_openapi import _generated_doc

    schemas = _generated_doc()["components"]["schemas"]
    assert schemas["TokenId"]["maximum"] == 2**32 - 1
    assert "x-kiln-served-bounds" not in _generated_doc()


def test_chat_and_batch_prompt_logprobs_and_logit_bias_are_served_bounded(
        doc_client: TestClient) -> None:
    """Chat's and batch's prompt_logprobs are at most --max-logprobs (7 here) and batch's
    logit_bias keys below the vocabulary, in the document and at the server alike."""
    schemas = doc_client.get("/openapi.json").json()["components"]["schemas"]
    for name in ("ChatCompletionRequest", "BatchCompletionRequest"):
        k = schemas[name]["properties"]["prompt_logprobs"]["oneOf"]
        assert [b.get("maximum") for b in k if b.get("type") == "integer"] == [7]
    bias = schemas["BatchCompletionRequest"]["properties"]["logit_bias"]["oneOf"]
    assert next(b for b in bias if b.get("type") == "object")["propertyNames"]["pattern"] == \
        below(VOCAB)
    for route, body in (("/v1/chat/completions", {"messages": MSG}),
                        ("/v1/completions/batch", {"prompts": [MSG]})):
        for k, status in ((7, 200), (8, 400)):
            r = doc_client.post(route, json={**body, "max_tokens": 2, "prompt_logprobs": k})
            assert r.status_code == status, r.text
        for key, status in ((str(VOCAB - 1), 200), (str(VOCAB), 400)):
            r = doc_client.post(route, json={**body, "max_tokens": 2, "logit_bias": {key: 1}})
            assert r.status_code == status, r.text
