"""In-process schemathesis run over every contract route (fixed seed, bounded examples, negative
testing on), against the app wired to the engine test double."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any, TypeGuard

import schemathesis
from hypothesis import HealthCheck, Phase, settings

from kiln.adapters import InvalidAdapterName, validate_name
from kiln.api.app import build_app
from kiln.api.handlers import unsupported
from kiln.config import ServerConfig
from tests.api.fake_backend import VOCAB, FakeBackend

# The schema is built when the module is imported, so the adapter folder outlives any fixture:
# removed when the test process exits.
_ADAPTERS = Path(tempfile.mkdtemp(prefix="kiln-st-adapters-"))
atexit.register(shutil.rmtree, _ADAPTERS, ignore_errors=True)
for _name in ("style", "math"):
    (_ADAPTERS / _name).mkdir()
    (_ADAPTERS / _name / "adapter_config.json").write_text('{"r": 4, "lora_alpha": 8}')
MAX_LOGPROBS = ServerConfig().max_logprobs
APP = build_app(ServerConfig(), FakeBackend(reply="ok", adapter_dir=_ADAPTERS))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _valid_adapter_name(name: object) -> bool:
    try:
        validate_name(str(name))
    except InvalidAdapterName:
        return False
    return True


def semantically_valid(path: str, body: object, path_params: dict[str, object] | None = None) -> bool:
    """Adapter names must also pass the store's name rules (no separators, traversal, control or
    percent-encoded characters): prose the contract only states in descriptions."""
    if path == "/v1/adapters/{name}" and path_params and "name" in path_params:
        return _valid_adapter_name(path_params["name"])
    if path == "/v1/adapters/load" and isinstance(body, dict) and "name" in body:
        return _valid_adapter_name(body["name"])
    if isinstance(body, dict) and path in ("/v1/chat/completions", "/v1/completions/batch"):
        adapter, adapters = body.get("adapter"), body.get("adapters")
        if isinstance(adapter, str) and adapter and not _valid_adapter_name(adapter):
            return False
        if isinstance(adapters, list) and any(
            isinstance(a, dict) and not _valid_adapter_name(a.get("name", "")) for a in adapters
        ):
            return False
    # Skip bodies that break x-kiln-semantic-constraints JSON Schema cannot express (the server
    # rejects them with 400, which schemathesis would count as a valid request refused).
    if not isinstance(body, dict):
        return True
    if body.get("structured_outputs") is not None:  # its own rules (one constraint, compilable)
        return False
    if body.get("response_format") not in (None, {"type": "text"}):  # the same
        return False
    if path == "/v1/completions/batch":
        prompts, n = body.get("prompts"), body.get("n")
        if not _logprobs_valid(body):
            return False
        if isinstance(prompts, list) and _number(n):
            return bool(len(prompts) * n <= 64)
    if path in ("/v1/completions", "/v1/completions/render"):
        return _completion_valid(body)
    if path == "/tokenize":
        return ("prompt" in body) != ("messages" in body)
    if path == "/detokenize":
        tokens = body.get("tokens")
        return not (isinstance(tokens, list) and any(_number(t) and t >= VOCAB for t in tokens))
    if path in ("/v1/chat/completions", "/v1/chat/completions/render"):
        if any(name in body and body[name] not in unsupported._NEUTRAL[name]
               for name in unsupported.CHAT_FIELDS):
            return False
        if not _logprobs_valid(body):
            return False
        if body.get("continue_final_message") is True:  # needs a final assistant message
            return False
        if body.get("stream") is True and (body.get("echo") is True
                                           or body.get("return_token_ids") is True):
            return False
        if not _extras_valid(body):
            return False
    return True


def _logprobs_valid(body: dict[str, Any]) -> bool:
    """top_logprobs needs logprobs: true; both within the server's --max-logprobs (20)."""
    top = body.get("top_logprobs")
    if top is not None and body.get("logprobs") is not True:
        return False
    return not (_number(top) and top > MAX_LOGPROBS)


def _extras_valid(body: dict[str, Any]) -> bool:
    """logit_bias / allowed_token_ids / logprob_token_ids within the vocabulary; min_tokens <=
    max_tokens and without stop strings."""
    bias, allowed = body.get("logit_bias"), body.get("allowed_token_ids")
    if isinstance(bias, dict) and any(k.isdigit() and int(k) >= VOCAB for k in bias):
        return False
    if isinstance(allowed, list) and any(_number(t) and t >= VOCAB for t in allowed):
        return False
    named = body.get("logprob_token_ids")  # completions: needs logprobs; 1..256 ids in the vocab
    if isinstance(named, list) and all(map(_number, named)) and (
            body.get("logprobs") is None or any(t >= VOCAB for t in named)
            or not 1 <= len(set(map(int, named))) <= 256):
        return False
    min_tokens, stop = body.get("min_tokens"), body.get("stop")
    # chat: max_tokens wins over max_completion_tokens when both are non-null
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_completion_tokens")
    if _number(min_tokens) and min_tokens > 0:
        if _number(max_tokens) and min_tokens > max_tokens:
            return False
        if stop:
            return False
    return True


def _completion_valid(body: dict[str, Any]) -> bool:
    """What /v1/completions rightly refuses beyond the schema: unsupported fields set, the
    prompts x n cap, and the scoring mode's own rules."""
    if any(name in body and body[name] not in unsupported._NEUTRAL[name]
           for name in unsupported.COMPLETION_FIELDS):
        return False
    if body.get("response_format") not in (None, {"type": "text"}):
        return False
    if not _extras_valid(body):
        return False
    if body.get("repetition_detection") is not None:  # its rule must detect something
        return False
    if _number(body.get("logprobs")) and body["logprobs"] > MAX_LOGPROBS:
        return False
    prompt, k, n = body.get("prompt"), body.get("prompt_logprobs"), body.get("n") or 1
    prompts = [prompt] if isinstance(prompt, str) or (
        isinstance(prompt, list) and all(_number(t) for t in prompt)) else list(prompt or [])
    if not _number(n) or len(prompts) * n > 64:
        return False
    best_of = body.get("best_of")
    if _number(best_of) and (best_of < n or len(prompts) * best_of > 64
                             or (best_of > n and body.get("stream"))):
        return False
    if body.get("truncate_prompt_tokens") is not None:
        return False  # 0, or -1 with a large max_tokens, leaves no prompt: a 400
    if _number(body.get("thinking_token_budget")) and body["thinking_token_budget"] >= 0:
        return False  # the budget's own checks (close sequence vs max_tokens and stops)
    flat = [t for p in prompts if isinstance(p, list) for t in p]
    if any(_number(t) and t >= VOCAB for t in flat):
        return False
    if any(isinstance(p, str) and len(p.encode()) + 1 >= 4096 for p in prompts):
        return False
    if any(isinstance(p, str) and not p and body.get("add_special_tokens") is False
           for p in prompts):
        return False
    if k is None:
        lp = body.get("logprobs")
        longest = max((len(p) + 1 for p in prompts), default=0)
        return not (body.get("echo") and _number(lp) and longest * (lp + 1) > 65_536)
    if body.get("max_tokens") not in (None, 0, 1):
        return not (_number(k) and k > MAX_LOGPROBS)  # prompt_logprobs beside generation
    if best_of not in (None, 1):
        return False
    if len(prompts) != 1 or n != 1 or body.get("stream") or any(
            body.get(f) not in (None, False) for f in
            ("echo", "logprobs", "return_token_ids", "return_tokens_as_token_ids",
             "logprob_token_ids")) or body.get("bad_words"):
        return False
    if isinstance(prompt, list | str) and _number(k):
        return not len(prompt) * (k + 1) > 65_536
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
def test_contract_routes(case):
    if not semantically_valid(case.operation.path, case.body, case.path_parameters):
        return  # the server rightly answers 400; schemathesis would call that a refusal
    case.call_and_validate()
