"""A request body in, checked against the contract: the edge's one reading stage.

`Contract.read`: the body read within `--max-body-bytes` (415 for a non-JSON content type, 413
past the limit) -> untyped msgspec decode -> jsonschema_rs validation against the contract
(compiled once) -> `msgspec.convert` into the generated struct -> the contract's prose-only
`x-kiln-semantic-constraints` that a definition has (`SEMANTIC_RULES`). Composition-rule failures
(`allOf` branches) get hand-written messages from `RULE_MESSAGES`; a test fails when the contract
has a rule without one, and when it gains a semantic constraint `SEMANTIC_CHECKS` does not name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from typing import Any, TypeVar

import jsonschema_rs
import msgspec
from msgspec import UNSET
from starlette.requests import ClientDisconnect, Request

from kiln.api import _generated
from kiln.api._generated import wire
from kiln.api.errors import ApiError

MAIN_FILE = "kiln-inference-v1.schema.json"
SIBLING_FILES = ("thinking-budget-v1.schema.json",)
API_FILES = ("responses-v1.schema.json", "messages-v1.schema.json",  # their own routes' defs
             "training-v1.schema.json", "conversations-v1.schema.json")

T = TypeVar("T")

MAX_MESSAGE_CHARS = 400  # a violation's message quotes the instance; a huge one is cut in the middle
TOO_DEEP = "request body nests JSON too deeply"
MAX_INTEGRAL_FIXES = 16  # integral floats turned into ints per request body before giving up

# (definition, allOf index) -> (message, param). Keep in step with the contract's allOf rules.
# The branches that include a field group (`{"$ref": "#/$defs/SamplingFields"}`, issue 45) come
# after the rules and are no rule: a violation of a shared field is reported where the group
# defines it (`$defs/SamplingFields/properties/...`), a plain field error.
RULE_MESSAGES: dict[tuple[str, int], tuple[str, str | None]] = {
    ("BatchCompletionRequest", 0): (
        "adapter (a name) cannot be combined with adapters; use one of them",
        "adapters",
    ),
    ("ChatCompletionRequest", 0): (
        "adapter cannot be combined with adapters; use one of them",
        "adapters",
    ),
    ("ChatCompletionRequest", 1): ("n greater than 1 requires stream=false", "n"),
    ("ChatCompletionRequest", 3): ("top_logprobs requires logprobs: true", "top_logprobs"),
    ("BatchCompletionRequest", 1): ("top_logprobs requires logprobs: true", "top_logprobs"),
    ("ChatCompletionRequest", 2): (
        "rollout_provenance=true requires stream=false, n=1, ignore_eos=false and "
        "max_tokens null or at least 1",
        "rollout_provenance",
    ),
    ("TextCompletionRequest", 0): ("logprob_token_ids requires logprobs to be set",
                                   "logprob_token_ids"),
    ("ChatCompletionRequest", 4): ("logprob_token_ids requires logprobs: true",
                                   "logprob_token_ids"),
    ("BatchCompletionRequest", 2): ("logprob_token_ids requires logprobs: true",
                                    "logprob_token_ids"),
}

# A definition's own oneOf / anyOf that states a rule (not a union of types): its message, param.
DEF_RULE_MESSAGES: dict[tuple[str, str], tuple[str, str | None]] = {
    ("TokenizeRequest", "oneOf"): ("give exactly one of prompt and messages", "prompt"),
}


def _param(path: list[str | int]) -> str | None:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


# Conversation arrays that must hold a message: empty or missing is the gateway's `empty_array`.
CONVERSATION_ARRAYS = frozenset({"messages", "prompts"})


# Where the contract's AdapterName rule applies: (definition or None for any, parameter path).
_ADAPTER_PARAM = re.compile(r"adapter|adapters\[\d+\]\.name")


def _adapter_name(definition: str, param: str | None, value: Any) -> Violation | None:
    """A string that breaks the AdapterName rule is `invalid_adapter_name`, as the adapter
    store's own check has always answered (the contract states the same rule)."""
    if not isinstance(value, str) or param is None:
        return None
    if not (_ADAPTER_PARAM.fullmatch(param)
            or (definition == "AdapterLoadRequest" and param == "name")):
        return None
    return Violation(f"{param}: {value[:80]!r} is not a valid adapter name (ASCII letters, "
                     "digits, '_', '-' and single inner dots; at most 255 characters)",
                     param, None, "invalid_adapter_name")


@dataclass(frozen=True)
class Violation:
    message: str
    param: str | None
    rule: tuple[str, int] | None
    code: str | None = None  # a code of its own, else the route's


def _empty_array_param(error: Any) -> str | None:
    """The conversation array that ``error`` finds empty or missing, else None."""
    keyword = list(error.schema_path)[-1] if list(error.schema_path) else None
    path = list(error.instance_path)
    if keyword == "minItems" and error.instance == [] and path and path[0] in CONVERSATION_ARRAYS:
        return _param(path)
    if keyword == "required" and not path:
        missing = re.match(r"^\"(\w+)\" is a required property", str(error.message))
        if missing and missing[1] in CONVERSATION_ARRAYS:
            return missing[1]
    return None


def _load(name: str) -> dict[str, Any]:
    text = resources.files(_generated).joinpath(name).read_text(encoding="utf-8")
    doc: dict[str, Any] = json.loads(text)
    return doc


class Contract:
    """The contract documents and one compiled validator per definition, built on first use."""

    def __init__(self) -> None:
        self.main = _load(MAIN_FILE)
        self.siblings = {name: _load(name) for name in (*SIBLING_FILES, *API_FILES)}
        resources_ = [(self.main["$id"], self.main)]
        resources_ += [(doc["$id"], doc) for doc in self.siblings.values()]
        self._registry = jsonschema_rs.Registry(resources_)
        self._validators: dict[str, Any] = {}
        self._decoder = msgspec.json.Decoder()

    @cached_property
    def definitions(self) -> dict[str, Any]:
        """Every definition a route may name: the main file's and the API files'."""
        defs: dict[str, Any] = dict(self.main["$defs"])
        for name in API_FILES:
            defs.update(self.siblings[name]["$defs"])
        return defs

    @cached_property
    def _home(self) -> dict[str, str]:
        """A definition's file's ``$id``."""
        home = {d: self.main["$id"] for d in self.main["$defs"]}
        for name in API_FILES:
            doc = self.siblings[name]
            home.update({d: doc["$id"] for d in doc["$defs"]})
        return home

    def validator(self, definition: str) -> Any:
        found = self._validators.get(definition)
        if found is None:
            if definition not in self.definitions:
                raise KeyError(f"contract has no definition {definition!r}")
            ref = {"$ref": f"{self._home[definition]}#/$defs/{definition}"}
            found = jsonschema_rs.Draft202012Validator(ref, registry=self._registry)
            self._validators[definition] = found
        return found

    def first_violation(self, definition: str, instance: Any) -> Violation | None:
        validator = self.validator(definition)
        if validator.is_valid(instance):
            return None
        errors = list(validator.iter_errors(instance))
        # Prefer a plain field error; fall back to a composition rule with its own message.
        errors.sort(key=lambda e: "allOf" in list(e.schema_path))
        error = errors[0]
        schema_path = list(error.schema_path)
        instance_path = list(error.instance_path)
        if len(schema_path) >= 4 and schema_path[0] == "$defs" and schema_path[2] == "allOf":
            rule = (str(schema_path[1]), int(schema_path[3]))
            message, param = RULE_MESSAGES.get(rule, (_shorten(error.message), None))
            return Violation(message, param or _param(instance_path), rule)
        if schema_path[:1] == ["$defs"] and tuple(schema_path[1:3]) in DEF_RULE_MESSAGES:
            message, param = DEF_RULE_MESSAGES[(str(schema_path[1]), str(schema_path[2]))]
            return Violation(message, param, None)
        empty = _empty_array_param(error)
        if empty is not None:
            what = "conversation" if empty == "prompts" else "message"  # batch: conversations
            return Violation(f"{empty} must hold at least one {what}", empty, None, "empty_array")
        param = _param(instance_path)
        named = _adapter_name(definition, param, error.instance)
        if named is not None:
            return named
        prefix = f"{param}: " if param else ""
        return Violation(prefix + _shorten(error.message), param, None)

    def decode(self, body: bytes) -> Any:
        try:
            return self._decoder.decode(body)
        except msgspec.DecodeError as exc:
            raise ApiError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None
        except RecursionError:
            raise ApiError(400, "invalid_json", TOO_DEEP) from None

    async def read(self, request: Request, limit: int, definition: str, target: type[T],
                   error_code: str) -> T:
        """The request's body read (``read_json_body``), parsed into ``target`` (``parse``) and
        checked against the definition's semantic rules."""
        req = self.parse(definition, await read_json_body(request, limit), target, error_code)
        check = SEMANTIC_RULES.get(definition)
        if check is not None:
            check(req)
        return req

    def parse(self, definition: str, body: bytes, target: type[T], error_code: str) -> T:
        """Decode, validate against the contract, and convert into the generated struct."""
        data = self.decode(body)
        if not isinstance(data, dict):
            raise ApiError(400, error_code, "request body must be a JSON object")
        try:
            violation = self.first_violation(definition, data)
        except ValueError as exc:  # jsonschema_rs stops descending at its recursion limit
            if "recursion limit" not in str(exc).lower():
                raise
            raise ApiError(400, error_code, TOO_DEEP) from None
        if violation is not None:
            code = violation.code or error_code
            if (violation.code is None and violation.param is not None
                    and violation.param.startswith("adapters")):
                code = "invalid_compose_request"  # Kiln's code for a bad composition
            raise ApiError(400, code, violation.message, param=violation.param)
        for _ in range(MAX_INTEGRAL_FIXES + 1):
            try:
                return msgspec.convert(data, target, strict=False)
            except msgspec.ValidationError as exc:  # the contract accepted it; struct must agree
                if not _integral_float_to_int(data, str(exc)):
                    at = _AT.search(str(exc))
                    param = at[1].lstrip(".") or None if at else None
                    raise ApiError(400, error_code, str(exc), param=param) from None
        raise ApiError(400, error_code, "too many integral floats where integers are expected")


_AT = re.compile(r" - at `\$((?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*)`$")
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def _integral_float_to_int(data: Any, message: str) -> bool:
    """JSON Schema's `integer` (and `const: 1`) accept any integral number, 1e16 or 1.0 alike;
    msgspec takes an integral float for an int only up to 2**53, and never for `Literal[1]`.
    When the struct refused such a float, replace it by its int at the path in ``message`` and
    say so; False when the refusal was about something else."""
    m = _AT.search(message)
    if m is None:
        return False
    steps = [(name, int(index) if index else None) for name, index in _STEP.findall(m[1])]
    if not steps:
        return False
    holder = data
    for name, index in steps[:-1]:
        try:
            holder = holder[index] if index is not None else holder[name]
        except (KeyError, IndexError, TypeError):
            return False
    name, index = steps[-1]
    key: Any = index if index is not None else name
    try:
        value = holder[key]
    except (KeyError, IndexError, TypeError):
        return False
    if not (isinstance(value, float) and value.is_integer()):
        return False
    holder[key] = int(value)
    return True


def _shorten(message: str) -> str:
    if len(message) <= MAX_MESSAGE_CHARS:
        return message
    half = MAX_MESSAGE_CHARS // 2
    return f"{message[:half]} ... ({len(message) - 2 * half} characters left out) ... {message[-half:]}"


# -- reading the body ----------------------------------------------------------------------------

JSON_TYPES = ("application/json",)


def _media_type(request: Request) -> str:
    raw = request.headers.get("content-type", "")
    return raw.split(";", 1)[0].strip().lower()


async def read_json_body(request: Request, limit: int) -> bytes:
    """The body's bytes: a JSON content type (415), at most ``limit`` bytes (413), not empty."""
    media = _media_type(request)
    if media not in JSON_TYPES and not media.endswith("+json"):
        shown = media or "none"
        raise ApiError(
            415,
            "unsupported_media_type",
            f"Content-Type must be application/json (got {shown})",
        )
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:  # gone mid-upload: counted as 499 like any disconnect, not a 500
        raise ApiError(499, "client_disconnected", "client closed the connection") from None
    body = b"".join(chunks)
    if not body.strip():
        raise ApiError(400, "invalid_json", "request body is empty; a JSON object is required")
    return body


def _too_large(limit: int) -> ApiError:
    return ApiError(413, "request_too_large", f"request body exceeds the limit of {limit} bytes")


# -- the contract's prose-only rules -------------------------------------------------------------

MAX_BATCH_ITEMS = 64


def _opt(value: Any) -> Any:
    return None if value is UNSET else value


def check_chat(req: wire.ChatCompletionRequest) -> None:
    if req.rollout_provenance is True:
        tools = _opt(req.tools)
        if tools:
            raise ApiError(
                400, "chat_invalid_request",
                "rollout_provenance=true cannot be combined with non-empty tools", param="tools",
            )
        if _opt(req.tool_choice) is not None:
            raise ApiError(
                400, "chat_invalid_request",
                "rollout_provenance=true cannot be combined with tool_choice",
                param="tool_choice",
            )


def check_batch(req: wire.BatchCompletionRequest) -> None:
    n = _opt(req.n) or 1
    total = len(req.prompts) * int(n)
    if not 1 <= total <= MAX_BATCH_ITEMS:
        raise ApiError(
            400, "batch_too_large",
            f"prompts.length * n must be between 1 and {MAX_BATCH_ITEMS}, got {total}",
            param="prompts",
        )


# a definition's semantic checks, each taking that definition's generated struct
SEMANTIC_RULES: dict[str, Callable[[Any], None]] = {
    "ChatCompletionRequest": check_chat, "BatchCompletionRequest": check_batch}

# contract constraint text -> the check (or handler step) that enforces it
SEMANTIC_CHECKS: dict[str, str] = {
    "prompts.length * (n or 1) <= 64": "kiln.api.contract.check_batch",
    "rollout_provenance=true rejects non-empty tools and non-null tool_choice":
        "kiln.api.contract.check_chat",
    "rollout_provenance=true requires the real batching engine and content-addressed "
    "base-policy identity": "kiln.api.requests.rollout.check (501)",
    "the effective max_tokens must fit the active tokenizer's reasoning close sequence when a "
    "thinking budget applies": "kiln.api.requests.prepare.apply_budget",
    "the tokenized prompt is non-empty and has at most min(4096, served context length) tokens":
        "kiln.api.handlers.completions.create",
    "raw token IDs and prompt_logprobs do not exceed the served vocabulary":
        "kiln.api.handlers.completions.create",
    "scored positions * (prompt_logprobs + 1) <= 65536": "kiln.api.handlers.completions.create",
    "real scoring rejects an active LoRA until adapter revision identity can be pinned":
        "docs/decisions.md: scoring runs under the base model or the adapter `model` names; no "
        "server-wide active LoRA to reject",
    "exactly one of prompt and messages": "kiln.api.handlers.tokenizer.tokenize",
    "token IDs are below the vocabulary size": "kiln.api.handlers.tokenizer.detokenize",
    "prompts * n <= 64; a seed field this server does not implement, set to anything but its "
    "default, is a 400 unsupported_parameter":
        "kiln.api.requests.completions_gen.prepare, kiln.api.requests.refused.refuse_unsupported",
}

# response-side invariants: what the server guarantees about what it emits
RESPONSE_INVARIANTS: dict[str, str] = {
    "total_tokens = prompt_tokens + completion_tokens": "every handler builds usage as a sum",
    "serialized object size <= 1048576 bytes": "kiln.provenance.semantic_problems",
    "prompt_token_count <= input_token_ids.length": "kiln.provenance.semantic_problems",
    "action token sequence_index values are strictly increasing and index generated tokens":
        "kiln.provenance.semantic_problems",
    "each action token_id equals input_token_ids[sequence_index]":
        "kiln.provenance.semantic_problems",
    "at least one action token is sampled": "kiln.api.requests.rollout.check (max_tokens)",
    "forced action token IDs belong to sampling.thinking_budget.close_token_ids":
        "kiln.provenance.semantic_problems",
    "sum of UTF-8 stop-sequence bytes <= 16384": "kiln.api.requests.rollout.check",
}


_CONTRACT: Contract | None = None


def contract() -> Contract:
    global _CONTRACT
    if _CONTRACT is None:
        _CONTRACT = Contract()
    return _CONTRACT


def wire_type(name: str) -> type[Any]:
    found: type[Any] = getattr(wire, name)
    return found
