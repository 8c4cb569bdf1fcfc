"""The scheduler's priority policy (vLLM's ``priority``: lower values run first), apart so that
the scheduler reads as batching alone: where a request joins the waiting queue, which running
request gives up its blocks when another must grow, and which one a waiting request of higher
priority preempts when it cannot be admitted (vLLM's priority policy). With every request at one
level (the default, 0) they reduce to plain FIFO / newest-first, and a waiting request never
preempts. Pure Python, like the scheduler."""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence

from kiln.engine.outputs import ScheduledSeq
from kiln.engine.request import RequestState


class WaitingQueue(deque[RequestState]):
    """Waiting requests, lower ``priority`` first; FIFO within a level."""

    def enqueue(self, st: RequestState, front: bool) -> None:
        """Queue ``st``; a preempted request (``front``) goes ahead of its level's waiting ones."""
        p = st.request.priority
        if not front and (not self or self[-1].request.priority <= p):
            self.append(st)  # the common case (one level): no scan
            return
        for i, other in enumerate(self):
            q = other.request.priority
            if q > p or (front and q == p):
                self.insert(i, st)
                return
        self.append(st)


def pick_victim(running: Sequence[RequestState], exclude: Collection[str],
                growing: RequestState) -> RequestState | None:
    """The running request to preempt so that ``growing`` can grow: the lowest priority
    (highest number), the newest within it; None when ``growing`` itself ranks lowest."""
    victim: RequestState | None = None
    for st in running:
        if st.request_id not in exclude and (
                victim is None or st.request.priority >= victim.request.priority):
            victim = st
    if victim is not None and growing.request.priority > victim.request.priority:
        return None
    return victim


def admission_victim(running: Sequence[RequestState], waiting: RequestState
                     ) -> RequestState | None:
    """The running request to preempt for ``waiting``, which cannot be admitted (the running set
    is full or KV blocks ran out): of those ranking strictly below it (a higher ``priority``
    value) the lowest, the latest-arrived within it. None when none ranks below: equal
    priorities never preempt each other (FIFO within a level)."""
    p = waiting.request.priority
    lower = [(st.request.priority, st.request.arrival_time, i)
             for i, st in enumerate(running) if st.request.priority > p]
    return running[max(lower)[2]] if lower else None


def unschedule(seqs: list[ScheduledSeq], request_id: str) -> int:
    """Drop ``request_id`` from this step's ``seqs`` (it was just preempted). -> the tokens it
    had in the step (0 when it had none)."""
    kept = [s for s in seqs if s.request_id != request_id]
    freed = sum(s.num_tokens for s in seqs) - sum(s.num_tokens for s in kept)
    seqs[:] = kept
    return freed
