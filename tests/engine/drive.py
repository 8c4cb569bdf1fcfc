"""Drive a scheduler + executor (+ output stage) synchronously, no thread, as the engine's step
does, and collect outputs per request."""

from __future__ import annotations

from kiln.engine.loop import AsyncEngine, Executor
from kiln.engine.output_processor import OutputProcessor
from kiln.engine.outputs import RequestOutput
from kiln.engine.request import Request
from kiln.engine.scheduler import Scheduler
from kiln.model.loader import Loaded


def drive(sched: Scheduler, executor: Executor, reqs: list[Request], max_steps: int = 10_000,
          output: OutputProcessor | None = None, partial: bool = False
          ) -> dict[str, list[RequestOutput]]:
    """Without ``output`` the outputs carry no text (and stop strings are not matched).
    ``partial``: stop after ``max_steps`` steps with requests still running (else an error)."""
    stage = output or OutputProcessor()
    outs: dict[str, list[RequestOutput]] = {}
    for r in reqs:
        first = sched.add_request(r)
        stage.add_request(r)
        for o in stage.process([first] if first is not None else [], sched.finish_stopped):
            outs[r.request_id] = [o]
    for _ in range(max_steps):
        if not sched.has_work:
            return outs
        so = sched.schedule()
        step = sched.update_from_output(so, executor.execute(so))
        for o in stage.process(step, sched.finish_stopped):
            outs.setdefault(o.request_id, []).append(o)
    if partial:
        return outs
    raise AssertionError("requests did not finish")


def token_ids(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def text(outs: list[RequestOutput]) -> str:
    return "".join(o.text_delta for o in outs)


def chat(m: Loaded, content: str) -> list[int]:
    """The token ids of one user turn rendered with the model's chat template."""
    rendered = m.chat_template.render([{"role": "user", "content": content}],
                                      add_generation_prompt=True)
    return m.tokenizer.encode(rendered)


async def collect(eng: AsyncEngine, r: Request) -> list[RequestOutput]:
    """Every output of ``r`` through the threaded engine."""
    return [o async for o in eng.generate(r)]
