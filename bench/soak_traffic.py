"""The soak's traffic mix: what each request is (kind, body, expected statuses, how the client
disconnects) and what became of it."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

MESSAGES = [
    [{"role": "user", "content": "Count from one to ten."}],
    [{"role": "user", "content": "Write a haiku about kilns."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "List three colours, comma separated."}],
]


@dataclass
class Spec:
    kind: str
    path: str
    body: Any = None
    raw: bytes | None = None
    content_type: str = "application/json"
    stream: bool = False
    expect: frozenset[int] = frozenset({200})
    choices: int = 1
    disconnect_after_chunks: int | None = None  # streaming: close after this many chunks
    client_timeout_s: float | None = None  # non-streaming: give up (disconnect) after this


@dataclass
class Outcome:
    kind: str
    outcome: str  # ok | expected_error | disconnected | unexpected_status | invalid_response
    #             | transport_error | lost
    status: int | None = None
    detail: str = ""
    finish: list[str] = field(default_factory=list)
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    request_id: str = ""  # the X-Request-Id it was sent with (the request log's key)
    path: str = ""


def _chat(rng: random.Random, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": rng.choice(MESSAGES), "max_tokens": rng.randint(4, 24),
                            "temperature": rng.choice([0.0, 0.7, 1.0]), "seed": rng.randint(0, 999)}
    body.update(extra)
    return body


def make_spec(rng: random.Random, adapters: bool) -> Spec:
    """One request drawn from the weighted mix."""
    chat = "/v1/chat/completions"
    kinds: list[tuple[str, int]] = [
        ("chat", 14), ("chat_stream", 16), ("chat_n", 8), ("stream_n_rejected", 3), ("stop", 6),
        ("thinking_budget", 4), ("disconnect_stream", 6), ("disconnect_nonstream", 5),
        ("malformed_json", 3), ("wrong_type", 3), ("n_over_limit", 2), ("batch_too_large", 2),
        ("wrong_content_type", 2), ("scoring", 8), ("batch", 5),
    ]
    if adapters:
        kinds += [("adapter", 5), ("adapter_stream", 4), ("adapter_compose", 3)]
    kind = rng.choices([k for k, _ in kinds], weights=[w for _, w in kinds])[0]
    bad = frozenset({400})
    if kind == "chat":
        return Spec(kind, chat, _chat(rng))
    if kind == "chat_stream":
        return Spec(kind, chat, _chat(rng, stream=True, stream_options={"include_usage": True}),
                    stream=True)
    if kind == "chat_n":
        n = rng.randint(2, 4)
        return Spec(kind, chat, _chat(rng, n=n, temperature=0.8), choices=n)
    if kind == "stream_n_rejected":  # Kiln: `stream` with n >= 2 is a 400 (docs/behavior.md §10)
        return Spec(kind, chat, _chat(rng, n=2, stream=True), stream=True, expect=bad)
    if kind == "stop":
        stream = rng.random() < 0.5
        stop = rng.choice([".", ["\n", ","], " the", ["3", "three"]])
        return Spec(kind, chat, _chat(rng, stop=stop, stream=stream), stream=stream)
    if kind == "thinking_budget":
        stream = rng.random() < 0.5
        body = _chat(rng, thinking_budget_tokens=rng.choice([0, 4, 16]), stream=stream,
                     thinking_budget_ms=rng.choice([None, 50, 5000]),
                     chat_template_kwargs={"enable_thinking": True}, max_tokens=24)
        return Spec(kind, chat, body, stream=stream)
    if kind == "disconnect_stream":
        return Spec(kind, chat, _chat(rng, stream=True, max_tokens=64, ignore_eos=True),
                    stream=True, disconnect_after_chunks=rng.randint(1, 4))
    if kind == "disconnect_nonstream":
        return Spec(kind, chat, _chat(rng, max_tokens=64, ignore_eos=True),
                    client_timeout_s=rng.uniform(0.05, 0.5))
    if kind == "malformed_json":
        return Spec(kind, chat, raw=b'{"messages": [{"role": "user", "content": "hi"', expect=bad)
    if kind == "wrong_type":
        return Spec(kind, chat, {"messages": "hello", "max_tokens": "many"}, expect=bad)
    if kind == "n_over_limit":
        return Spec(kind, chat, _chat(rng, n=65), expect=bad)
    if kind == "batch_too_large":
        return Spec(kind, "/v1/completions/batch",
                    {"prompts": [MESSAGES[0]] * 9, "n": 8, "max_tokens": 4}, expect=bad)
    if kind == "wrong_content_type":
        return Spec(kind, chat, raw=json.dumps(_chat(rng)).encode(), content_type="text/plain",
                    expect=frozenset({415}))
    if kind == "scoring":
        return Spec(kind, "/v1/completions",
                    {"prompt": rng.choice(["The quick brown fox jumps over the lazy dog.",
                                           "Kilns fire clay at high temperature."]),
                     "prompt_logprobs": rng.randint(0, 5)})
    if kind == "batch":
        prompts, n = rng.sample(MESSAGES, 2), rng.randint(1, 2)
        return Spec(kind, "/v1/completions/batch",
                    {"prompts": prompts, "n": n, "max_tokens": rng.randint(4, 12),
                     "temperature": 0.7, "seed": rng.randint(0, 99)}, choices=len(prompts) * n)
    if kind == "adapter":
        return Spec(kind, chat, _chat(rng, adapter="style"))
    if kind == "adapter_stream":
        return Spec(kind, chat, _chat(rng, model="style", stream=True), stream=True)
    return Spec(kind, chat, _chat(rng, adapters=[{"name": "style", "scale": 0.5},
                                                 {"name": "style", "scale": 0.25}]))


