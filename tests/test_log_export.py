"""`kiln log export` from stored conversations (the page's records) and from request-log lines
of both shapes (JSON and stream): chat-format rows for SFT, prompt/completion pairs with token
ids and logprobs for distillation, one row shape throughout; bad arguments exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiln.cli import main
from kiln.conversations import ConversationStore
from kiln.database import open_database
from kiln.log_export import from_log

PAGE_ANSWER = {
    "role": "assistant", "content": "Red.", "reasoning_content": "Primary: red, yellow, blue.",
    "meta": {"token_ids": [5, 6], "finish_reason": "stop",
             "logprobs": [{"t": "Red", "p": -0.1, "top": [["Red", -0.1], ["Blue", -2.5]]},
                          {"t": ".", "p": -0.01, "top": [[".", -0.01], ["!", -4.0]]}],
             "server": {"prompt_token_ids": [1, 2, 3]}},
}


def rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_conversations_export_as_sft_and_distill(tmp_path: Path) -> None:
    store = ConversationStore(open_database(str(tmp_path / "data")))
    conv = store.create("c", [{"role": "user", "content": "A color?"}, PAGE_ANSWER,
                              {"role": "user", "content": "Another?"},
                              {"role": "assistant", "content": "Blue."}])
    out = tmp_path / "sft.jsonl"
    assert main(["log", "export", "--data-dir", str(tmp_path / "data"), "--out", str(out)]) == 0
    sft = rows(out)
    assert [r["id"] for r in sft] == [f"{conv.id}:1", f"{conv.id}:3"]
    assert sft[0]["messages"] == [
        {"role": "user", "content": "A color?", "reasoning_content": None, "tool_calls": None},
        {"role": "assistant", "content": "Red.", "reasoning_content": "Primary: red, yellow, blue.",
         "tool_calls": None}]
    assert len(sft[1]["messages"]) == 4
    assert main(["log", "export", "--data-dir", str(tmp_path / "data"), "--format", "distill",
                 "--out", str(out)]) == 0
    (distill,) = rows(out)  # the second answer has no token ids: not a distillation pair
    assert distill["completion_token_ids"] == [5, 6] and distill["prompt_token_ids"] == [1, 2, 3]
    assert distill["logprobs"] == [-0.1, -0.01]
    assert distill["top_logprobs"][0] == [{"token": "Red", "logprob": -0.1},
                                          {"token": "Blue", "logprob": -2.5}]
    datasets = pytest.importorskip("datasets")
    assert len(datasets.load_dataset("json", data_files=str(out), split="train")) == 1


def test_a_streamed_line_is_gathered_like_a_json_one() -> None:
    request = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    events = [{"choices": [{"index": 0, "delta": {"role": "assistant"}, "token_ids": []}]},
              {"choices": [{"index": 0, "delta": {"content": "Hel"}, "token_ids": [7],
                            "logprobs": {"content": [{"token": "Hel", "logprob": -1.0,
                                                      "top_logprobs": []}]}}]},
              {"choices": [{"index": 0, "delta": {"content": "lo"}, "token_ids": [8],
                            "logprobs": {"content": [{"token": "lo", "logprob": -0.5,
                                                      "top_logprobs": []}]}}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}, "[DONE]"]
    line = {"status": 200, "route": "/v1/chat/completions", "request_id": "r", "stream": True,
            "request": request, "response": {"events": events}, "prompt_token_ids": [1]}
    (pair,) = from_log(line, "distill")
    assert pair["prompt_messages"] == [{"role": "user", "content": "Hi"}]
    assert pair["completion"] == "Hello" and pair["completion_token_ids"] == [7, 8]
    assert pair["logprobs"] == [-1.0, -0.5] and pair["finish_reason"] == "stop"
    (chat,) = from_log(line, "sft")
    assert chat["messages"][-1]["content"] == "Hello"
    assert list(from_log({**line, "status": 400}, "sft")) == []


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    assert main(["log", "export"]) == 2
    assert main(["log", "export", "--request-log", str(tmp_path / "nope")]) == 2
    assert main(["log", "export", "--data-dir", str(tmp_path)]) == 2  # no database there
