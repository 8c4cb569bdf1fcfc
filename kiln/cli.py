"""`kiln serve` (also `python -m kiln serve`): flags -> ServerConfig -> app -> uvicorn; and
`kiln log export` (kiln/log_export.py), what was served as datasets.

The flags are the settings of ``kiln.config.SETTINGS`` (reference: docs/flags.md)."""

from __future__ import annotations

import argparse
import gc
import socket
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from kiln import log_export
from kiln.config import (
    SETTINGS,
    ConfigError,
    ServerConfig,
    Setting,
    from_env,
    process_settings,
)

if TYPE_CHECKING:
    from kiln.serving import EngineBackend

_TYPES: dict[str, type] = {"int": int, "float": float}


def _add_flag(parser: argparse.ArgumentParser, s: Setting) -> None:
    """The flag of one table setting: ``--name VALUE``, repeatable for a list, and for a boolean
    ``--name`` / ``--no-name`` (the second one unlisted)."""
    assert s.flag is not None and s.dest is not None
    help_text = f"{s.help} (default: {s.default_text})"
    if s.kind == "bool":
        parser.add_argument(s.flag, dest=s.dest, action="store_const", const=True, default=None,
                            help=help_text)
        parser.add_argument(f"--no-{s.flag[2:]}", dest=s.dest, action="store_const",
                            const=False, help=argparse.SUPPRESS)
    elif s.kind == "list":
        parser.add_argument(s.flag, dest=s.dest, action="append", default=None, help=help_text)
    else:
        parser.add_argument(s.flag, dest=s.dest, type=_TYPES.get(s.kind, str),
                            choices=list(s.choices) or None, help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln", description="Kiln inference server")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over HTTP (OpenAI-compatible)")
    for s in SETTINGS:
        if s.flag is not None:
            _add_flag(serve, s)
    log_export.add_parser(sub)
    return parser


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    """The environment's config (``from_env``) with every flag given on the command line over it."""
    overrides: dict[str, object] = {}
    for s in SETTINGS:
        value = getattr(args, s.dest, None) if s.dest else None
        if value is not None:
            overrides[s.field] = tuple(value) if s.kind == "list" else value
    return from_env().with_overrides(**overrides)


def serve(config: ServerConfig) -> int:
    from kiln.startup import StartupError

    # No cyclic collection during start-up: the imports (torch's, where the model needs it) and
    # the load make objects that nearly all live as long as the server, so the collector's
    # passes over them found little to free and cost 0.10-0.16 s of a ~1 s start on the default
    # model with torch (three full passes during the imports alone). The load collects explicitly where it frees
    # (release_freed_heap); _serve turns the collector back on once what it made is frozen.
    # The price: the cyclic garbage the imports leave (~7,000 objects, ~0.7 MB measured on the
    # default install) is frozen with them instead of collected.
    gc.disable()
    try:
        return _serve(config)
    except StartupError as exc:
        print(f"kiln: {exc}", file=sys.stderr)
        return 2
    finally:
        # _serve froze what it imported and loaded; whichever way it ends, the interpreter's
        # final collection (or a caller that goes on, as tests do) may release them again
        gc.unfreeze()
        gc.enable()


def _serve(config: ServerConfig) -> int:
    from kiln.model.checkpoint.locate import model_path
    from kiln.model.native.early_tiles import tiles_will_be_held, tiling_beside

    # The model's matrices are tiled on a thread while the main thread imports the server (and
    # torch, where the model needs it); the loader takes the tiles
    # (kiln/model/native/early_tiles.py).
    held = tiles_will_be_held(config.device, config.dtype, process_settings().quant_kernels)
    with tiling_beside(model_path(config.model) if held else None):
        loaded = _load(config)
    if isinstance(loaded, int):
        return loaded
    sock, backend = loaded
    return _run(config, sock, backend)


def _load(config: ServerConfig) -> int | tuple[socket.socket, EngineBackend]:
    """Imports, the checks, the bound port and the loaded model (or the exit code)."""
    from kiln import startup
    from kiln.model.checkpoint.locate import ModelNotFoundError
    from kiln.serving import EngineBackend
    from kiln.text.chat_template import ChatTemplateError

    # The modules imported by now (with torch, its ~770 among them) live as long as the server:
    # out of the cyclic collector's passes from here on, so that the load's full collection
    # (release_freed_heap) walks the load's objects only (see gc.freeze below).
    gc.freeze()
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
    return sock, backend


def _run(config: ServerConfig, sock: socket.socket, backend: EngineBackend) -> int:
    """The start-up checks that need the model, then serve until shut down."""
    from kiln import resident, startup
    from kiln.api.app import build_app
    from kiln.connections import server_for
    from kiln.drain import DRAIN_MESSAGE

    try:
        blocks, block_size, per_block = backend.kv_geometry()
        startup.check_kv_capacity(num_blocks=blocks, block_size=block_size,
                                  bytes_per_block=per_block, max_model_len=backend.max_model_len,
                                  kv_memory_mb=config.kv_memory_mb)
        if backend.kv_on_demand():
            startup.check_kv_memory(kv_bytes=blocks * per_block,
                                    available=startup.available_memory(),
                                    kv_memory_mb=config.kv_memory_mb,
                                    block_size=block_size, bytes_per_block=per_block)
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
    # The loader ran a full collection at the end of the load (release_freed_heap); what was
    # made since is in the young generations, so they are all that is collected first (a second
    # full pass was 65-75 ms of start-up).
    gc.collect(1)
    gc.freeze()
    gc.enable()
    resident.release_library_pages()  # start-up's library code back to the kernel
    url = f"http://{config.host}:{config.port}"
    print(f"kiln: serving {backend.model_id} on {url} (web UI: open {url}/ui)", flush=True)
    server = server_for(app, config, on_expiry=lambda: backend.abort_all(DRAIN_MESSAGE))
    server.run(sockets=[sock])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "log":
        return log_export.main(args)
    try:
        config = config_from_args(args)
    except ConfigError as exc:
        print(f"kiln: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "serve":
        return serve(config)
    return 2
