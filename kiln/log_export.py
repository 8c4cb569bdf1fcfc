"""`kiln log export`: what was served, as datasets. Reads the request log (`--request-log DIR`,
kiln/request_log.py) and/or the conversations stored under `--data-dir DIR`
(kiln/conversations.py) and writes JSON Lines that the `datasets` library's JSON loader reads:

- ``--format sft``: chat format, one row per answer: ``messages`` (role, content, and
  reasoning_content / tool_calls where the answer had them), then ``source`` and ``id``.
- ``--format distill``: prompt/completion pairs with logprobs, one row per generated answer that
  carried its token ids: ``prompt_messages`` (chat) or ``prompt_text`` (completions),
  ``prompt_token_ids``, ``completion``, ``completion_token_ids``, ``logprobs`` and
  ``top_logprobs`` (the alternatives: token, logprob), ``finish_reason``, ``source``, ``id``.

Rows keep one shape (a field that does not apply is null), so every row loads into one table."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kiln.conversations import ConversationStore
from kiln.database import FILE_NAME, open_database

CHAT_ROUTES = {"/v1/chat/completions"}
TEXT_ROUTES = {"/v1/completions", "/inference/v1/generate"}


def log_lines(folder: Path) -> Iterator[dict[str, Any]]:
    """The request log's lines, oldest file first."""
    for path in sorted(folder.glob("requests-*.jsonl")):
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield json.loads(line)


def _text(content: Any) -> str:
    """A message's content as text (a list of parts: their text joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _prompt_messages(request: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": str(m.get("role", "")), "content": _text(m.get("content"))}
            for m in request.get("messages") or [] if isinstance(m, dict)]


def _choices(line: dict[str, Any]) -> list[dict[str, Any]]:
    """Each choice of a logged response, a stream's deltas gathered into one."""
    response = line.get("response") or {}
    if not line.get("stream"):
        return [c for c in response.get("choices") or [] if isinstance(c, dict)]
    merged: dict[int, dict[str, Any]] = {}
    for event in response.get("events") or []:
        for c in (event.get("choices") or []) if isinstance(event, dict) else []:
            out = merged.setdefault(int(c.get("index", 0)), {
                "message": {"content": "", "reasoning_content": "", "tool_calls": []},
                "text": "", "token_ids": [], "logprobs": {"content": []}})
            delta = c.get("delta") or {}
            out["message"]["content"] += delta.get("content") or ""
            out["message"]["reasoning_content"] += delta.get("reasoning_content") or ""
            for call in delta.get("tool_calls") or []:
                _merge_call(out["message"]["tool_calls"], call)
            out["text"] += c.get("text") or ""
            out["token_ids"] += c.get("token_ids") or []
            lp = c.get("logprobs") or {}
            out["logprobs"]["content"] += lp.get("content") or []
            if c.get("finish_reason"):
                out["finish_reason"] = c["finish_reason"]
    return [merged[i] for i in sorted(merged)]


def _merge_call(calls: list[dict[str, Any]], delta: dict[str, Any]) -> None:
    at = int(delta.get("index", len(calls)))
    while len(calls) <= at:
        calls.append({"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    fn = delta.get("function") or {}
    calls[at]["id"] = delta.get("id") or calls[at]["id"]
    calls[at]["function"]["name"] += fn.get("name") or ""
    calls[at]["function"]["arguments"] += fn.get("arguments") or ""


def _logprobs(choice: dict[str, Any]) -> tuple[list[float] | None, list[Any] | None]:
    content = (choice.get("logprobs") or {}).get("content") or []
    if content:
        return ([float(t["logprob"]) for t in content],
                [[{"token": a["token"], "logprob": a["logprob"]} for a in t.get("top_logprobs") or []]
                 for t in content])
    plain = choice.get("logprobs") or {}  # completions: token_logprobs / top_logprobs
    if plain.get("token_logprobs"):
        return ([float(x) for x in plain["token_logprobs"]],
                [[{"token": k, "logprob": v} for k, v in (top or {}).items()]
                 for top in plain.get("top_logprobs") or []] or None)
    return None, None


def _answer(message: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": _text(message.get("content")),
                           "reasoning_content": message.get("reasoning_content") or None,
                           "tool_calls": message.get("tool_calls") or None}
    return out


def from_log(line: dict[str, Any], fmt: str) -> Iterator[dict[str, Any]]:
    request = line.get("request")
    route = line.get("route")
    if line.get("status") != 200 or not isinstance(request, dict):
        return
    if route not in CHAT_ROUTES | TEXT_ROUTES:
        return
    chat = route in CHAT_ROUTES
    for i, choice in enumerate(_choices(line)):
        rid = f"{line.get('request_id')}:{i}"
        message = choice.get("message") or {}
        if fmt == "sft":
            if chat:
                yield _row_sft([*_prompt_messages(request), _answer(message)], "request_log", rid)
            continue
        token_ids = choice.get("token_ids")
        if not token_ids:
            continue  # a dataset of exact tokens needs them (return_token_ids: true)
        logprobs, top = _logprobs(choice)
        prompt = request.get("prompt")
        yield {
            "prompt_messages": _prompt_messages(request) if chat else None,
            "prompt_text": prompt if isinstance(prompt, str) and not chat else None,
            "prompt_token_ids": (line.get("prompt_token_ids")
                                 or (line.get("response") or {}).get("prompt_token_ids")),
            "completion": _text(message.get("content")) if chat else str(choice.get("text", "")),
            "completion_token_ids": token_ids, "logprobs": logprobs, "top_logprobs": top,
            "finish_reason": choice.get("finish_reason"), "source": "request_log", "id": rid,
        }


def _row_sft(messages: list[dict[str, Any]], source: str, rid: str) -> dict[str, Any]:
    rows = [{"role": m["role"], "content": m["content"],
             "reasoning_content": m.get("reasoning_content") or None,
             "tool_calls": m.get("tool_calls") or None} for m in messages]
    return {"messages": rows, "source": source, "id": rid}


def from_conversations(data_dir: Path, fmt: str) -> Iterator[dict[str, Any]]:
    """The stored conversations: each assistant answer with what came before it."""
    store = ConversationStore(open_database(str(data_dir)))
    for summary in reversed(store.summaries()):  # oldest first
        conv = store.get(summary["id"])
        if conv is None:
            continue
        for i, m in enumerate(conv.messages):
            if m["role"] != "assistant" or (not m["content"] and not m.get("reasoning_content")):
                continue
            rid = f"{conv.id}:{i}"
            before = [{"role": x["role"], "content": x["content"]} for x in conv.messages[:i]]
            meta = m.get("meta") or {}
            if fmt == "sft":
                answer = {**_answer(m), "tool_calls": meta.get("tool_calls") or None}
                yield _row_sft([*before, answer], "conversation", rid)
            elif meta.get("token_ids"):
                lps = meta.get("logprobs") or []  # the page's record: t, p, top
                yield {
                    "prompt_messages": before, "prompt_text": None,
                    "prompt_token_ids": (meta.get("server") or {}).get("prompt_token_ids"),
                    "completion": m["content"], "completion_token_ids": meta["token_ids"],
                    "logprobs": [x["p"] for x in lps] or None,
                    "top_logprobs": [[{"token": t, "logprob": p} for t, p in x.get("top") or []]
                                     for x in lps] or None,
                    "finish_reason": meta.get("finish_reason"), "source": "conversation",
                    "id": rid,
                }


def export(fmt: str, request_log: Path | None, data_dir: Path | None) -> Iterator[dict[str, Any]]:
    if request_log is not None:
        for line in log_lines(request_log):
            yield from from_log(line, fmt)
    if data_dir is not None:
        yield from from_conversations(data_dir, fmt)


def add_parser(sub: Any) -> None:
    """`kiln log export` on the CLI's subcommands."""
    log = sub.add_parser("log", help="what the server recorded").add_subparsers(
        dest="log_command", required=True)
    p = log.add_parser("export", help="the request log and stored conversations as datasets "
                                      "(JSON Lines)")
    p.add_argument("--request-log", type=Path, help="a --request-log directory")
    p.add_argument("--data-dir", type=Path, help="a --data-dir directory (its conversations)")
    p.add_argument("--format", choices=("sft", "distill"), default="sft",
                   help="sft: chat-format messages; distill: prompt/completion pairs with "
                        "token ids and logprobs (default: sft)")
    p.add_argument("--out", type=Path, help="the JSONL file to write (default: stdout)")


def main(args: argparse.Namespace) -> int:
    if args.request_log is None and args.data_dir is None:
        print("kiln log export: give --request-log DIR and/or --data-dir DIR", file=sys.stderr)
        return 2
    for folder in (args.request_log, args.data_dir):
        if folder is not None and not folder.is_dir():
            print(f"kiln log export: {folder} is not a directory", file=sys.stderr)
            return 2
    if args.data_dir is not None and not (args.data_dir / FILE_NAME).exists():
        print(f"kiln log export: {args.data_dir} holds no {FILE_NAME}", file=sys.stderr)
        return 2
    out = args.out.open("w", encoding="utf-8") if args.out else sys.stdout
    count = 0
    try:
        for row in export(args.format, args.request_log, args.data_dir):
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
            count += 1
    finally:
        if args.out:
            out.close()
    print(f"kiln log export: {count} rows ({args.format})", file=sys.stderr)
    return 0
