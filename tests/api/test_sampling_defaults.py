"""Sampling defaults (docs/decisions.md): a request that names no preset starts from the model's
generation_config.json (vLLM's `--generation-config auto`), or from the server's
`--default-sampling-preset`; a named preset and explicit fields win over both."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from kiln.api.app import build_app
from kiln.cli import build_parser, config_from_args
from kiln.config import ConfigError, ServerConfig, from_env
from kiln.engine.request import SamplingParams
from tests.api.fake_backend import FakeBackend

MSG = [{"role": "user", "content": "hi"}]
QWEN_GEN = {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repetition_penalty": 1.05,
            "do_sample": True, "max_new_tokens": 99, "eos_token_id": [1, 2]}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": MSG},
    "/v1/completions/batch": {"prompts": [MSG]},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
}


def _client(backend: FakeBackend, **config: Any) -> Iterator[TestClient]:
    app = build_app(ServerConfig(max_body_bytes=64 * 1024, **config), backend)
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


@pytest.fixture
def preset_client(backend: FakeBackend) -> Iterator[TestClient]:
    yield from _client(backend, default_sampling_preset="qwen3-non-thinking-general")


def sampled(client: TestClient, backend: FakeBackend, route: str, **fields: Any) -> SamplingParams:
    r = client.post(route, json={**BODIES[route], **fields})
    assert r.status_code == 200, r.text
    return backend.submitted[-1].sampling


@pytest.mark.parametrize("route", list(BODIES))
def test_no_preset_starts_from_the_models_generation_config(
    client: TestClient, backend: FakeBackend, route: str
) -> None:
    backend.generation_config = dict(QWEN_GEN)
    p = sampled(client, backend, route)
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (0.6, 0.95, 20, 0.0)
    assert (p.repetition_penalty, p.presence_penalty, p.frequency_penalty) == (1.05, 0.0, 0.0)


@pytest.mark.parametrize("route", list(BODIES))
def test_without_a_generation_config_the_defaults_are_neutral(
    client: TestClient, backend: FakeBackend, route: str
) -> None:
    p = sampled(client, backend, route)  # a GGUF has no generation_config.json: {}
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (1.0, 1.0, 0, 0.0)
    assert not p.uses_penalties


def test_fields_the_config_lacks_or_mistypes_stay_neutral(
    client: TestClient, backend: FakeBackend
) -> None:
    backend.generation_config = {"temperature": "hot", "top_k": -1, "top_p": True, "min_p": 0.05}
    p = sampled(client, backend, "/v1/chat/completions")
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (1.0, 1.0, 0, 0.05)


def test_request_fields_and_a_named_preset_win_over_the_model(
    client: TestClient, backend: FakeBackend
) -> None:
    backend.generation_config = dict(QWEN_GEN)
    p = sampled(client, backend, "/v1/chat/completions", temperature=0.9, top_k=-1)
    assert (p.temperature, p.top_k, p.top_p) == (0.9, 0, 0.95)
    p = sampled(client, backend, "/v1/chat/completions", sampling_preset="qwen3-thinking-general")
    assert (p.temperature, p.top_k, p.repetition_penalty, p.presence_penalty) == (1.0, 20, 1.0, 1.5)


@pytest.mark.parametrize("route", list(BODIES))
def test_the_servers_default_preset_applies_when_none_is_named(
    preset_client: TestClient, backend: FakeBackend, route: str
) -> None:
    backend.generation_config = dict(QWEN_GEN)  # the server's preset wins over the model's
    p = sampled(preset_client, backend, route)
    assert (p.temperature, p.top_p, p.top_k, p.presence_penalty) == (0.7, 0.8, 20, 1.5)
    assert p.repetition_penalty == 1.0
    p = sampled(preset_client, backend, route, sampling_preset="qwen3-thinking-coding")
    assert (p.temperature, p.presence_penalty) == (0.6, 0.0)


def test_the_servers_default_preset_does_not_change_greedy(
    preset_client: TestClient, backend: FakeBackend
) -> None:
    p = sampled(preset_client, backend, "/v1/chat/completions", temperature=0)
    assert not p.uses_penalties


def test_an_unknown_default_preset_fails_at_start() -> None:
    with pytest.raises(ConfigError, match="default_sampling_preset"):
        ServerConfig(default_sampling_preset="qwen9-wild")
    assert ServerConfig(default_sampling_preset="qwen3.5-thinking-coding")  # an alias is fine


def test_the_flag_and_the_environment_set_it() -> None:
    args = build_parser().parse_args(["serve", "--default-sampling-preset", "greedy"])
    assert config_from_args(args).default_sampling_preset == "greedy"
    env = from_env({"KILN_DEFAULT_SAMPLING_PRESET": "qwen3-thinking-coding"})
    assert env.default_sampling_preset == "qwen3-thinking-coding"
    assert ServerConfig().default_sampling_preset is None


CHAT_ROUTES = ("/v1/chat/completions", "/v1/completions/batch")


@pytest.mark.parametrize("route", CHAT_ROUTES)
def test_max_new_tokens_is_the_default_max_tokens(
    client: TestClient, backend: FakeBackend, route: str
) -> None:
    """vLLM's `--generation-config auto`: the model's max_new_tokens where the request sets no
    max_tokens (nor max_completion_tokens); the request's own value wins, above it too."""
    assert sampled(client, backend, route).max_tokens == 2048  # no generation config
    backend.generation_config = dict(QWEN_GEN)  # max_new_tokens 99
    assert sampled(client, backend, route).max_tokens == 99
    assert sampled(client, backend, route, max_tokens=None).max_tokens == 99
    assert sampled(client, backend, route, max_tokens=500).max_tokens == 500
    assert sampled(client, backend, route, max_completion_tokens=7).max_tokens == 7


def test_max_new_tokens_on_completions_bounds_vllms_defaults(
    client: TestClient, backend: FakeBackend
) -> None:
    """Completions keep vLLM's 16 for a missing max_tokens (the model's max_new_tokens only when
    it is smaller), and null (the rest of the context) becomes max_new_tokens."""
    route = "/v1/completions"
    room = backend.max_model_len - 3  # the double's "hi": BOS + 2 tokens
    assert sampled(client, backend, route, max_tokens=None).max_tokens == room
    backend.generation_config = {"max_new_tokens": 99}
    body = {"prompt": "hi"}
    assert client.post(route, json=body).status_code == 200
    assert backend.submitted[-1].sampling.max_tokens == 16
    assert sampled(client, backend, route, max_tokens=None).max_tokens == 99
    assert sampled(client, backend, route, max_tokens=300).max_tokens == 300
    backend.generation_config = {"max_new_tokens": 5}
    assert client.post(route, json=body).status_code == 200
    assert backend.submitted[-1].sampling.max_tokens == 5


@pytest.mark.parametrize("config", [{"max_new_tokens": 0}, {"max_new_tokens": -3},
                                    {"max_new_tokens": True}, {"max_new_tokens": "50"},
                                    {"max_new_tokens": 12.5}, {"max_length": 20}])
def test_max_length_and_unusable_max_new_tokens_are_not_defaults(
    client: TestClient, backend: FakeBackend, config: dict[str, Any]
) -> None:
    """max_length counts the prompt too (transformers) and vLLM does not read it; a
    max_new_tokens that is no positive integer is ignored, as the sampling fields are."""
    backend.generation_config = config
    assert sampled(client, backend, "/v1/chat/completions").max_tokens == 2048
