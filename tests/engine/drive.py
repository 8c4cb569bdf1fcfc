"""Drive a scheduler + executor synchronously (no thread) and collect outputs per request."""

from __future__ import annotations

from kiln.engine.loop import Executor
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request
from kiln.engine.scheduler import Scheduler


def drive(sched: Scheduler, executor: Executor, reqs: list[Request], max_steps: int = 10_000,
          ) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    for r in reqs:
        first = sched.add_request(r)
        if first is not None:
            outs[r.request_id] = [first]
    for _ in range(max_steps):
        if not sched.has_work:
            return outs
        so = sched.schedule()
        for o in sched.update_from_output(so, executor.execute(so)):
            outs.setdefault(o.request_id, []).append(o)
    raise AssertionError("requests did not finish")


def token_ids(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def text(outs: list[RequestOutput]) -> str:
    return "".join(o.text_delta for o in outs)
