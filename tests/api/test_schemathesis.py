"""In-process schemathesis run over every contract route (fixed seed, bounded examples, negative
testing on), against the app wired to the engine test double."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, Phase, settings

from kiln.api.app import build_app
from kiln.config import ServerConfig
from tests.api.fake_backend import VOCAB, FakeBackend

APP = build_app(ServerConfig(), FakeBackend(reply="ok"))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def semantically_valid(path: str, body: object) -> bool:
    """Skip bodies that break x-kiln-semantic-constraints JSON Schema cannot express (the server
    rejects them with 400, which schemathesis would count as a valid request refused)."""
    if not isinstance(body, dict):
        return True
    if path == "/v1/completions/batch":
        prompts, n = body.get("prompts"), body.get("n")
        if isinstance(prompts, list) and _number(n):
            return bool(len(prompts) * n <= 64)
    if path == "/v1/completions":
        prompt, k = body.get("prompt"), body.get("prompt_logprobs")
        if isinstance(prompt, list) and any(_number(t) and t >= VOCAB for t in prompt):
            return False
        if isinstance(prompt, str) and len(prompt.encode()) + 1 > 4096:
            return False
        if isinstance(prompt, list | str) and _number(k) and len(prompt) * (k + 1) > 65_536:
            return False
    return True


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],
)
def test_contract_routes(case):  # type: ignore[no-untyped-def]
    if not semantically_valid(case.operation.path, case.body):
        return  # the server rightly answers 400; schemathesis would call that a refusal
    case.call_and_validate()
