"""The tokenizer routes on the default model agree with what the generation routes count."""

from __future__ import annotations

import httpx

from tests import HANG_S
from tests.e2e.conftest import LiveServer


def test_tokenize_counts_what_the_routes_count(live_server: LiveServer) -> None:
    url = live_server.url
    msg = [{"role": "user", "content": "What is the capital of France?"}]
    chat = httpx.post(url + "/v1/chat/completions", timeout=HANG_S,
                      json={"messages": msg, "max_tokens": 1}).json()
    tok = httpx.post(url + "/tokenize", json={"messages": msg}, timeout=HANG_S).json()
    assert tok["count"] == chat["usage"]["prompt_tokens"]
    comp = httpx.post(url + "/v1/completions", timeout=HANG_S,
                      json={"prompt": "Once upon a time", "max_tokens": 1}).json()
    text = httpx.post(url + "/tokenize", json={"prompt": "Once upon a time"}, timeout=HANG_S).json()
    assert text["count"] == comp["usage"]["prompt_tokens"]
    back = httpx.post(url + "/detokenize", json={"tokens": text["tokens"]}, timeout=HANG_S).json()
    assert back["prompt"] == "Once upon a time"
    info = httpx.get(url + "/tokenizer_info", timeout=HANG_S).json()
    assert info["vocab_size"] == 49152 and info["chat_template"]
