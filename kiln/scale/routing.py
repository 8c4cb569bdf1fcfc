"""Which replica a request would rather run on: the routing key, and rendezvous hashing.

Requests that share a key run on one replica, where the earlier ones left their prompt's KV
blocks in the prefix cache and their adapter in a LoRA slot. The key is the request's
`session_id` (body field or `x-session-id` header) when it names one, else a hash of the
adapter and the first `PREFIX_CHARS` characters of the prompt (the messages' text, or the
completion prompt): the part that prefix caching shares. Rendezvous (highest-random-weight)
hashing maps a key to a replica so that a replica leaving moves only its own keys.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

PREFIX_CHARS = 512  # ~32 KV blocks of 16 tokens of English: enough to tell conversations apart
ROUTED_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/completions/batch")


def _prompt_text(body: dict[str, Any]) -> str:
    if isinstance(body.get("messages"), list):
        return json.dumps(body["messages"], sort_keys=True, ensure_ascii=False)
    for name in ("prompt", "prompts"):
        if name in body:
            return json.dumps(body[name], sort_keys=True, ensure_ascii=False)
    return ""


def routing_key(path: str, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> str | None:
    """The affinity key of one request, or None (any replica; the least loaded)."""
    for name, value in headers:
        if name.lower() == b"x-session-id" and value:
            return "session:" + value.decode("latin-1")
    if path not in ROUTED_PATHS:
        return None
    try:
        data = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return None  # the replica answers the 400
    if not isinstance(data, dict):
        return None
    session = data.get("session_id")
    if isinstance(session, str) and session:
        return "session:" + session
    text = _prompt_text(data)
    if not text:
        return None
    adapter = data.get("adapter") or data.get("model") or ""
    digest = hashlib.sha256(f"{adapter}\0{text[:PREFIX_CHARS]}".encode()).hexdigest()[:32]
    return "prefix:" + digest


def rendezvous(key: str, replicas: Sequence[str]) -> str:
    """The replica of ``replicas`` (ids) that ``key`` prefers: the highest hash of both."""
    if not replicas:
        raise ValueError("no replicas")

    def weight(replica: str) -> bytes:
        return hashlib.sha256(f"{key}\0{replica}".encode()).digest()

    return max(replicas, key=weight)
