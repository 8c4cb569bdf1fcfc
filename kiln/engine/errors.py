"""EngineError: an admission failure, raised synchronously to the caller of add_request."""

from __future__ import annotations

_STATUS = {
    "context_length_exceeded": 400,
    "duplicate_request_id": 400,
    "kv_cache_exhausted": 503,
    "engine_not_running": 503,
}


# A request's own logits processors and constraint left no token to sample: the request cannot
# be served (the handlers answer 400, not a server error).
NOTHING_ALLOWED = ("the request's logits processors (allowed_token_ids, min_tokens, bad_words) "
                   "and constraint allow no token together")
# A row whose logits hold inf or NaN (an overflowing LoRA mix, a broken checkpoint) has no
# distribution to sample: it ends in this error, never in a made-up token.
NON_FINITE = "the model produced non-finite logits (inf or NaN); no token could be sampled"


class EngineError(Exception):
    """``code`` is the wire error code; ``status`` the HTTP status the handler should use."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status if status is not None else _STATUS.get(code, 500)

    def __repr__(self) -> str:
        return f"EngineError({self.code!r}, {self.message!r}, status={self.status})"
