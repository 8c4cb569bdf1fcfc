"""The priority policy of the scheduler (vLLM's ``priority``): lower values run first.

Two decisions live here so the scheduler reads as batching alone: where a request joins the
waiting queue, and which running request gives up its blocks when another must grow. With every
request at one level (the default, 0) both reduce to the plain FIFO / newest-first behaviour.
Pure Python, like the scheduler.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Sequence

from kiln.engine.state import RequestState


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
