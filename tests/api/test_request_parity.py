"""The same fields give the same engine request on chat and on batch (one prompt, n = 1): prompt
tokens, sampling parameters, stop strings, thinking budget and adapter. A field one endpoint
reads and the other ignores would be a silent difference between an RL trainer's chat probes
and its batch rollouts."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.config import ServerConfig
from tests.api.fake_backend import EchoTemplate, FakeBackend

MSG = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


class KwargsTemplate(EchoTemplate):
    """Echo, plus every template variable the request passed (so the prompt shows them)."""

    def render(self, messages: list[dict[str, Any]], *, tools: list[Any] | None = None,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        text = super().render(messages, tools=tools, add_generation_prompt=False)
        shown = json.dumps({"tools": bool(tools), **kwargs}, sort_keys=True)
        return f"{text}{shown}\n<assistant>" if add_generation_prompt else text


@pytest.fixture
def backend(tmp_path: Path) -> FakeBackend:
    folder = tmp_path / "adapters" / "style"
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    (folder / "adapter_model.safetensors").write_bytes(b"\0" * 16)
    b = FakeBackend(adapter_dir=tmp_path / "adapters")
    b.chat_template = KwargsTemplate()
    return b


@pytest.fixture
def client(backend: FakeBackend) -> Iterator[TestClient]:
    config = ServerConfig(default_thinking_enabled=True, default_thinking_budget_tokens=5)
    with TestClient(build_app(config, backend), raise_server_exceptions=False) as c:
        yield c


FIELDS: list[dict[str, Any]] = [
    {},
    {"temperature": 0.3, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "seed": 11},
    {"presence_penalty": 0.4, "frequency_penalty": 0.2, "repetition_penalty": 1.1},
    {"sampling_preset": "greedy", "max_tokens": 9, "ignore_eos": True},
    {"max_completion_tokens": 4, "stop": ["b", "ab", "c"]},
    {"tools": TOOLS, "tool_choice": "auto"},
    {"tools": TOOLS, "tool_choice": "none", "parallel_tool_calls": False},
    {"chat_template_kwargs": {"enable_thinking": False, "x": 1}},
    {"thinking_budget_tokens": 3, "thinking_budget_ms": 1000},
    {"thinking_budget_tokens": None},
    {"adapter": "style"},
    {"adapter": None},
    {"adapters": [{"name": "style", "scale": 0.5}]},
    {"model": "style"},
]


@pytest.mark.parametrize("fields", FIELDS, ids=[json.dumps(f)[:60] for f in FIELDS])
@pytest.mark.parametrize("default_adapter", [False, True], ids=["no-default", "default-set"])
def test_chat_and_batch_build_the_same_engine_request(
    client: TestClient, backend: FakeBackend, fields: dict[str, Any], default_adapter: bool
) -> None:
    if default_adapter:
        assert client.post("/v1/adapters/load", json={"name": "style"}).status_code == 200
    chat = client.post("/v1/chat/completions", json={"messages": MSG, **fields})
    assert chat.status_code == 200, chat.text
    via_chat = backend.submitted[-1]
    batch = client.post("/v1/completions/batch", json={"prompts": [MSG], **fields})
    assert batch.status_code == 200, batch.text
    via_batch = backend.submitted[-1]
    assert via_batch is not via_chat
    assert via_batch.prompt_token_ids == via_chat.prompt_token_ids
    assert via_batch.sampling == via_chat.sampling
    assert via_batch.lora == via_chat.lora
