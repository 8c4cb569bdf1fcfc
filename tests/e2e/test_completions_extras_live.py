"""Issue 25's second part on the default model: render is what the routes run, best_of keeps the
best runs by cumulative logprob, prompt_logprobs beside generation are the scoring route's,
continue_final_message continues a real template's assistant turn, cache_salt keeps tokens."""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from tests import HANG_S
from tests.e2e.conftest import LiveServer

MSG: list[Any] = [{"role": "user", "content": "Name a colour."}]


def post(live: LiveServer, path: str, body: dict[str, Any]) -> Any:
    r = httpx.post(live.url + path, json=body, timeout=HANG_S)
    assert r.status_code == 200, r.text
    return r.json()


def test_render_is_what_chat_and_completions_run(live_server: LiveServer) -> None:
    body = {"messages": MSG, "temperature": 0, "max_tokens": 4, "return_token_ids": True}
    rendered = post(live_server, "/v1/chat/completions/render", body)
    ran = post(live_server, "/v1/chat/completions", body)
    assert rendered["token_ids"] == ran["prompt_token_ids"]
    tokenized = post(live_server, "/tokenize", {"messages": MSG})
    assert tokenized["tokens"] == rendered["token_ids"]
    (entry,) = post(live_server, "/v1/completions/render", {"prompt": rendered["prompt"]})
    tok = live_server.backend.tokenizer
    assert entry["token_ids"] == tok.encode(rendered["prompt"], add_special_tokens=True)


def test_continue_final_message_on_the_models_template(live_server: LiveServer) -> None:
    partial = [*MSG, {"role": "assistant", "content": "My favourite colour is"}]
    out = post(live_server, "/v1/chat/completions/render", {
        "messages": partial, "add_generation_prompt": False, "continue_final_message": True})
    assert out["prompt"].endswith("My favourite colour is")
    closed = post(live_server, "/v1/chat/completions/render", {
        "messages": partial, "add_generation_prompt": False})
    assert closed["prompt"].startswith(out["prompt"]) and len(closed["prompt"]) > len(out["prompt"])
    done = post(live_server, "/v1/chat/completions", {
        "messages": partial, "add_generation_prompt": False, "continue_final_message": True,
        "echo": True, "temperature": 0, "max_tokens": 4})
    assert done["choices"][0]["message"]["content"].startswith("My favourite colour is")


def test_best_of_keeps_the_runs_with_the_highest_cumulative_logprob(
    live_server: LiveServer
) -> None:
    common = {"prompt": "The weather today is", "max_tokens": 6, "temperature": 1.0,
              "seed": 11, "logprobs": 0, "ignore_eos": True}
    every = post(live_server, "/v1/completions", {**common, "n": 4})["choices"]
    best = post(live_server, "/v1/completions", {**common, "n": 2, "best_of": 4})["choices"]

    def total(c: dict[str, Any]) -> float:
        return float(sum(c["logprobs"]["token_logprobs"]))

    # the same seeds run the same four samples; best_of returns the two best, best first
    want = sorted(every, key=total, reverse=True)[:2]
    assert [c["text"] for c in best] == [c["text"] for c in want]


def test_prompt_logprobs_beside_generation_are_the_scoring_routes(
    live_server: LiveServer
) -> None:
    prompt = "The capital of France is"
    gen = post(live_server, "/v1/completions", {"prompt": prompt, "max_tokens": 3,
                                                 "temperature": 0, "prompt_logprobs": 2})
    score = post(live_server, "/v1/completions", {"prompt": prompt, "prompt_logprobs": 2})
    assert gen["choices"][0]["prompt_logprobs"] == score["choices"][0]["prompt_logprobs"]
    assert gen["choices"][0]["text"]


def test_cache_salt_changes_sharing_not_tokens(live_server: LiveServer) -> None:
    body = {"prompt": "Once upon a time in a land far away, " * 4, "max_tokens": 6,
            "temperature": 0, "return_token_ids": True}
    plain = post(live_server, "/v1/completions", body)["choices"][0]["token_ids"]
    salt = f"salt-{uuid.uuid4()}"  # the server lives for the session: a salt no one used
    for name, hits in ((salt, False), ("other-" + salt, False), (salt, True)):
        live_server.wait_idle()
        before = live_server.backend.stats()["prefix_cache_hit_tokens"]
        salted = post(live_server, "/v1/completions", {**body, "cache_salt": name})
        assert salted["choices"][0]["token_ids"] == plain
        hit = live_server.backend.stats()["prefix_cache_hit_tokens"] - before
        assert (hit > 0) == hits, (name, hit)
