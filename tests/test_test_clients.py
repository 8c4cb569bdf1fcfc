"""Every HTTP client the tests build waits on a server with a hang bound, never a speed bound.

httpx's default timeout is 5 s and the OpenAI SDK's is 600 s with two silent retries: on a slow
machine the first failed a test that was only slow (tests/e2e/test_chat_live.py, an 8-request
batch raising httpx.ReadTimeout), and a retry can hide a failure. So every client call or
construction under tests/ (and kiln/testing.py, the servers' start-up helper) that talks to a
server names ``timeout=HANG_S`` (tests/__init__.py), and an OpenAI client also
``max_retries=0``. A client's method call that overrides its timeout must use HANG_S too.

The few deliberate short timeouts are listed in ALLOWED, by file and the call's first line:
each is either the behaviour under test or one attempt of a poll whose loop is itself bounded
by a hang bound of minutes."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HANG = "HANG_S"

# module-level functions: httpx.<verb>(...) and friends
HTTPX_FUNCTIONS = {"get", "post", "put", "patch", "delete", "head", "options", "request", "stream"}
HTTPX_CLIENTS = {"Client", "AsyncClient"}
SDK_CLIENTS = {"OpenAI", "AsyncOpenAI", "AzureOpenAI", "AsyncAzureOpenAI",
               "Anthropic", "AsyncAnthropic"}
# a client's own methods: a timeout given there overrides the client's
CLIENT_METHODS = HTTPX_FUNCTIONS | {"send", "open", "urlopen", "create", "with_options"}

# (file, the call's first line, stripped) -> why its timeout is not HANG_S
ALLOWED: dict[tuple[str, str], str] = {
    ("tests/e2e/test_chat_live.py",
     'httpx.post(live_server.url + "/v1/chat/completions", json=body, timeout=1.5)'):
        "the behaviour under test: a client that gives up (httpx.ReadTimeout) mid-request",
    ("tests/walk_trace.py", 'opener.open(f"{base}/health", timeout=5).read()'):
        "one attempt of the start-up poll for /health; the loop is bounded by a 300 s deadline",
    ("kiln/testing.py", 'with _OPENER.open(url + "/health", timeout=2) as response:'):
        "one attempt of healthy(), polled by wait_healthy until STARTUP_TIMEOUT_S (300 s)",
}


def _name(node: ast.expr) -> str:
    """`a.b.c` for a Name/Attribute chain, '' for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _name(node.value)
        return f"{inner}.{node.attr}" if inner else f"?.{node.attr}"
    if isinstance(node, ast.Call):
        return "?"
    return ""


def _is_hang(node: ast.expr | None) -> bool:
    return node is not None and _name(node).split(".")[-1] == HANG


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _timeout(call: ast.Call, position: int | None) -> ast.expr | None:
    """The call's timeout: its keyword, or its argument at `position` where the API takes one."""
    found = _keyword(call, "timeout")
    if found is None and position is not None and len(call.args) > position:
        found = call.args[position]
    return found


def problems_in(source: str) -> list[tuple[int, str]]:
    """(line, what is wrong) for every client call in `source` without a hang-bound timeout."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        callee = _name(node.func)
        parts = callee.split(".")
        last = parts[-1]
        if callee.startswith("httpx.") and len(parts) == 2 and (
                last in HTTPX_FUNCTIONS or last in HTTPX_CLIENTS):
            position = None
        elif last in SDK_CLIENTS:
            position = None
            retries = _keyword(node, "max_retries")
            if not (isinstance(retries, ast.Constant) and retries.value == 0):
                out.append((node.lineno, f"{callee}(...) without max_retries=0"))
        elif last == "urlopen":
            position = 2
        elif last == "open" and len(parts) > 1 and "opener" in parts[-2].lower():
            position = 2  # an OpenerDirector: open(url, data, timeout)
        elif callee.endswith("create_connection"):
            position = 1
        elif last == "settimeout":
            position = 0
        elif len(parts) > 1 and last in CLIENT_METHODS and _keyword(node, "timeout") is not None:
            position = None  # a per-call override on a client
        else:
            continue
        timeout = _timeout(node, position)
        if timeout is None:
            out.append((node.lineno, f"{callee}(...) without a timeout"))
        elif not _is_hang(timeout):
            out.append((node.lineno, f"{callee}(...) with timeout {ast.unparse(timeout)!r}, "
                                     f"not {HANG}"))
    return sorted(out)


def scanned() -> list[Path]:
    return [*sorted((ROOT / "tests").rglob("*.py")), ROOT / "kiln" / "testing.py"]


def test_every_client_waits_with_a_hang_bound() -> None:
    found: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in scanned():
        rel = path.relative_to(ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for line, why in problems_in(source):
            key = (rel, lines[line - 1].strip())
            if key in ALLOWED:
                used.add(key)
            else:
                found.append(f"{rel}:{line}: {why}")
    assert found == [], "\n".join(found)
    assert sorted(set(ALLOWED) - used) == [], "stale ALLOWED entries"


def test_the_check_catches_what_it_should() -> None:
    bad = "\n".join([
        "httpx.post(u, json=b)",                    # httpx's 5 s default
        "httpx.get(u, timeout=60)",                 # a number a slow machine can reach
        "httpx.AsyncClient(base_url=u)",
        "openai.OpenAI(base_url=u, api_key='x')",   # no timeout, two silent retries
        "OpenAI(base_url=u, timeout=HANG_S)",       # retries
        "urllib.request.urlopen(u)",
        "opener.open(u, None, 5)",
        "socket.create_connection(a, 60)",
        "s.settimeout(10.0)",
        "c.post('/x', json=b, timeout=120)",        # a per-call override of a good client
    ])
    assert sorted({line for line, _ in problems_in(bad)}) == list(range(1, 11))
    good = "\n".join([
        "httpx.post(u, json=b, timeout=HANG_S)",
        "httpx.AsyncClient(base_url=u, timeout=HANG_S)",
        "openai.OpenAI(base_url=u, api_key='x', timeout=HANG_S, max_retries=0)",
        "urlopen(u, timeout=tests.HANG_S)",
        "socket.create_connection(a, HANG_S)",
        "c.post('/x', json=b)",                     # the client's timeout
        "TestClient(app).post('/x', json=b)",       # in-process: no socket, no timeout
        "thread.join(timeout=30)",                  # not a client
    ])
    assert problems_in(good) == []


def test_hang_s_is_defined_once() -> None:
    """One bound, in tests/__init__.py: a module's own HANG_S would pass the check above with any
    value."""
    defined = []
    for path in scanned():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            if any(isinstance(t, ast.Name) and t.id == HANG for t in targets):
                defined.append(path.relative_to(ROOT).as_posix())
    assert defined == ["tests/__init__.py"]
