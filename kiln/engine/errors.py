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
# The same under the request's adapter mix: its scales (or the adapters it chose) made the
# numbers overflow, which the base model alone does not; the handlers answer 400 naming the
# field that chose the mix, and the other rows of the step are unaffected.
NON_FINITE_MIX = ("the request's adapter mix made the logits non-finite (inf or NaN); no token "
                  "could be sampled")


def non_finite(lora: object) -> str:
    """The error of a row whose logits are not finite: ``NON_FINITE_MIX`` under an adapter mix
    (``lora`` non-empty), else ``NON_FINITE``."""
    return NON_FINITE_MIX if lora else NON_FINITE


class EngineError(Exception):
    """``code`` is the wire error code; ``status`` the HTTP status the handler should use."""

    def __init__(self, code: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status if status is not None else _STATUS.get(code, 500)

    def __repr__(self) -> str:
        return f"EngineError({self.code!r}, {self.message!r}, status={self.status})"
