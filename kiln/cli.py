"""`kiln serve` (also `python -m kiln serve`): flags -> ServerConfig -> app -> uvicorn."""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Sequence

from kiln.config import ConfigError, ServerConfig, from_env
from kiln.engine.config import KV_CACHE_DTYPES


def _bool_flag(parser: argparse.ArgumentParser, name: str, help_text: str) -> None:
    parser.add_argument(f"--{name}", dest=name.replace("-", "_"), action="store_const",
                        const=True, default=None, help=help_text)
    parser.add_argument(f"--no-{name}", dest=name.replace("-", "_"), action="store_const",
                        const=False, help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln", description="Kiln inference server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over HTTP (OpenAI-compatible)")
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port (default 8420)")
    serve.add_argument("--model", help="HF folder or .gguf file (default: SmolLM2-135M-Instruct)")
    serve.add_argument("--served-model-name", help="model id reported by the API")
    serve.add_argument("--model-alias", action="append", default=None,
                       help="extra accepted model id (repeatable)")
    serve.add_argument("--adapter-dir", help="directory of PEFT LoRA adapters (one per subdir)")
    serve.add_argument("--max-lora-slots", type=int,
                       help="adapters resident at once for batched LoRA (default 8)")
    serve.add_argument("--max-cpu-loras", type=int,
                       help="adapters kept loaded in host memory, least recently used dropped "
                            "first (default 32)")
    serve.add_argument("--chat-template", help="Jinja chat template file overriding the model's")
    serve.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    serve.add_argument("--device", help="torch device (default: cuda if available, else cpu)")
    serve.add_argument("--max-body-bytes", type=int, help="request body limit (default 8 MiB)")
    serve.add_argument("--max-model-len", type=int, help="context window cap")
    serve.add_argument("--kv-memory-mb", type=int, help="KV cache size in MiB (default 512)")
    serve.add_argument("--kv-cache-dtype", choices=list(KV_CACHE_DTYPES),
                       help="K/V element type: auto (the model's dtype, exact; default) or "
                            "float16 (CPU only: half the memory and bytes per step, K/V "
                            "rounded to half precision)")
    serve.add_argument("--block-size", type=int, help="KV block size in tokens (default 16)")
    serve.add_argument("--max-num-seqs", type=int, help="max running sequences (default 64)")
    serve.add_argument("--max-num-batched-tokens", type=int,
                       help="token budget per engine step (default 512)")
    serve.add_argument("--max-prefill-tokens-while-decoding", type=int,
                       help="prefill tokens per step while streams decode (default 8)")
    serve.add_argument("--prefill-cap-context", type=int,
                       help="while streams decode, a prefill chunk after c context tokens is "
                            "capped at cap * S / (S + c) (default S = 1024)")
    _bool_flag(serve, "enable-prefix-caching", "reuse KV blocks of shared prompt prefixes")
    _bool_flag(serve, "default-thinking-enabled", "enable thinking unless a request says no")
    serve.add_argument("--default-thinking-budget-tokens", type=int)
    serve.add_argument("--default-thinking-budget-ms", type=int)
    _bool_flag(serve, "fold-reasoning-into-content", "also copy reasoning into content")
    serve.add_argument("--log-level", choices=["critical", "error", "warning", "info", "debug"])
    serve.add_argument("--api-key", action="append", default=None,
                       help="require this bearer key on /v1 routes (repeatable; or KILN_API_KEY)")
    _bool_flag(serve, "metrics-require-auth", "require an API key on /metrics too")
    serve.add_argument("--max-waiting-requests", type=int,
                       help="queued requests beyond running ones before 429 (default 256)")
    serve.add_argument("--request-timeout-s", type=float, help="per-request timeout (default 600)")
    serve.add_argument("--drain-timeout-s", type=float,
                       help="on SIGTERM, wait this long for in-flight requests (default 30)")
    serve.add_argument("--header-timeout-s", type=float,
                       help="a request's headers must arrive within this (else 408; default 10)")
    serve.add_argument("--body-timeout-s", type=float,
                       help="a request's body must arrive within this of its headers (else 408; "
                            "default 60)")
    serve.add_argument("--keep-alive-s", type=float,
                       help="close an idle kept-alive connection after this (default 5)")
    serve.add_argument("--max-connections", type=int,
                       help="open connections; one past it gets 503 server_overloaded "
                            "(default 1024)")
    serve.add_argument("--send-timeout-s", type=float,
                       help="abort a connection whose client takes no byte of our output for "
                            "this long (default 60)")
    serve.add_argument("--default-sampling-preset",
                       help="Kiln preset a request starts from when it names none (default: the "
                            "model's generation_config.json, else vLLM's neutral values)")
    serve.add_argument("--max-logprobs", type=int,
                       help="most logprobs (completions) or top_logprobs (chat) a request may ask "
                            "for; more is a 400 (default 20)")
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    base = from_env()
    overrides = {
        k: v
        for k, v in vars(args).items()
        if k not in ("command", "model_alias", "api_key") and v is not None
    }
    if args.model_alias:
        overrides["model_aliases"] = tuple(args.model_alias)
    if args.api_key:
        overrides["api_keys"] = tuple(args.api_key)
    return base.with_overrides(**overrides)


def serve(config: ServerConfig) -> int:
    from kiln.startup import StartupError

    try:
        return _serve(config)
    except StartupError as exc:
        print(f"kiln: {exc}", file=sys.stderr)
        return 2


def _serve(config: ServerConfig) -> int:
    from kiln import startup
    from kiln.api.app import build_app
    from kiln.connections import server_for
    from kiln.drain import DRAIN_MESSAGE
    from kiln.model.loader import ModelNotFoundError
    from kiln.serving import EngineBackend
    from kiln.text.chat_template import ChatTemplateError

    # Checks that need no model first: a port in use or a missing --adapter-dir fails at once.
    startup.check_adapter_dir(config.adapter_dir)
    startup.check_fd_limit(config.max_connections)
    sock = startup.bind_listener(config.host, config.port)
    try:
        backend = EngineBackend.from_config(config)
    except (ModelNotFoundError, OSError, ValueError, KeyError, RuntimeError) as exc:
        # ModelNotFoundError, UnsupportedModelError, WeightLoadError, a broken JSON file, ...
        sock.close()
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        what = f"model {config.model or '(default)'}"
        if isinstance(exc, ChatTemplateError) and config.chat_template:
            what = f"chat template {config.chat_template}"  # the --chat-template file, not the model
        print(f"kiln: cannot load {what}: {message}", file=sys.stderr)
        return 2
    try:
        blocks, block_size, per_block = backend.kv_geometry()
        startup.check_kv_capacity(num_blocks=blocks, block_size=block_size,
                                  bytes_per_block=per_block, max_model_len=backend.max_model_len,
                                  kv_memory_mb=config.kv_memory_mb)
        startup.start_listening(sock, config.host, config.port)
    except startup.StartupError:
        sock.close()
        backend.shutdown()
        raise
    app = build_app(config, backend)
    # What is loaded by now (model, tokenizer, templates, app) lives as long as the server: keep
    # it out of the cyclic collector's full passes. Measured on the default model: a full
    # collection walks ~320,000 objects in 162-169 ms with the GIL held (every stream stalls),
    # and ~0 ms once they are frozen. Python runs one whenever the objects that survived since
    # the last grow past a quarter of the long-lived ones, so a long-running server meets them.
    gc.collect()
    gc.freeze()
    print(f"kiln: serving {backend.model_id} on http://{config.host}:{config.port}", flush=True)
    server = server_for(app, config, on_expiry=lambda: backend.abort_all(DRAIN_MESSAGE))
    server.run(sockets=[sock])
    gc.unfreeze()  # let the interpreter's final collection release them (extension objects too)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"kiln: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        return serve(config)
    return 2
