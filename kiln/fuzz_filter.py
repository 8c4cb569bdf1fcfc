"""The residual filter of schemathesis runs: schema-valid request bodies the server rightly
refuses for a rule that the served OpenAPI document cannot state in JSON Schema.

Shared by the in-process run (tests/api/test_schemathesis.py) and the live one
(bench/fuzz_live.py): tests/ and bench/ must not import each other, so it sits in the package
both exercise. Nothing that serves requests imports it (tests/test_import_boundaries.py).

Every other bound the server enforces is in the contract (adapter names, top_logprobs needs
logprobs, tokenize's prompt XOR messages) or in the served document, which carries the loaded
model's vocabulary and the server's --max-logprobs (kiln/api/served_openapi.py). What is left,
each with why JSON Schema cannot say it:

- products and comparisons of two fields: prompts x n <= 64 (batch, completions), best_of >= n,
  min_tokens <= max_tokens, echo / prompt_logprobs position x alternatives caps;
- lengths measured in tokens or bytes of text (a completions prompt under the context);
- fields the server accepts in the schema but refuses with 400 `unsupported_parameter` when set
  to a non-default value (kiln/api/handlers/unsupported.py): the seed keeps them as fields, the
  refusal names the field, which a schema `not` would turn into a generic contract error
  (likewise a `structural_tag` response_format / structured_outputs, and chat's echo /
  return_token_ids beside stream: true);
- a regex, grammar or JSON schema to compile (structured_outputs, response_format
  json_schema): whether it compiles in the server's engine is no JSON Schema property;
- one output constraint per request (response_format beside structured_outputs), and none
  beside ignore_eos: composition rules the contract could state but does not yet;
- logprob_token_ids (needs logprobs; 1..256 distinct IDs in the vocabulary), a
  repetition_detection rule that must detect something, bad_words beside scoring;
- rules that depend on other parts of the request (continue_final_message needs a final
  assistant message, min_tokens with stop strings, the thinking budget's close sequence,
  chat's thinking_token_budget beside thinking_budget_tokens, prompt_logprobs beside stream).

The live run (bench/fuzz_live.py) also drops one documented response, not a body: a 400
`invalid_messages` "Failed to apply chat template" (the model's Jinja template refused the
messages; a template is a program no schema can restate).
"""

from __future__ import annotations

from typing import Any, TypeGuard

from kiln.api.handlers import unsupported

BATCH_CAP = 64  # prompts x n, the server's per-request choice cap


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def semantically_valid(path: str, body: object, *, max_logprobs: int, max_model_len: int
                       ) -> bool:
    """Whether the server accepts a schema-valid ``body`` for ``path`` (see the module doc);
    ``max_logprobs`` is the server's --max-logprobs and ``max_model_len`` the model's context
    length, as the served document's ``x-kiln-served-bounds`` states them."""
    if not isinstance(body, dict):
        return True
    if _structural_tag(body) or _two_constraints(body) or _compiled_program(body):
        return False
    if body.get("structured_outputs") is not None:  # its own rules (one constraint, compilable)
        return False
    if body.get("response_format") not in (None, {"type": "text"}):  # the same
        return False
    if isinstance(body.get("logprob_token_ids"), list):
        return False  # needs logprobs, 1..256 distinct IDs below the vocabulary
    if body.get("repetition_detection") is not None:  # its rule must detect something
        return False
    if path == "/v1/completions/batch":
        if not (_extras_valid(body) and _vllm_fields_valid(body)):  # as on chat
            return False
        prompts, n = body.get("prompts"), body.get("n")
        if isinstance(prompts, list) and _number(n):
            return bool(len(prompts) * n <= BATCH_CAP)
    if path in ("/v1/completions", "/v1/completions/render"):
        return _completion_valid(body, max_logprobs, max_model_len)
    if path in ("/v1/chat/completions", "/v1/chat/completions/render"):
        if any(name in body and body[name] not in unsupported._NEUTRAL[name]
               for name in unsupported.CHAT_FIELDS):
            return False
        if body.get("continue_final_message") is True:  # needs a final assistant message
            return False
        if body.get("stream") is True and (body.get("echo") is True
                                           or body.get("return_token_ids") is True):
            return False
        if not _extras_valid(body):
            return False
        if not _vllm_fields_valid(body):
            return False
    return True


def _vllm_fields_valid(body: dict[str, Any]) -> bool:
    """Chat's and batch's vLLM request fields: truncate_prompt_tokens must leave a prompt,
    prompt_logprobs is for non-streaming requests, and thinking_token_budget beside
    thinking_budget_tokens must name the same limit (-1 as null)."""
    if body.get("truncate_prompt_tokens") is not None:
        return False  # 0, or -1 with a large max_tokens, leaves no prompt: a 400
    if body.get("stream") is True and body.get("prompt_logprobs") is not None:
        return False
    alias = body.get("thinking_token_budget")
    return not (_number(alias) and "thinking_budget_tokens" in body
                and body["thinking_budget_tokens"] != (None if alias < 0 else alias))


def _structural_tag(body: dict[str, Any]) -> bool:
    """A structural_tag constraint (response_format or structured_outputs): the contract lists
    it, the server answers 400 `unsupported_parameter` naming it."""
    fmt, so = body.get("response_format"), body.get("structured_outputs")
    return ((isinstance(fmt, dict) and fmt.get("type") == "structural_tag")
            or (isinstance(so, dict) and so.get("structural_tag") is not None))


def _two_constraints(body: dict[str, Any]) -> bool:
    """response_format (other than text) beside structured_outputs: the server builds at most
    one output constraint per request. Expressible in JSON Schema only as a rule over which
    structured_outputs kinds are non-null; not yet written into the contract."""
    fmt, so = body.get("response_format"), body.get("structured_outputs")
    by_format = isinstance(fmt, dict) and fmt.get("type") not in (None, "text")
    by_outputs = isinstance(so, dict) and any(v is not None for v in so.values())
    # ignore_eos beside any constraint: a finished constraint ends the output with EOS
    return (by_format and by_outputs) or (body.get("ignore_eos") is True
                                          and (by_format or by_outputs))


def _compiled_program(body: dict[str, Any]) -> bool:
    """A structured_outputs regex, grammar or JSON schema, or a response_format json_schema:
    text in another language that the server compiles (a 400 naming the field when it does not
    compile); whether it compiles is not a JSON Schema property."""
    so, fmt = body.get("structured_outputs"), body.get("response_format")
    if isinstance(so, dict) and any(so.get(k) is not None for k in ("regex", "grammar", "json")):
        return True
    return isinstance(fmt, dict) and fmt.get("type") == "json_schema"


def _extras_valid(body: dict[str, Any], completion: bool = False) -> bool:
    """min_tokens <= max_tokens, and no stop strings beside min_tokens."""
    min_tokens, stop = body.get("min_tokens"), body.get("stop")
    # chat: max_tokens wins over max_completion_tokens when both are non-null
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = body.get("max_completion_tokens")
    if max_tokens is None and completion:
        max_tokens = 16  # completions: a missing or null max_tokens is 16 (OpenAI's default)
    if _number(min_tokens) and min_tokens > 0:
        if _number(max_tokens) and min_tokens > max_tokens:
            return False
        if stop:
            return False
    return True


def _completion_valid(body: dict[str, Any], max_logprobs: int, max_model_len: int) -> bool:
    """What /v1/completions rightly refuses beyond the schema: unsupported fields set, the
    prompts x n cap, and the scoring mode's own rules."""
    if any(name in body and body[name] not in unsupported._NEUTRAL[name]
           for name in unsupported.COMPLETION_FIELDS):
        return False
    if body.get("response_format") not in (None, {"type": "text"}):
        return False
    if not _extras_valid(body, completion=True):
        return False
    prompt, k, n = body.get("prompt"), body.get("prompt_logprobs"), body.get("n") or 1
    prompts = [prompt] if isinstance(prompt, str) or (
        isinstance(prompt, list) and all(_number(t) for t in prompt)) else list(prompt or [])
    if not _number(n) or len(prompts) * n > BATCH_CAP:
        return False
    best_of = body.get("best_of")
    if _number(best_of) and (best_of < n or len(prompts) * best_of > BATCH_CAP
                             or (best_of > n and body.get("stream"))):
        return False
    if body.get("truncate_prompt_tokens") is not None:
        return False  # 0, or -1 with a large max_tokens, leaves no prompt: a 400
    if _number(body.get("thinking_token_budget")) and body["thinking_token_budget"] >= 0:
        return False  # the budget's own checks (close sequence vs max_tokens and stops)
    if any(isinstance(p, str) and len(p.encode()) + 1 >= max_model_len for p in prompts):
        return False
    if k is None:
        lp = body.get("logprobs")
        longest = max((len(p) + 1 for p in prompts), default=0)
        return not (body.get("echo") and _number(lp) and longest * (lp + 1) > 65_536)
    if body.get("max_tokens") not in (None, 0, 1):
        return not (_number(k) and k > max_logprobs)  # prompt_logprobs beside generation
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
