"""The grammar stage: constraints compiled by llguidance, one matcher per constrained row, and
the allowed-token bitmask of each constrained row per step (docs/decisions.md, structured
outputs).

``GrammarCompiler`` (one per tokenizer, ``compiler_for``) turns an llguidance grammar into a
matcher; it compiles each grammar text once and hands out copies, and is safe to call from the
handlers' worker threads (to refuse a bad grammar with a 400 before any token) and from the
engine thread. ``GrammarRows`` lives on the engine thread: it keeps the matcher of every
constrained request, feeds it the request's output tokens (the sampled ones and any the thinking
budget forced), and computes the rows' masks. Rows without a constraint never reach it.

No torch here: masks are llguidance's little-endian bitmasks (bit ``t % 32`` of 32-bit word
``t // 32`` set = token ``t`` allowed), applied to the logits by the sampler.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import llguidance

from kiln.engine.outputs import ScheduledSeq
from kiln.engine.request import GrammarSpec
from kiln.text.tokenizer import Tokenizer

CACHE_SIZE = 256  # compiled grammars kept per tokenizer (least recently used dropped)
# llguidance's resource limits, stated here (they are its defaults) so that they hold whatever a
# later llguidance defaults to: they end a runaway compile (or a runaway mask step) with an error,
# which the handlers turn into a 400. initial_lexer_fuel ~ 20 ms of regex analysis.
LIMITS = llguidance.LLParserLimits(
    max_items_in_row=2000, initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000,
    step_max_items=50_000, max_lexer_states=250_000, max_grammar_size=500_000)


class GrammarError(ValueError):
    """A grammar llguidance refuses (invalid, or a keyword it cannot enforce); the message is
    llguidance's."""


class GrammarCompiler:
    """Compiles llguidance grammars against one tokenizer, caching them by their text."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        self._llt: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer (built once, ~0.5 s; EOS = the tokenizer's EOS
        ids, so a finished grammar allows exactly those)."""
        with self._lock:
            if self._llt is None:
                eos = sorted(self._tokenizer.eos_token_ids)
                backend = getattr(self._tokenizer, "backend", None)
                if backend is None:
                    raise GrammarError("this model's tokenizer cannot drive a grammar")
                self._llt = llguidance.LLTokenizer(backend.to_str(), eos_token=eos or None)
            return self._llt

    @property
    def vocab_size(self) -> int:
        return int(self.ll_tokenizer.vocab_size)

    def matcher(self, grammar: str) -> llguidance.LLMatcher:
        """A fresh matcher for ``grammar``; GrammarError when llguidance refuses it."""
        with self._lock:
            cached = self._cache.get(grammar)
            if cached is not None:
                self._cache.move_to_end(grammar)
                return cached.deep_copy()
        compiled = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0,
                                        limits=LIMITS)
        if compiled.is_error():
            raise GrammarError(compiled.get_error())
        with self._lock:
            self._cache[grammar] = compiled
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
            return compiled.deep_copy()

    def check(self, grammar: str) -> None:
        """Compile ``grammar`` (into the cache) or raise GrammarError."""
        self.matcher(grammar)


_COMPILERS: dict[int, tuple[Tokenizer, GrammarCompiler]] = {}
_COMPILERS_LOCK = threading.Lock()


def compiler_for(tokenizer: Tokenizer) -> GrammarCompiler:
    """The one compiler (and grammar cache) of ``tokenizer``."""
    with _COMPILERS_LOCK:
        entry = _COMPILERS.get(id(tokenizer))
        if entry is None or entry[0] is not tokenizer:
            entry = (tokenizer, GrammarCompiler(tokenizer))
            _COMPILERS[id(tokenizer)] = entry
        return entry[1]


@dataclass
class _Row:
    spec: GrammarSpec
    matcher: llguidance.LLMatcher
    consumed: int = 0  # output tokens already looked at
    started: bool = False  # the constraint applies (``after`` was seen, or there is none)


@dataclass(frozen=True)
class RowMasks:
    """One step's masks: row index -> bitmask bytes (only rows whose constraint applies now),
    and request id -> why that row cannot go on (its output left the grammar, or nothing is
    allowed)."""

    masks: dict[int, bytes]
    errors: dict[str, str]


class GrammarRows:
    """The matchers of the constrained requests (engine thread only)."""

    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self._rows: dict[str, _Row] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def masks(self, seqs: Sequence[ScheduledSeq]) -> RowMasks:
        masks: dict[int, bytes] = {}
        errors: dict[str, str] = {}
        for i, s in enumerate(seqs):
            spec = s.sampling.grammar
            if spec is None:
                continue
            row: _Row | None = None
            try:
                row = self._row(s.request_id, spec)
                why = _sync(row, s.output_token_ids)
            except GrammarError as e:
                why = f"{spec.param}: {e}"
            if why is None and row is not None and row.started:
                mask = row.matcher.compute_bitmask()
                if row.matcher.is_error():
                    why = f"{spec.param}: {row.matcher.get_error()}"
                elif not any(mask):
                    why = f"{spec.param}: the grammar allows no next token"
                else:
                    masks[i] = mask
            if why is not None:
                errors[s.request_id] = why
        return RowMasks(masks, errors)

    def release(self, request_ids: Sequence[str]) -> None:
        """Forget finished requests."""
        for rid in request_ids:
            self._rows.pop(rid, None)

    def _row(self, request_id: str, spec: GrammarSpec) -> _Row:
        row = self._rows.get(request_id)
        if row is None or row.spec != spec:
            row = _Row(spec, self.compiler.matcher(spec.grammar), started=not spec.after)
            self._rows[request_id] = row
        return row


def _sync(row: _Row, output: Sequence[int]) -> str | None:
    """Feed ``row`` the output tokens it has not seen; why it failed, or None."""
    if row.consumed > len(output):  # never expected: the output only grows
        return f"{row.spec.param}: the output shrank under the grammar"
    after = row.spec.after
    for k in range(row.consumed, len(output)):
        if not row.started:
            row.started = k + 1 >= len(after) and tuple(output[k + 1 - len(after):k + 1]) == after
            continue
        if not row.matcher.consume_token(output[k]):
            row.consumed = k + 1
            return f"{row.spec.param}: token {output[k]} does not fit the grammar " \
                   f"({row.matcher.get_error()})"
    row.consumed = len(output)
    return None
