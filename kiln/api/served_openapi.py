"""The served /openapi.json: the generated document plus the bounds of the loaded model and of
this server's configuration, so that a client (or a fuzzer) that follows it is never refused
for a bound it could not read.

The generated kiln/api/_generated/openapi.json stays model-independent (uint32 token IDs, no
--max-logprobs); at serving time the document states:

- `TokenId.maximum` = the tokenizer's vocabulary size - 1 (completions prompt IDs,
  allowed_token_ids, logprob_token_ids, detokenize tokens) and `logit_bias`'s keys as decimals below it;
- `top_logprobs` and `prompt_logprobs` (chat, batch) and completions `logprobs` at most
  --max-logprobs;
- `x-kiln-served-bounds`: the same figures plus the model's context length and the admission
  gate's capacity, in one place;
- `x-kiln-rules` on each operation: the rules its handler enforces beyond the JSON Schema, as
  data (kiln/api/openapi_rules.py, defined in docs/openapi-extensions.md).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from kiln.api import _generated

# The requests are written flattened (codegen/openapi.py); SamplingFields, the field group they
# include, is the schema /inference/v1/generate's sampling_params.logit_bias points at.
_LOGIT_BIAS = ("ChatCompletionRequest", "BatchCompletionRequest", "TextCompletionRequest",
               "SamplingFields")
_TOP_LOGPROBS = (("ChatCompletionRequest", "top_logprobs"),
                 ("ChatCompletionRequest", "prompt_logprobs"),  # beside generation, as vLLM
                 ("ChatCompletionRequest", "n_probs"),  # llama-server's top_logprobs
                 ("BatchCompletionRequest", "top_logprobs"),
                 ("BatchCompletionRequest", "prompt_logprobs"),
                 ("TextCompletionRequest", "logprobs"))


@lru_cache(maxsize=1)
def _generated_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(
        resources.files(_generated).joinpath("openapi.json").read_bytes())
    return doc


def below(n: int) -> str:
    """A regular expression (ECMA-262 and Python alike) whose full matches are exactly the
    decimal strings, leading zeros allowed, of the integers 0 .. n - 1 (n >= 1)."""
    if n < 1:
        raise ValueError(f"no integer is below {n}")
    top = str(n - 1)
    k = len(top)
    alts: list[str] = []
    if k >= 2:
        alts.append("[0-9]")
    if k >= 3:
        alts.append(f"[1-9][0-9]{{1,{k - 2}}}")
    for i, digit in enumerate(top):  # k-digit numbers sharing top[:i], smaller at position i
        low = 1 if i == 0 and k > 1 else 0
        if int(digit) > low:
            rest = f"[0-9]{{{k - i - 1}}}" if k - i - 1 else ""
            alts.append(f"{top[:i]}[{low}-{int(digit) - 1}]{rest}")
    alts.append(top)
    return "^0*(" + "|".join(alts) + ")$"


@dataclass(frozen=True)
class Bounds:
    """What the served document states beyond the contract: the loaded model's and the server
    configuration's bounds."""

    vocab_size: int
    max_logprobs: int  # --max-logprobs
    max_model_len: int
    capacity: int  # engine requests one request may need at once (--max-num-seqs + waiting)
    model_names: tuple[str, ...]  # the served model's id and aliases
    default_budget: bool  # the server has a default thinking budget
    grammars: bool  # the model's tokenizer can drive a grammar (structured outputs, tool_choice)
    max_new_tokens: int | None  # the model's generation_config default for max_tokens


@lru_cache(maxsize=4)
def served_openapi(bounds: Bounds) -> bytes:
    """The generated document with this server's bounds written in (see the module doc)."""
    from kiln.api.openapi_rules import operation_rules  # the handlers import this module

    doc = copy.deepcopy(_generated_doc())
    schemas = doc["components"]["schemas"]
    schemas["TokenId"]["maximum"] = bounds.vocab_size - 1
    for name in _LOGIT_BIAS:
        bias = schemas[name]["properties"]["logit_bias"]["oneOf"]
        for branch in bias:
            if branch.get("type") == "object":
                branch["propertyNames"] = {"pattern": below(bounds.vocab_size)}
    for name, field in _TOP_LOGPROBS:
        for branch in schemas[name]["properties"][field]["oneOf"]:
            if branch.get("type") == "integer":
                branch["maximum"] = bounds.max_logprobs
    doc["x-kiln-served-bounds"] = {"vocab_size": bounds.vocab_size,
                                   "max_logprobs": bounds.max_logprobs,
                                   "max_model_len": bounds.max_model_len,
                                   "capacity": bounds.capacity}
    for (method, path), rules in operation_rules(bounds).items():
        doc["paths"][path][method.lower()]["x-kiln-rules"] = rules
    return json.dumps(doc, ensure_ascii=False).encode()
