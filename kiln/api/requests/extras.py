"""vLLM's logits extras on completions and chat -> SamplingParams fields, checked against the
served vocabulary: ``logit_bias`` (decimal token-ID keys, values clamped to ±100),
``allowed_token_ids``, and ``min_tokens`` (EOS and the stop token IDs cannot be sampled before
it; with stop strings a 400, since those are still matched from the first token),
``bad_words`` (token-id sequences whose last id cannot complete them), and the per-token extras
every generating route shares (``generation_extras``: logprob_token_ids, repetition_detection),
and vLLM's request fields that completions and chat share: ``response_id`` (request_id),
``thinking_tokens`` (thinking_token_budget), ``truncation`` / ``truncate``
(truncate_prompt_tokens, truncation_side); and chat's own: ``chat_turn_fields`` /
``continue_final`` (add_generation_prompt, continue_final_message, echo) and ``reasoning_shown``
(include_reasoning)."""

from __future__ import annotations

import uuid
from typing import Any

from msgspec import UNSET

from kiln.api._generated import wire
from kiln.api.errors import ApiError
from kiln.api.requests.refused import (
    CHAT_UNSUPPORTED,
    OPENAI_CHAT_UNSUPPORTED,
    refuse_unsupported,
    unsupported,
)
from kiln.api.wire_values import ChatRequest, GenRequest, opt
from kiln.engine.repetition import MIN_PATTERN_SIZE, RepetitionDetection
from kiln.text.chat_template import message_content

LOGIT_BIAS_LIMIT = 100.0  # OpenAI's and vLLM's range


def _ids_in_vocab(ids: list[int], vocab: int, param: str, code: str) -> None:
    bad = [t for t in ids if t >= vocab]
    if bad:
        raise ApiError(400, code, f"{param} names token id {bad[0]}, outside the vocabulary "
                                  f"(size {vocab})", param=param)


def check_logprobs(value: Any, limit: int, param: str, code: str) -> None:
    """vLLM's --max-logprobs: asking for more alternatives than the server allows is a 400."""
    if value is not None and value is not UNSET and int(value) > limit:
        raise ApiError(400, code, f"{param} {int(value)} is more than this server's maximum of "
                                  f"{limit} (--max-logprobs)", param=param)


def bad_words_ids(words: Any, tokenizer: Any) -> tuple[tuple[int, ...], ...]:
    """vLLM's tokenization of ``bad_words``: each word (leading spaces stripped) as is, and with
    one leading space when that spelling starts with another token but has as many tokens (the
    word after a space in running text). Words that tokenize to nothing are dropped."""
    out: list[tuple[int, ...]] = []
    for word in words or ():
        bare = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        if not bare:
            continue
        out.append(bare)
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            out.append(spaced)
    return tuple(dict.fromkeys(out))


def logits_extras(req: GenRequest, tokenizer: Any, *, code: str, stop: tuple[str, ...],
                  stop_token_ids: tuple[int, ...], max_tokens: int | None) -> dict[str, Any]:
    vocab = int(tokenizer.vocab_size)
    out: dict[str, Any] = {}
    bias = opt(req.logit_bias)
    if bias:
        pairs = [(int(k), max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(v))))
                 for k, v in bias.items()]
        _ids_in_vocab([t for t, _ in pairs], vocab, "logit_bias", code)
        out["logit_bias"] = tuple(sorted(pairs))
    allowed = opt(req.allowed_token_ids)
    if allowed is not None:
        if not allowed:
            raise ApiError(400, code, "allowed_token_ids must name at least one token",
                           param="allowed_token_ids")
        _ids_in_vocab(list(allowed), vocab, "allowed_token_ids", code)
        out["allowed_token_ids"] = tuple(sorted({int(t) for t in allowed}))
    min_tokens = int(opt(req.min_tokens) or 0)
    if min_tokens:
        if max_tokens is not None and min_tokens > max_tokens:
            raise ApiError(400, code, f"min_tokens ({min_tokens}) must not exceed max_tokens "
                                      f"({max_tokens})", param="min_tokens")
        if stop:
            raise unsupported("min_tokens", "min_tokens with stop strings is not implemented "
                                            "(stop token IDs and EOS are)")
        eos = () if bool(opt(req.ignore_eos)) else tokenizer.eos_token_ids
        out["min_tokens"] = min_tokens
        out["min_tokens_ids"] = tuple(sorted({*eos, *stop_token_ids}))
    words = bad_words_ids(opt(req.bad_words), tokenizer)
    if words:
        _ids_in_vocab([t for w in words for t in w], vocab, "bad_words", code)
        out["bad_words_ids"] = words
    return out


def included_stop(include: bool, finish_reason: str | None, stop_reason: Any,
                  stops: tuple[str, ...]) -> str:
    """include_stop_str_in_output: the stop string (one of ``stops``, the request's) that ended
    the output, to put back at the end of its text ("" when not asked, or when none ended it)."""
    ok = include and finish_reason == "stop" and stop_reason in stops
    return str(stop_reason) if ok else ""


def repetition_detection(req: GenRequest, code: str) -> RepetitionDetection | None:
    """vLLM's repetition_detection object -> the engine's rule; null is off. An object that
    would detect nothing (max_pattern_size < 1, min_count < 2, min_pattern_size above
    max_pattern_size) is a 400, never accepted and ignored."""
    given = opt(req.repetition_detection)
    if given is None:
        return None
    values = {}
    for key in ("max_pattern_size", "min_pattern_size", "min_count"):
        v = given.get(key, 0)
        if isinstance(v, float) and v.is_integer():  # JSON Schema's integers include 2.0
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ApiError(400, code, f"repetition_detection.{key} must be a non-negative "
                                      "integer", param="repetition_detection")
        values[key] = v
    try:
        return RepetitionDetection(values["max_pattern_size"], values["min_count"],
                                   max(MIN_PATTERN_SIZE, values["min_pattern_size"]))
    except ValueError as exc:
        raise ApiError(400, code, f"repetition_detection detects nothing: {exc}",
                       param="repetition_detection") from None


MAX_NAMED_LOGPROBS = 256  # logprob_token_ids per request (scoring's top-K bound)


def logprob_token_ids(req: GenRequest, logprobs: int | None, vocab: int, code: str
                      ) -> tuple[int, ...] | None:
    """vLLM's logprob_token_ids: at each generated position these ids' logprobs (in the order
    given, duplicates once) take the place of the top ``logprobs``; it needs logprobs (chat and
    batch: ``logprobs: true``)."""
    given = opt(req.logprob_token_ids)
    if given is None:
        return None
    param = "logprob_token_ids"
    if logprobs is None:
        raise ApiError(400, code, "logprob_token_ids requires logprobs (chat and batch: "
                                  "logprobs: true)", param=param)
    ids = tuple(dict.fromkeys(int(t) for t in given))
    if not given or len(given) > MAX_NAMED_LOGPROBS:  # as the contract counts: duplicates too
        raise ApiError(400, code, f"logprob_token_ids must name 1 to {MAX_NAMED_LOGPROBS} tokens",
                       param=param)
    _ids_in_vocab(list(ids), vocab, param, code)
    return ids


def generation_extras(req: GenRequest, logprobs: int | None, vocab: int, code: str) -> dict[str, Any]:
    """vLLM's per-token extras as SamplingParams fields, one mapping for completions, chat and
    batch: ``logprob_token_ids`` (``logprobs``: the alternatives the route resolved) and
    ``repetition_detection``. (``session_id`` needs none: it is a routing key only,
    kiln/scale/routing.py, and changes nothing in generation.)"""
    return {"logprob_token_ids": logprob_token_ids(req, logprobs, vocab, code),
            "repetition_detection": repetition_detection(req, code)}


def text_extras(req: GenRequest) -> dict[str, Any]:
    """skip_special_tokens and spaces_between_special_tokens (both true unless set false)."""
    return {"skip_special_tokens": opt(req.skip_special_tokens) is not False,
            "spaces_between_special_tokens": opt(req.spaces_between_special_tokens) is not False}


def logprobs_wanted(req: ChatRequest, max_logprobs: int, code: str) -> int | None:
    """Chat's and batch's ``logprobs: true`` + ``top_logprobs`` -> alternatives per token (None:
    no logprobs). top_logprobs needs logprobs: true and is at most ``max_logprobs``."""
    top = req.top_logprobs
    want = req.logprobs is True
    if top not in (UNSET, None) and not want:
        raise ApiError(400, code, "top_logprobs requires logprobs: true", param="top_logprobs")
    check_logprobs(top, max_logprobs, "top_logprobs", code)
    # llama-server's (chat's only): logprobs with n alternatives
    n_probs = opt(req.n_probs) if isinstance(req, wire.ChatCompletionRequest) else None
    if n_probs:
        if want and int(opt(top) or 0) != n_probs:
            raise ApiError(400, code, f"n_probs {n_probs} asks for top_logprobs {n_probs}; the "
                                      f"request's top_logprobs is {opt(top) or 0}: set one",
                           param="n_probs")
        check_logprobs(n_probs, max_logprobs, "n_probs", code)
        return int(n_probs)
    return (0 if top in (UNSET, None) else int(top)) if want else None


def chat_extras(req: ChatRequest, tokenizer: Any, stop: tuple[str, ...], max_tokens: int | None,
                max_logprobs: int, code: str = "chat_invalid_request") -> dict[str, Any]:
    """Chat's and batch's vLLM/OpenAI generation extras as SamplingParams fields (after refusing
    the ones not implemented), the same for every choice or item: logprobs (top_logprobs
    alternatives; top_logprobs needs logprobs: true), stop_token_ids, logit_bias,
    allowed_token_ids, min_tokens (``max_tokens``: the one asked for), bad_words, the text
    extras and ``generation_extras`` (include_stop_str_in_output is the handler's:
    ``included_stop``). ``code``: the route's error code."""
    refuse_unsupported(req, CHAT_UNSUPPORTED + OPENAI_CHAT_UNSUPPORTED)  # batch lacks the latter
    given = opt(req.stop_token_ids)
    stop_ids = tuple(int(t) for t in given or ())
    logprobs = logprobs_wanted(req, max_logprobs, code)
    return {
        "logprobs": logprobs,
        "stop_token_ids": stop_ids,
        **generation_extras(req, logprobs, int(tokenizer.vocab_size), code),
        **logits_extras(req, tokenizer, code=code, stop=stop,
                        stop_token_ids=stop_ids, max_tokens=max_tokens),
        **text_extras(req),
    }


def response_id(req: GenRequest, prefix: str) -> str:
    """vLLM's request_id: the response id is ``<prefix>-<request_id>`` (else a fresh uuid)."""
    rid = opt(req.request_id)
    return f"{prefix}-{rid if rid else uuid.uuid4()}"


def thinking_tokens(req: GenRequest, code: str) -> Any:
    """The thinking-token limit a request asks for, as kiln.text.thinking.resolve takes it (UNSET:
    the server default; None: unlimited; n): Kiln's ``thinking_budget_tokens`` or vLLM's alias
    ``thinking_token_budget`` (-1: unlimited; null: as if absent). Both set to different limits
    is a 400 naming the alias, never one of them silently ignored."""
    # completions carry only vLLM's alias
    kiln = UNSET if isinstance(req, wire.TextCompletionRequest) else req.thinking_budget_tokens
    alias = opt(req.thinking_token_budget)
    if alias is None:
        return kiln
    limit = None if alias < 0 else int(alias)
    if kiln is not UNSET and kiln != limit:
        raise ApiError(400, code, f"thinking_token_budget ({alias}) and thinking_budget_tokens "
                                  f"({kiln}) name different limits; set one",
                       param="thinking_token_budget")
    return limit


def truncate(ids: list[int], keep: int | None, side: str | None) -> list[int]:
    """truncate_prompt_tokens: the last ``keep`` tokens (truncation_side left, the default) or
    the first (right)."""
    if keep is None or len(ids) <= keep:
        return ids
    return ids[:keep] if side == "right" else ids[len(ids) - keep:]


def truncation(req: GenRequest, limit: int, wanted: int | None, code: str) -> int | None:
    """truncate_prompt_tokens -> tokens to keep (None: no truncation); -1 keeps what leaves room
    for max_tokens (``wanted``) in the context window (max_model_len - max_tokens)."""
    t = opt(req.truncate_prompt_tokens)
    if t is None:
        return None
    if t == -1:
        t = limit - int(wanted or 0)
    if t < 1:
        raise ApiError(400, code, f"truncate_prompt_tokens leaves {t} prompt tokens; at least 1 "
                                  "is needed", param="truncate_prompt_tokens")
    return int(t)


def prompt_logprobs_wanted(req: GenRequest, max_logprobs: int, code: str) -> int | None:
    """Chat's and batch's prompt_logprobs beside generation: at most --max-logprobs; with
    ``stream: true`` (chat) a 400 unsupported_parameter."""
    k = opt(req.prompt_logprobs)
    if k is None:
        return None
    check_logprobs(k, max_logprobs, "prompt_logprobs", code)
    if opt(req.stream) is True:
        raise unsupported("prompt_logprobs", "it is implemented for non-streaming requests only")
    return int(k)


def continue_final(prompt_text: str, final: str, code: str) -> str:
    """vLLM's continue_final_message: the rendered conversation cut right after the final
    assistant message's content, so generation continues it (no end-of-turn after it)."""
    at = prompt_text.rfind(final) if final else -1
    if at < 0:
        raise ApiError(400, code, "continue_final_message needs a final assistant message "
                       "with content that the chat template renders verbatim",
                       param="continue_final_message")
    return prompt_text[:at + len(final)]


def chat_turn_fields(req: wire.ChatCompletionRequest, code: str) -> tuple[bool, bool, str]:
    """add_generation_prompt, continue_final_message, and what echo puts before the content."""
    gen = opt(req.add_generation_prompt) is not False
    cont = opt(req.continue_final_message) is True
    last = req.messages[-1]
    final = message_content(last.content) if last.role == "assistant" else None
    if cont and gen:
        raise ApiError(400, code, "continue_final_message: true needs "
                       "add_generation_prompt: false", param="continue_final_message")
    if cont and final is None:
        raise ApiError(400, code, "continue_final_message needs the last message to be the "
                       "assistant's", param="continue_final_message")
    echo = final if opt(req.echo) is True and final is not None else ""
    return gen, cont, echo


def reasoning_shown(req: ChatRequest, default_fold: bool, code: str) -> tuple[bool, bool]:
    """Whether the response carries the reasoning (vLLM's include_reasoning) and whether it is
    also folded into content (fold_reasoning_into_content, else the server's default)."""
    include = opt(req.include_reasoning) is not False
    fold = opt(req.fold_reasoning_into_content) \
        if isinstance(req, wire.ChatCompletionRequest) else None  # batch: the server's
    if not include and fold is True:
        raise ApiError(400, code, "fold_reasoning_into_content: true asks for the reasoning that "
                       "include_reasoning: false leaves out", param="include_reasoning")
    return include, include and (default_fold if fold is None else bool(fold))
