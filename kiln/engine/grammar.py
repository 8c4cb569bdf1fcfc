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
``t // 32`` set = token ``t`` allowed), one int32 row per constrained row, applied to the logits
by the sampler (kiln_kernels/grammar, as the compute plan's ``grammar_mask`` names).

``start`` syncs the matchers on the engine thread, then fills the masks, inline or (``beside``:
the compute plan's ``grammar_beside_step``, where the model runs on an accelerator) on one worker
thread while the engine thread runs the forward pass (the runner calls it before the model and
waits after). llguidance's mask walk costs ~3-60 us a row for JSON schemas on this VM's 49k
vocabulary, and ~360 us for a bounded repeat such as ``[a-z ]{400}``, whose lexer state is
new at every position.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import llguidance
import numpy

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


def _vocabulary(tokenizer: object) -> Any:
    """The tokenizers library object llguidance reads the vocabulary from (None: none)."""
    return getattr(tokenizer, "backend", None)


def can_drive(tokenizer: object) -> bool:
    """Whether ``tokenizer`` can drive a grammar at all (it exposes its vocabulary)."""
    return _vocabulary(tokenizer) is not None


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
                backend = _vocabulary(self._tokenizer)
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
    """One step's masks: ``bits[j]`` (int32 words) is the mask of step row ``rows[j]`` (only rows
    whose constraint applies now), and request id -> why that row cannot go on (its output left
    the grammar, or nothing is allowed)."""

    rows: tuple[int, ...]
    bits: numpy.ndarray
    errors: dict[str, str] = field(default_factory=dict)


class GrammarRows:
    """The matchers of the constrained requests (engine thread only)."""

    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self.rows: dict[str, _Row] = {}  # the live constrained requests, by id
        self._worker: ThreadPoolExecutor | None = None

    def __len__(self) -> int:
        return len(self.rows)

    def masks(self, seqs: Sequence[ScheduledSeq]) -> RowMasks:
        """The step's masks, computed now."""
        return self.start(seqs).result()

    def start(self, seqs: Sequence[ScheduledSeq], beside: bool = False) -> Future[RowMasks]:
        """The step's masks: the matchers are fed the rows' new output tokens now; the masks are
        filled now or (``beside``) on the worker thread. The matchers must not be touched until
        the future is done."""
        errors: dict[str, str] = {}
        live: list[tuple[int, _Row]] = []
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
            if why is not None:
                errors[s.request_id] = why
            elif row is not None and row.started:
                live.append((i, row))
        ids = [seqs[i].request_id for i, _ in live]
        words = (self.compiler.vocab_size + 31) // 32
        if not (live and beside):
            done: Future[RowMasks] = Future()
            done.set_result(_fill(live, ids, words, errors))
            return done
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="kiln-grammar")
        return self._worker.submit(_fill, live, ids, words, errors)

    def release(self, request_ids: Sequence[str]) -> None:
        """Forget finished requests."""
        for rid in request_ids:
            self.rows.pop(rid, None)

    def _row(self, request_id: str, spec: GrammarSpec) -> _Row:
        row = self.rows.get(request_id)
        if row is None or row.spec != spec:
            row = _Row(spec, self.compiler.matcher(spec.grammar), started=not spec.after)
            self.rows[request_id] = row
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


def _fill(live: list[tuple[int, _Row]], ids: list[str], words: int,
          errors: dict[str, str]) -> RowMasks:
    """The masks of ``live`` rows (step row index, row), each written into its int32 row in
    place by llguidance; a row in error or allowing nothing joins ``errors`` instead."""
    bits = numpy.empty((len(live), words), dtype=numpy.int32)
    keep: list[int] = []
    for j, ((_, row), rid) in enumerate(zip(live, ids, strict=True)):
        out = bits[j]
        row.matcher.unsafe_compute_mask_ptr(out.ctypes.data, out.nbytes)
        if row.matcher.is_error():
            errors[rid] = f"{row.spec.param}: {row.matcher.get_error()}"
        elif not out.any():
            errors[rid] = f"{row.spec.param}: the grammar allows no next token"
        else:
            keep.append(j)
    if len(keep) < len(live):
        bits = bits[keep]
    return RowMasks(tuple(live[j][0] for j in keep), bits, errors)
