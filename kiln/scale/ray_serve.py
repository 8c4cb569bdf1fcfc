"""Kiln replicas on Ray Serve: one engine per replica, an ingress that keeps streams streaming,
and a request router with prefix and adapter affinity.

    serve run kiln.scale.ray_serve:build num_replicas=2 model=/path/to/model.gguf

Every other argument is a Kiln setting by its `KILN_*` name without the prefix, lower case
(`kv_memory_mb=256`, `adapter_dir=...`), parsed exactly as the environment variable is.

- `KilnReplica` builds the app that `kiln serve` builds and runs it in-process
  (`kiln.scale.asgi_bridge`): the same validation, errors, engine and metrics. Its
  `max_ongoing_requests` is Kiln's own admission bound (`max_num_seqs + max_waiting_requests`),
  so Serve hands requests on instead of queueing them in front of the batcher, and past it the
  replica answers its own 429. Health is the engine's (`check_health`), and a scale-down drains
  what the replica holds for `drain_timeout_s`.
- `KilnIngress` reads the body once, computes the routing key (`kiln.scale.routing`) and
  forwards the request; the response comes back chunk by chunk. A replica lost mid-request is
  that request's error (a 503 envelope, or an SSE error event and `[DONE]`), never a hang.
- `AffinityRouter` sends a key to its rendezvous replica unless that one's queue is longer than
  the shortest by `IMBALANCE`; requests with no key go to the least loaded (Serve's choice
  among equals).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.handle import DeploymentHandle
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from kiln.config import ENV_VARS, ServerConfig, from_env
from kiln.scale.asgi_bridge import Forwarded, Head, InProcessApp
from kiln.scale.routing import rendezvous, routing_key

IMBALANCE = 8  # queued requests past the least loaded replica before affinity gives way
LOST_MESSAGE = "the replica serving this request stopped; send it again"


def config_from_args(args: dict[str, str]) -> ServerConfig:
    """Kiln settings from `serve run` arguments, parsed as their KILN_* variables are."""
    names = {var.removeprefix("KILN_").lower(): var for var, s in ENV_VARS.items()
             if s.owner == "server"}  # the others are not a replica's config
    unknown = sorted(set(args) - set(names))
    if unknown:
        raise ValueError(f"unknown Kiln settings: {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(names))})")
    return from_env({**os.environ, **{names[k]: str(v) for k, v in args.items()}})


def _error_body(message: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": "server_error", "param": None,
                                 "code": "replica_unavailable"}}).encode()


class AffinityRouter(RequestRouter):
    """Rank the rendezvous replica of the request's key first, the rest after it."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None,
                              ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = None
        if pending_request is not None and pending_request.args:
            first = pending_request.args[0]
            key = getattr(first, "routing_key", None)
        if key is None or len(candidate_replicas) == 1:
            return [candidate_replicas]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        preferred = by_id[rendezvous(key, sorted(by_id))]
        cache = self.replica_queue_len_cache
        lengths = {rid: cache.get(r.replica_id) for rid, r in by_id.items()}
        known = [n for n in lengths.values() if n is not None]
        mine = lengths[preferred.replica_id.unique_id]
        if mine is not None and known and mine - min(known) > IMBALANCE:
            return [candidate_replicas]  # too far behind: the least loaded takes it
        return [[preferred], [r for r in candidate_replicas if r is not preferred]]


@serve.deployment(name="kiln", health_check_period_s=5, health_check_timeout_s=60,
                  graceful_shutdown_wait_loop_s=1)
class KilnReplica:
    """One Kiln engine and its app, as `kiln serve` builds them."""

    def __init__(self, config: ServerConfig) -> None:
        from kiln.api.app import build_app
        from kiln.serving import EngineBackend

        self.backend = EngineBackend.from_config(config)
        self.app = InProcessApp(build_app(config, self.backend))
        self._name = f"{os.uname().nodename}:{os.getpid()}".encode()

    async def handle(self, req: Forwarded) -> AsyncIterator[Head | bytes]:
        await self.app.startup()
        async for part in self.app.request(req):
            if isinstance(part, Head):  # which replica answered: for logs, tests and clients
                part = Head(part.status, (*part.headers, (b"x-kiln-replica", self._name)))
            yield part

    async def check_health(self) -> None:
        await self.app.startup()
        status = self.backend.health()
        if status != "ok":
            raise RuntimeError(f"engine {status}")

    def record_routing_stats(self) -> dict[str, float]:
        return {k: float(v) for k, v in self.backend.stats().items()}

    def pid(self) -> int:
        return os.getpid()

    async def __del__(self) -> None:
        await self.app.shutdown()


@serve.deployment(name="kiln-ingress", max_ongoing_requests=10_000)
class KilnIngress:
    """The HTTP entry: forwards each request to a replica and streams its answer back."""

    def __init__(self, replicas: DeploymentHandle[Any]) -> None:
        self.replicas = replicas.options(stream=True, method_name="handle")

    async def __call__(self, request: Request) -> Response:
        body = await request.body()
        headers = tuple((k.lower(), v) for k, v in request.headers.raw)
        path = request.url.path
        fwd = Forwarded(request.method, path, request.url.query.encode(), headers, body,
                        routing_key(path, headers, body))
        parts: Any = self.replicas.remote(fwd)  # a response generator (stream=True)
        try:
            head = await parts.__anext__()
        except Exception:  # the replica died or is gone: this request's error
            return Response(_error_body(LOST_MESSAGE), status_code=503,
                            media_type="application/json", headers={"retry-after": "1"})
        assert isinstance(head, Head)
        kept = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers
                if k.lower() not in (b"content-length", b"transfer-encoding")}
        if not kept.get("content-type", "").startswith("text/event-stream"):
            try:  # a JSON answer is sent whole: read it all, so a loss is still a clean 503
                body = b"".join([c async for c in parts if isinstance(c, bytes)])
            except Exception:  # lost before the end
                return Response(_error_body(LOST_MESSAGE), status_code=503,
                                media_type="application/json", headers={"retry-after": "1"})
            return Response(body, status_code=head.status, headers=kept)

        async def rest() -> AsyncIterator[bytes]:
            try:
                async for chunk in parts:
                    assert isinstance(chunk, bytes)
                    yield chunk
            except Exception:  # lost mid-stream: the stream's own error event
                event = {"error": {"message": LOST_MESSAGE, "type": "server_error",
                                   "param": None, "code": "replica_unavailable"}}
                yield f"data: {json.dumps(event)}\n\ndata: [DONE]\n\n".encode()

        return StreamingResponse(rest(), status_code=head.status, headers=kept)


def deployment(config: ServerConfig, num_replicas: int = 1) -> Any:
    """The bound Serve application: the ingress over ``num_replicas`` Kiln replicas."""
    bound = config.max_num_seqs + config.max_waiting_requests
    replicas = KilnReplica.options(  # type: ignore[attr-defined]  # a serve Deployment
        num_replicas=num_replicas, max_ongoing_requests=bound,
        graceful_shutdown_timeout_s=config.drain_timeout_s,
        request_router_config=RequestRouterConfig(
            request_router_class="kiln.scale.ray_serve:AffinityRouter"),  # type: ignore[arg-type]
        ray_actor_options={"num_cpus": 0},
    ).bind(config)
    ingress: Any = KilnIngress  # a serve Deployment
    return ingress.options(ray_actor_options={"num_cpus": 0}).bind(replicas)


def build(args: dict[str, str]) -> Any:
    """`serve run kiln.scale.ray_serve:build num_replicas=N [kiln settings]`."""
    args = dict(args)
    replicas = int(args.pop("num_replicas", "1"))
    return deployment(config_from_args(args), replicas)
