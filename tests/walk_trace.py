"""Trace the repository files one warmed-up non-streaming chat request runs code in, through a
live `kiln serve` on the default model (run by tests/test_walk.py as a subprocess).

Usage: python -m tests.walk_trace PORT. Prints one JSON object: ``files``, the files
(repository-relative paths under kiln/ and kiln_kernels/, generated code included) whose Python
functions were called between the request's start and the moment the process went quiet after
its response, in order of first call; ``moves``, the distinct calls from one of those files into
another (``[caller, callee]``, the caller being the nearest frame in one of them), each counted
once however often the request's steps repeat it; and ``returns``, those of the moves whose
callee the same thread had entered before (the walk comes back to a room it had left). Both are
counted per thread, so how the threads interleave does not change them. The C files the step
runs are not seen by a Python profiler.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import FrameType
from typing import Any

from tests import HANG_S  # bounds on every wait (a hang bound, never a verdict)

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (str(ROOT / "kiln") + os.sep, str(ROOT / "kiln_kernels") + os.sep)
IDENTITY = "kiln-identity"  # the thread kiln.serving hashes the weight files on
QUIET_S = 1.0  # no new file for this long after the response: the walk is over

seen: dict[str, None] = {}
moves: dict[tuple[str, str], None] = {}
returns: dict[tuple[str, str], None] = {}
entered: dict[int, dict[str, None]] = {}  # per thread: the files in order of first call
last_new = [0.0]
active = threading.Event()


def room(frame: FrameType | None) -> str | None:
    """The repository file of the nearest frame from ``frame`` up that runs one (None: none)."""
    while frame is not None:
        f = frame.f_code.co_filename
        if f.startswith(PACKAGES):
            return os.path.relpath(f, ROOT)
        frame = frame.f_back
    return None


def profile(frame: FrameType, event: str, arg: Any) -> None:
    # start-up's weight hashing (kiln.serving, thread "kiln-identity") may still run beside the
    # first requests on a slow or busy machine: it is not the request's walk
    if event == "call" and active.is_set() and threading.current_thread().name != IDENTITY:
        f = frame.f_code.co_filename
        if f.startswith(PACKAGES):
            rel = os.path.relpath(f, ROOT)
            if rel not in seen:
                seen[rel] = None
                last_new[0] = time.monotonic()
            mine = entered.setdefault(threading.get_ident(), {})
            caller = room(frame.f_back)
            if caller is not None and caller != rel and (caller, rel) not in moves:
                moves[(caller, rel)] = None
                last_new[0] = time.monotonic()
                if rel in mine:
                    returns[(caller, rel)] = None
            mine.setdefault(rel, None)


def client(port: int) -> None:
    base = f"http://127.0.0.1:{port}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + 300
    while True:
        try:
            opener.open(f"{base}/health", timeout=5).read()
            break
        except OSError:
            if time.monotonic() > deadline:
                os._exit(3)
            time.sleep(0.05)
    model = json.loads(opener.open(f"{base}/v1/models", timeout=HANG_S).read())["data"][0]["id"]
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hi"}],
                       "max_tokens": 4}).encode()

    def chat() -> bytes:
        req = urllib.request.Request(f"{base}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
        return bytes(opener.open(req, timeout=HANG_S).read())

    chat()
    chat()  # warmed up: lazy imports and first-use caches are behind us
    active.set()
    last_new[0] = time.monotonic()
    reply = json.loads(chat())
    end = time.monotonic() + HANG_S
    while time.monotonic() - last_new[0] < QUIET_S and time.monotonic() < end:
        time.sleep(0.1)
    active.clear()
    if reply.get("object") != "chat.completion":
        os._exit(4)
    print(json.dumps({"files": list(seen), "moves": [list(m) for m in moves],
                      "returns": [list(r) for r in returns]}), flush=True)
    os._exit(0)


def main() -> None:
    from kiln.cli import main as kiln_main

    port = int(sys.argv[1])
    sys.setprofile(profile)
    threading.setprofile(profile)
    threading.Thread(target=client, args=(port,), daemon=True).start()
    kiln_main(["serve", "--host", "127.0.0.1", "--port", str(port)])


if __name__ == "__main__":
    main()
