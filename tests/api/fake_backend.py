"""A test double of the serving backend: deterministic, no model, contract-shaped outputs.

Never used by `kiln serve`; it lets the HTTP edge be tested (and fuzzed) in isolation.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Any

from kiln.adapters import AdapterStore
from kiln.api.backend import PositionScore
from kiln.engine.errors import EngineError
from kiln.engine.outputs import RequestMetrics, RequestOutput, RequestStream, TokenLogprobs
from kiln.engine.request import Request
from kiln.provenance import PolicyIdentity
from kiln.weight_update import WeightUpdate, WeightUpdateError

VOCAB = 1000
EOS = 2


class CharTokenizer:
    """Token id = byte value + 3 (0..2 are specials); decode reverses it."""

    vocab_size = VOCAB
    eos_token_ids = frozenset({EOS})

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = [b + 3 for b in text.encode("utf-8")]
        return [1, *ids] if add_special_tokens else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        data = bytes(i - 3 for i in ids if 3 <= i < 259)
        return data.decode("utf-8", errors="replace")

    def surely_over(self, text: str, tokens: int) -> bool:
        return len(text) > tokens  # one token per byte, at least one per character


class EchoTemplate:
    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[Any] | None = None,
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        if any(m["content"] == "<explode>" for m in messages):
            raise ValueError("template refused content '<explode>'")
        text = "".join(f"<{m['role']}>{m['content']}\n" for m in messages)
        if add_generation_prompt:
            text += "<assistant>"
            if kwargs.get("enable_thinking") is True:
                text += "<think>"
        return text


class FakeBackend:
    model_id = "fake-model"
    aliases = ("fake-alias",)
    created = 1_700_000_000
    max_model_len = 4096

    def __init__(
        self, reply: str = "Hello from the fake engine.", adapter_dir: Path | None = None
    ) -> None:
        self.adapter_store = AdapterStore(adapter_dir) if adapter_dir is not None else None
        self.tokenizer = CharTokenizer()
        self.chat_template = EchoTemplate()
        self.reply = reply
        self.aborted: list[str] = []
        self.stop_message: str | None = None
        self.stop_string: str | None = None  # the reply ends on this (cut) stop string, not EOS
        self.submitted: list[Request] = []
        self.generation_config: dict[str, Any] = {}  # the model's sampling defaults

    def start(self) -> None: ...

    def shutdown(self) -> None: ...

    status = "ok"
    delay = 0.0  # seconds per generated token
    fail = False  # finish every request with finish_reason "error"
    fail_error = "injected failure"  # with this message
    cached_tokens = 0  # prompt tokens each request finds in the prefix cache (at most its prompt)

    plan: dict[str, str] | None = None  # no model: no compute plan unless a test sets one

    def health(self) -> str:
        return self.status

    def compute_plan(self) -> dict[str, str] | None:
        return self.plan

    def stats(self) -> dict[str, float]:
        return {"running": 0.0, "waiting": 0.0, "paused": float(self.paused is not None)}

    paused: str | None = None  # the training routes' pause mode (the double runs nothing)

    async def pause(self, mode: str) -> int:
        self.paused = mode
        return 0

    async def resume(self) -> None:
        self.paused = None

    async def reset_prefix_cache(self) -> int:
        return 0

    async def sleep(self, level: int = 1) -> tuple[int, int]:
        self.paused = "keep"
        return 0, 0

    async def wake_up(self) -> None:
        self.paused = None

    weight_version = "default"
    updates: tuple[tuple[str, str | None, str], ...] = ()  # (model_path, version, mode) each

    async def update_weights(self, model_path: str, version: str | None, mode: str,
                             timeout_s: float) -> WeightUpdate:
        """The double loads nothing: a path named 'missing*' is refused as a bad checkpoint;
        anything else becomes the serving weights' name."""
        if Path(model_path).name.startswith("missing"):
            raise WeightUpdateError(f"model_path {model_path!r} does not exist")
        self.updates = (*self.updates, (model_path, version, mode))
        self.weight_version = version or "sha256:" + hashlib.sha256(model_path.encode()).hexdigest()
        return WeightUpdate(version=self.weight_version, aborted=0, load_s=0.0, total_s=0.0)

    def identity(self) -> dict[str, str]:
        h = "sha256:" + hashlib.sha256(b"fake").hexdigest()
        return {"tokenizer_config_hash": h, "chat_template_hash": h, "model_config_hash": h}

    async def prepare_lora(self, mix: list[tuple[str, float]]) -> tuple[tuple[Any, float], ...]:
        """Adapters are just their names here; a folder named 'broken*' fails to load."""
        for name, _ in mix:
            if name.startswith("broken"):
                raise ValueError(f"{name}: lora_A shape does not match the model")
        return tuple(mix)

    def policy_identity(self, version: str | None = None) -> PolicyIdentity | None:
        h = "sha256:" + hashlib.sha256(b"fake-policy").hexdigest()
        return PolicyIdentity(
            served_model_id=self.model_id, base_model_sha256=h, inference_config_sha256=h,
            implementation="fake/0", vocab_sha256=h, tokenizer_config_sha256=h,
            chat_template_sha256=h, generation_backend="fake",
        )

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def abort_all(self, message: str) -> None:
        self.stop_message = message  # running generators end with "abort" at their next token

    def submit(self, request: Request) -> RequestStream:
        if len(request.prompt_token_ids) >= self.max_model_len:
            raise EngineError("context_length_exceeded", "prompt too long")
        self.submitted.append(request)
        run = self._run(request, self.fail)  # closing it early records the abort
        return RequestStream(request.request_id, run.__anext__, close_source=run.aclose)

    async def _run(self, request: Request, fail: bool) -> AsyncGenerator[RequestOutput, None]:
        reply_ids = self.tokenizer.encode(self.reply)
        budget = request.sampling.max_tokens
        ids = reply_ids[:budget]
        hit_eos = len(reply_ids) < budget or (len(reply_ids) == budget and False)
        metrics = RequestMetrics(arrival_time=request.arrival_time)
        finished = False
        if fail:
            yield self._out(request, [], 0, True, "error", metrics, text=False)
            return
        try:
            for i, tid in enumerate(ids):
                if self.delay:
                    await asyncio.sleep(self.delay)
                if self.stop_message is not None:
                    finished = True
                    out = self._out(request, [], i, True, "abort", metrics, text=False)
                    out.error = self.stop_message
                    yield out
                    return
                last = i == len(ids) - 1
                done = last and not hit_eos
                yield self._out(request, [tid], i + 1, done, "length" if done else None, metrics)
                finished = done
            if not finished:
                reason = "stop" if hit_eos else "length"
                count = len(ids) + (1 if hit_eos else 0)
                new = [EOS] if hit_eos else []
                yield self._out(request, new, count, True, reason, metrics, text=False)
            finished = True
        finally:
            if not finished:
                self.aborted.append(request.request_id)

    def _out(
        self,
        request: Request,
        ids: list[int],
        count: int,
        finished: bool,
        reason: str | None,
        metrics: RequestMetrics,
        text: bool = True,
    ) -> RequestOutput:
        return RequestOutput(
            request_id=request.request_id,
            new_token_ids=ids,
            new_logprobs=[-0.5] * len(ids),
            text_delta=self.tokenizer.decode(ids) if text else "",
            finished=finished,
            finish_reason=reason,
            stop_reason=(self.stop_string or EOS) if reason == "stop" else None,
            num_prompt_tokens=len(request.prompt_token_ids),
            num_output_tokens=count,
            num_cached_tokens=min(self.cached_tokens, len(request.prompt_token_ids)),
            seed=request.sampling.seed or 0,
            metrics=metrics if finished else None,
            error=self.fail_error if reason == "error" else None,
            new_top_logprobs=self._tops(request, ids),
        )

    @staticmethod
    def _tops(request: Request, ids: list[int]) -> list[TokenLogprobs | None]:
        """As the mock scorer: logprob(token) = -token_id / 100; the top ids are 3, 4, ..., or
        the request's logprob_token_ids in their order (as the engine's sampler)."""
        k = request.sampling.logprobs
        if k is None:
            return []
        top = request.sampling.logprob_token_ids or tuple(range(3, 3 + k))
        return [TokenLogprobs(-t / 100, top, tuple(-i / 100 for i in top)) for t in ids]

    async def score(
        self, prompt_ids: list[int], top_k: int, lora: tuple[tuple[Any, float], ...] = ()
    ) -> list[PositionScore]:
        self.scored_lora = lora
        out = []
        for tid in prompt_ids[1:]:
            top = list(range(top_k))
            out.append(
                PositionScore(
                    token_id=tid,
                    logprob=-float(tid),
                    rank=tid + 1,
                    top_ids=top,
                    top_logprobs=[-float(t) for t in top],
                )
            )
        return out
