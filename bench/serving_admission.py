"""Inter-token latency of running streams while a long prompt is admitted (issue 4's goal: p99
<= 3x the streams' median), and a control run of the same streams at the same contexts with no
admission, which separates what the admission costs from what the growing contexts cost."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import time
from typing import Any

import httpx

from bench.serving_client import (
    STREAM_TIMEOUT_S,
    StreamResult,
    chat_body,
    pct,
    stream_chat,
    user_prompt,
)
from kiln.model.loader import LoadedModel


async def decoding_streams(client: httpx.AsyncClient, stop: asyncio.Event
                           ) -> tuple[list[StreamResult], list[asyncio.Task[StreamResult]]]:
    """4 streams (prompts 300..303, up to 1,024 tokens each) once all four have decoded 8 tokens,
    and 0.5 s more; they run until ``stop`` is set."""
    runs = [StreamResult() for _ in range(4)]
    tasks = [asyncio.create_task(stream_chat(client, chat_body(user_prompt(300 + i), 1024),
                                             runs[i], stop)) for i in range(4)]
    deadline = time.perf_counter() + 120
    while min(len(r.arrivals) for r in runs) < 8:  # all four are decoding
        if time.perf_counter() > deadline or any(t.done() for t in tasks):
            raise RuntimeError("the 4 background streams did not start decoding")
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.5)
    return runs, tasks


def long_prompt(loaded: LoadedModel, target: int, seed: int) -> tuple[str, int]:
    """A user message whose rendered chat prompt is about ``target`` tokens (unique words, so the
    prefix cache cannot help)."""
    rng = random.Random(seed)
    words = ["amber", "river", "stone", "lantern", "harbor", "meadow", "copper", "violet",
             "thunder", "orchard", "glacier", "falcon", "cinder", "willow", "quartz", "ember"]
    text = ""
    count = 0
    while count < target:
        text += " ".join(rng.choice(words) for _ in range(50)) + f" {rng.randrange(10**6)}. "
        rendered = loaded.chat_template.render([{"role": "user", "content": text}],
                                               add_generation_prompt=True)
        count = len(loaded.tokenizer.encode(rendered))
    return text, count


async def admission_itl(client: httpx.AsyncClient, loaded: LoadedModel, prompt_tokens: int,
                        ) -> dict[str, Any]:
    """ITLs of 4 decoding streams while one long prompt is admitted (until its first token)."""
    text, n_prompt = long_prompt(loaded, prompt_tokens, seed=int(time.time()))
    stop = asyncio.Event()
    runs, tasks = await decoding_streams(client, stop)
    long_req = StreamResult()
    t_send = time.perf_counter()
    long_task = asyncio.create_task(stream_chat(client, chat_body(text, 1), long_req))
    while not long_req.arrivals:
        if time.perf_counter() - t_send > STREAM_TIMEOUT_S or long_task.done():
            break
        await asyncio.sleep(0.005)
    t_first = long_req.arrivals[0] if long_req.arrivals else time.perf_counter()
    await asyncio.sleep(0.5)
    stop.set()
    await asyncio.wait_for(long_task, STREAM_TIMEOUT_S)
    await asyncio.wait_for(asyncio.gather(*tasks), STREAM_TIMEOUT_S)
    during: list[float] = []
    before: list[float] = []
    for r in runs:
        for a, b in zip(r.arrivals, r.arrivals[1:], strict=False):
            if t_send <= b <= t_first:
                during.append(b - a)
            elif b < t_send:
                before.append(b - a)
    # an ITL interval that straddles the end of the window also belongs to the admission
    for r in runs:
        after = [b - a for a, b in zip(r.arrivals, r.arrivals[1:], strict=False)
                 if a < t_first < b]
        during.extend(after)
    p50, p99 = statistics.median(during), pct(during, 99)
    steady = statistics.median(before) if before else p50
    return {"prompt_tokens": n_prompt, "window_s": t_first - t_send, "itl_count": len(during),
            "itl_p50_ms": 1000 * p50, "itl_p99_ms": 1000 * p99, "itl_max_ms": 1000 * max(during),
            "ratio_p99_p50_window": p99 / p50,
            "itl_p50_before_ms": 1000 * steady, "itl_count_before": len(before),
            # the same streams' own spread with no admission: this run's jitter floor
            "ratio_p99_p50_before": (pct(before, 99) / steady) if before else None,
            "ratio_p99_p50": p99 / steady}


async def matched_control(client: httpx.AsyncClient, per_stream: int) -> dict[str, Any]:
    """The same 4 streams with no long prompt, from the same point (8 tokens + 0.5 s) over as
    many tokens each as they decoded in the admission window: their ITLs at the same contexts.
    The streams' contexts grow during the window, and each decode step reads its rows' whole
    context (46 KB of float32 K/V per token for the default model), so this median, not the
    one before the window, is what the window's steps would cost with no admission at all."""
    stop = asyncio.Event()
    runs, tasks = await decoding_streams(client, stop)
    t0 = time.perf_counter()
    deadline = t0 + STREAM_TIMEOUT_S
    while min(sum(1 for a in r.arrivals if a >= t0) for r in runs) < per_stream:
        if time.perf_counter() > deadline or any(t.done() for t in tasks):
            raise RuntimeError("the control streams stopped before the window's token count")
        await asyncio.sleep(0.02)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), STREAM_TIMEOUT_S)
    itls: list[float] = []
    for r in runs:
        first = next(i for i, a in enumerate(r.arrivals) if a >= t0)
        span = r.arrivals[max(first - 1, 0):first + per_stream]  # the interval across t0 too
        itls.extend(b - a for a, b in itertools.pairwise(span))
    return {"itl_count": len(itls), "itl_p50_ms": 1000 * statistics.median(itls),
            "itl_p99_ms": 1000 * pct(itls, 99)}
