"""Continuous batching under one token budget per step (pure Python, never imports torch).

``schedule()`` decides what every sequence computes this step: running decodes first (one token
each), then running prefills in chunks, then waiting requests (lower priority first, FIFO
within a level) with prefix-cache hits skipped, all sharing ``max_num_batched_tokens``. When KV
blocks run out, the newest running request of the lowest priority is preempted (blocks freed,
recomputed later); a waiting request that cannot be admitted preempts a running one of strictly
lower priority (vLLM's priority policy). ``update_from_output()`` applies the sampled tokens
(through the request's thinking-budget controller, which may force the close sequence instead),
checks EOS / stop token ids / length and returns one RequestOutput per request that made
progress, without text: detokenization and stop strings are the output stage's
(kiln.engine.output_processor), which ends a request stopped by a string via ``finish_stopped``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Collection, Sequence

from kiln.engine.block_pool import BlockPool
from kiln.engine.config import EngineConfig
from kiln.engine.errors import EngineError
from kiln.engine.lora_mix import AdapterAdmission, LoraMix
from kiln.engine.outputs import (
    ModelRunnerOutput,
    RequestOutput,
    SampledToken,
    ScheduledSeq,
    SchedulerOutput,
    WeightSpan,
)
from kiln.engine.priority import WaitingQueue, admission_victim, pick_victim, unschedule
from kiln.engine.repetition import REPETITION, repeats
from kiln.engine.request import Request, RequestState, Status
from kiln.engine.request_limits import RequestLimits
from kiln.engine.speculative import Speculation

NewTokens = tuple[list[int], list[float], list[bool]]  # ids, behaviour logprobs, forced


def with_tops(out: RequestOutput, samples: Sequence[SampledToken]) -> RequestOutput:
    """``out`` with its new tokens' logprob alternatives (when the request asked for them)."""
    if samples and samples[0].top is not None:
        out.new_top_logprobs = [t.top for t in samples[:len(out.new_token_ids)]]
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Scheduler:
    def __init__(
        self,
        config: EngineConfig,
        num_blocks: int,
        max_model_len: int,
        eos_token_ids: Collection[int] = frozenset(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.block_size = config.block_size
        self.max_model_len = max_model_len
        self.pool = BlockPool(num_blocks, config.block_size, config.enable_prefix_caching)
        self.limits = RequestLimits(config, max_model_len, num_blocks)
        self.eos_token_ids = frozenset(eos_token_ids)
        self._clock = clock
        self._requests: dict[str, RequestState] = {}
        self._waiting = WaitingQueue()
        self._running: list[RequestState] = []
        self.prefix_cache_query_tokens = 0
        self.prefix_cache_hit_tokens = 0
        self.num_preemptions = 0
        # a training loop's pause (vLLM's /pause): "keep" schedules nothing (running requests
        # keep their KV and resume where they were); "wait" admits nothing new while the running
        # requests finish; None: serving
        self.pause_mode: str | None = None
        # the name of the weights serving now (AsyncEngine.update_weights changes it)
        self.weight_version = config.weight_version
        # speculative decoding (kiln.engine.speculative)
        self.speculation = Speculation(config.speculative)

    # -- pause and resume --------------------------------------------------------------------
    def pause(self, mode: str, why: str = "the server was paused (mode abort)"
              ) -> list[RequestOutput]:
        """Pause in ``mode`` (abort | wait | keep); "abort" finishes every request first (their
        outputs returned, ``why`` their error) and then holds new ones like "keep"."""
        out: list[RequestOutput] = []
        if mode == "abort":
            out = self.finish_all("abort", error=f"aborted: {why}")
            mode = "keep"
        if mode not in ("wait", "keep"):
            raise ValueError(f"unknown pause mode {mode!r}")
        self.pause_mode = mode
        return out

    def resume(self) -> None:
        self.pause_mode = None

    def weights_changed(self, version: str) -> int:
        """New weights serve from the next step on, named ``version``: every cached prefix block
        is forgotten (none computed with the old weights is reused), and a running request,
        whose KV the old weights computed, offers no later block to the cache either. -> the
        cached blocks forgotten."""
        self.weight_version = version
        for st in self._running:
            st.cacheable = False
        return self.pool.reset_prefix_cache()

    @property
    def paused(self) -> bool:
        """Nothing runs: paused to keep, or paused to wait with nothing left running."""
        return self.pause_mode == "keep" or (self.pause_mode == "wait" and not self._running)

    # -- admission -------------------------------------------------------------------------
    def check_request(self, req: Request) -> int:
        """Raise EngineError if ``req`` can never run; else return its clamped max_tokens
        (``kiln.engine.request_limits``; any thread may call it)."""
        return self.limits.check(req)

    def check_lora(self, mix: LoraMix) -> None:
        """Raise EngineError (400) if the adapter mix ``mix`` can never run on this engine."""
        self.limits.check_lora(mix)

    def add_request(self, req: Request, seed: int | None = None) -> RequestOutput | None:
        """Queue ``req``; returns its final output at once when it needs no model work."""
        if req.request_id in self._requests:
            raise EngineError("duplicate_request_id", f"Duplicate request id {req.request_id!r}.")
        max_tokens = self.check_request(req)
        if seed is None:
            seed = req.sampling.seed if req.sampling.seed is not None else secrets.randbits(63)
        st = RequestState(req, max_tokens, seed, self.block_size)
        st.metrics.admitted_time = self._clock()
        if max_tokens == 0:
            return self._finish(st, "length")
        self._requests[req.request_id] = st
        self._waiting.enqueue(st, front=False)
        return None

    def abort(self, request_id: str) -> RequestOutput | None:
        st = self._requests.get(request_id)
        if st is None:
            return None
        return self._finish(st, "abort")

    # -- schedule ----------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        if self.pause_mode == "keep":
            return SchedulerOutput(seqs=[], block_size=self.block_size, num_batched_tokens=0,
                                   preempted_ids=[])
        now = self._clock()
        self.speculation.scheduled(now)
        budget = self.config.max_num_batched_tokens
        seqs: list[ScheduledSeq] = []
        scheduled: set[str] = set()
        preempted: list[str] = []
        decodes = [s for s in self._running if s.num_remaining == 1]
        prefills = [s for s in self._running if s.num_remaining != 1]
        capped = False
        # the rows drafts may add this step (kiln.engine.speculative.DRAFT_ROWS)
        room = self.speculation.room(len(decodes))
        if room > 0:  # a draft model drafts for all of them at once
            self.speculation.prepare(decodes, budget, self.max_model_len)
        for i, st in enumerate(decodes + prefills):
            if i == len(decodes) and seqs:  # decodes run this step: keep prefill chunks short
                budget, capped = min(budget, self.config.max_prefill_tokens_while_decoding), True
            if budget == 0:
                break
            if st.status is not Status.RUNNING:
                continue  # preempted earlier in this loop
            n = min(st.num_remaining, budget, self._chunk_cap(st.num_computed_tokens, capped))
            draft = self.speculation.draft(st, min(budget, room + 1), self.max_model_len) \
                if i < len(decodes) and room > 0 else []
            if draft and self._grow(st, st.num_computed_tokens + 1 + len(draft)):
                room -= len(draft)
                seqs.append(st.scheduled(1, is_new=False, now=now, draft=draft))
                scheduled.add(st.request_id)
                budget -= 1 + len(draft)
                continue
            while not self._grow(st, st.num_computed_tokens + n):
                victim = pick_victim(self._running, scheduled | {st.request_id}, st)
                self._preempt(victim or st)
                preempted.append((victim or st).request_id)
                if victim is None:
                    break
            else:
                seqs.append(st.scheduled(n, is_new=False, now=now))
                scheduled.add(st.request_id)
                budget -= n
        if not preempted and self.pause_mode is None:  # paused to wait: nothing new admitted
            if seqs and not prefills:  # only decodes so far: admissions get the short budget
                budget, capped = min(budget, self.config.max_prefill_tokens_while_decoding), True
            self._admit(budget, seqs, now, capped, preempted)
        return SchedulerOutput(
            seqs=seqs,
            block_size=self.block_size,
            num_batched_tokens=sum(s.num_tokens for s in seqs),
            preempted_ids=preempted,
        )

    def _chunk_cap(self, computed: int, capped: bool) -> int:
        """While decodes run, a chunk's attention cost grows with the context before it: cap it
        at max_prefill_tokens_while_decoding * S / (S + computed), S = prefill_cap_context."""
        if not capped:
            return self.config.max_num_batched_tokens
        scale = self.config.prefill_cap_context
        return max(1, self.config.max_prefill_tokens_while_decoding * scale // (scale + computed))

    def _admit(self, budget: int, seqs: list[ScheduledSeq], now: float, capped: bool,
               preempted: list[str]) -> None:
        bs = self.block_size
        inflight: set[int] = set()
        for s in self._running:
            inflight.update(s.block_hashes[s.num_computed_tokens // bs:])
        deferred: list[RequestState] = []
        running_at_start = tuple(self._running)  # the adapter slots' residents, if it needs them
        slots: AdapterAdmission | None = None
        while self._waiting and budget > 0:
            st = self._waiting.popleft()
            if st.request_id in preempted:  # it made room for another this step: not back yet
                self._waiting.appendleft(st)
                break
            if len(self._running) >= self.config.max_num_seqs:
                if (freed := self._preempt_for(st, seqs, preempted)) is None:
                    break
                budget += freed
                continue
            if st.request.lora:  # a base-model request takes no adapter slot
                slots = slots or AdapterAdmission((s.request.lora for s in running_at_start),
                                                  self.config.max_lora_slots)
                if not slots.admits(st.request.lora):
                    deferred.append(st)
                    continue
            max_hit = (st.num_tokens - 1) // bs  # always compute at least the last token
            hits = self.pool.lookup(st.block_hashes[:max_hit], st.all_token_ids)
            if len(hits) < max_hit and st.block_hashes[len(hits)] in inflight:
                deferred.append(st)  # another request is computing this prefix right now
                continue
            cached = len(hits) * bs
            n = min(st.num_tokens - cached, budget, self._chunk_cap(cached, capped))
            need = _cdiv(cached + n, bs) - len(hits)
            if self.pool.num_free_blocks < need + self.pool.num_unreferenced(hits):
                if (freed := self._preempt_for(st, seqs, preempted)) is None:
                    break
                budget += freed
                continue
            self.pool.touch(hits)
            st.block_ids = hits + self.pool.allocate(need)
            st.num_computed_tokens = cached
            st.num_registered_blocks = len(hits)
            if st.num_cached_tokens < 0:
                st.num_cached_tokens = cached
                self.prefix_cache_query_tokens += st.num_tokens
                self.prefix_cache_hit_tokens += cached
            if st.metrics.first_scheduled_time is None:
                st.metrics.first_scheduled_time = now
            st.status = Status.RUNNING
            self._running.append(st)
            if slots is not None:
                slots.add(st.request.lora)
            inflight.update(st.block_hashes[len(hits):])
            seqs.append(st.scheduled(n, is_new=True, now=now))
            budget -= n
        self._waiting.extendleft(reversed(deferred))

    def _preempt_for(self, st: RequestState, seqs: list[ScheduledSeq], preempted: list[str]
                     ) -> int | None:
        """Waiting ``st`` cannot be admitted: put it back at the queue's head and preempt the
        running request that ranks below it (kiln.engine.request), dropping it from this step's
        ``seqs``. -> the step tokens given back; None when none ranks below ``st``."""
        self._waiting.appendleft(st)
        victim = admission_victim(self._running, st)
        if victim is None:
            return None
        self._preempt(victim)
        preempted.append(victim.request_id)
        return unschedule(seqs, victim.request_id)

    def _grow(self, st: RequestState, total_tokens: int) -> bool:
        need = _cdiv(total_tokens, self.block_size) - len(st.block_ids)
        if need <= 0:
            return True
        if self.pool.num_free_blocks < need:
            return False
        st.block_ids.extend(self.pool.allocate(need))
        return True

    def _preempt(self, st: RequestState) -> None:
        self.pool.free(st.block_ids)
        st.block_ids = []
        st.num_computed_tokens = 0
        st.num_registered_blocks = 0
        st.status = Status.WAITING
        st.preempted_since_token = True
        st.metrics.num_preemptions += 1
        self.num_preemptions += 1
        self._running.remove(st)
        self._waiting.enqueue(st, front=True)

    # -- update ------------------------------------------------------------------------------
    def update_from_output(
        self, so: SchedulerOutput, ro: ModelRunnerOutput
    ) -> list[RequestOutput]:
        now = self._clock()
        prefill = so.num_prefill_tokens > 0
        outputs: list[RequestOutput] = []
        for seq in so.seqs:
            st = self._requests.get(seq.request_id)
            if st is None or st.status is not Status.RUNNING:
                continue
            if seq.draft:
                outputs.extend(self._verified(st, seq, ro, now, prefill))
                continue
            st.num_computed_tokens += seq.num_tokens
            self._register_full_blocks(st)
            if not seq.sample:
                continue
            tok = ro.sampled.get(seq.request_id)
            if tok is None:
                why = ro.errors.get(seq.request_id, "the runner sampled no token")
                outputs.append(self._finish(st, "error", error=why))
                continue
            if st.metrics.prefill_end_time is None:
                st.metrics.prefill_end_time = now
            token, logprob, forced = st.accept(tok.token_id, tok.logprob, now * 1000.0)
            st.note_weights(self.weight_version)
            st.metrics.record_step_token(now, prefill, st.preempted_since_token)
            st.preempted_since_token = False
            out = self._on_token(st, ([token], [logprob], [forced]))
            if tok.top is not None:
                out.new_top_logprobs = [None if forced else tok.top]
            outputs.append(out)
        if self.speculation.drafter is not None:  # the draft model's cost gate
            self.speculation.observe(so, sum(len(o.new_token_ids) for o in outputs), now)
        return outputs

    def _verified(self, st: RequestState, seq: ScheduledSeq, ro: ModelRunnerOutput,
                  now: float, prefill: bool) -> list[RequestOutput]:
        """A drafted decode's samples (kiln.engine.speculative): the verified prefix is kept,
        token by token, as plain decoding would have made them (each may end the request); the
        KV of the rejected drafts' positions is left to be written over."""
        samples = ro.verified.get(seq.request_id)
        if samples is None:  # run plainly (the runner dropped the drafts): its first sample
            first = ro.sampled.get(seq.request_id)
            samples = () if first is None else (first,)
            keep = len(samples)
        else:
            keep = self.speculation.kept(st, seq, samples)
        if not samples:
            why = ro.errors.get(seq.request_id, "the runner sampled no token")
            return [self._finish(st, "error", error=why)]
        st.num_computed_tokens += keep  # the last token's and the kept drafts' positions
        self._register_full_blocks(st)
        if st.metrics.prefill_end_time is None:
            st.metrics.prefill_end_time = now
        ids: list[int] = []
        lps: list[float] = []
        forced: list[bool] = []
        for tok in samples[:keep]:
            token, logprob, was_forced = st.accept(tok.token_id, tok.logprob, now * 1000.0)
            st.note_weights(self.weight_version)
            st.metrics.record_step_token(now, prefill, st.preempted_since_token)
            st.preempted_since_token = False
            ids.append(token)
            lps.append(logprob)
            forced.append(was_forced)
            reason, stop_reason = self._stop_reason(st, token)
            if reason is not None:
                return [with_tops(self._finish(st, reason, stop_reason, new=(ids, lps, forced)),
                                  samples)]
        return [with_tops(st.output((ids, lps, forced), None, None, self._clock), samples)]

    def _register_full_blocks(self, st: RequestState) -> None:
        if not st.cacheable:
            return
        full = min(st.num_computed_tokens // self.block_size, len(st.block_hashes))
        for i in range(st.num_registered_blocks, full):
            self.pool.cache_block(st.block_ids[i], st.block_hashes[i], st.parent_hash(i),
                                  st.block_tokens(i))
        st.num_registered_blocks = max(st.num_registered_blocks, full)

    def _on_token(self, st: RequestState, new: NewTokens) -> RequestOutput:
        reason, stop_reason = self._stop_reason(st, new[0][0])
        if reason is None:
            return st.output(new, None, None, self._clock)
        return self._finish(st, reason, stop_reason, new=new)

    def _stop_reason(self, st: RequestState, token_id: int
                     ) -> tuple[str | None, str | int | None]:
        """Whether the output token ``token_id``, just appended, ends ``st``: (finish reason,
        stop reason), or (None, None)."""
        if token_id in self.eos_token_ids and not st.request.sampling.ignore_eos:
            return "stop", None
        if token_id in st.request.sampling.stop_token_ids:
            return "stop", token_id
        if (rule := st.request.sampling.repetition_detection) is not None and repeats(
                st.output_token_ids, rule):
            return "stop", REPETITION
        if len(st.output_token_ids) >= st.max_tokens:
            return "length", None
        return None, None

    # -- finishing ---------------------------------------------------------------------------
    def fail_step(self, so: SchedulerOutput, message: str) -> list[RequestOutput]:
        """The model raised during ``so``: every request in it finishes with an error."""
        outputs: list[RequestOutput] = []
        for seq in so.seqs:
            st = self._requests.get(seq.request_id)
            if st is not None:
                outputs.append(self._finish(st, "error", error=message))
        return outputs

    def finish_stopped(self, request_id: str, drop: int = 0) -> RequestOutput | None:
        """End a request whose text completed a stop string (the output stage found it): its
        blocks are freed; ``drop``: output tokens after the one that completed it, made by a
        verify step (kiln.engine.speculative), forgotten. -> its final output (no new tokens),
        None when it is not here."""
        st = self._requests.get(request_id)
        if st is None:
            return None
        if drop:
            st.drop_tail(drop)
        return self._finish(st, "stop")

    def finish_all(self, reason: str, error: str | None = None) -> list[RequestOutput]:
        return [self._finish(st, reason, error=error) for st in list(self._requests.values())]

    def _finish(
        self,
        st: RequestState,
        reason: str,
        stop_reason: str | int | None = None,
        new: NewTokens = ([], [], []),
        error: str | None = None,
    ) -> RequestOutput:
        if st.block_ids:
            self.pool.free(st.block_ids)
            st.block_ids = []
        self.speculation.forget(st.request_id)
        if st.status is Status.RUNNING:
            self._running.remove(st)
        elif st.status is Status.WAITING and st in self._waiting:
            self._waiting.remove(st)
        st.status = Status.FINISHED
        self._requests.pop(st.request_id, None)
        st.metrics.finalize(self._clock())
        out = st.output(new, reason, stop_reason, self._clock)
        out.error = error
        out.weight_spans = tuple(WeightSpan(*s) for s in st.weight_spans)
        out.weight_version = st.weight_spans[-1][0] if st.weight_spans else self.weight_version
        if st.thinking is not None:
            out.thinking_outcome = st.thinking.outcome(len(st.output_token_ids),
                                                       self._clock() * 1000.0)
        return out

    # -- introspection -------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        if self.pause_mode == "keep":
            return False
        return bool(self._running or (self._waiting and self.pause_mode is None))

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def stats(self) -> dict[str, float]:
        return {
            "running": float(len(self._running)),
            "waiting": float(len(self._waiting)),
            "kv_blocks_total": float(self.pool.num_blocks),
            "kv_blocks_used": float(self.pool.num_used_blocks),
            "kv_blocks_cached": float(self.pool.num_cached_blocks),
            "prefix_cache_query_tokens": float(self.prefix_cache_query_tokens),
            "prefix_cache_hit_tokens": float(self.prefix_cache_hit_tokens),
            "num_preemptions": float(self.num_preemptions),
            "paused": float(self.paused),
            **self.speculation.stats(),
        }
