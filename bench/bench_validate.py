"""Cost of decode + validate (+ convert) for a typical ~1 KB chat request and a 64-prompt batch.

Goal (issue 2): under 20 µs for the chat request. Prints figures and writes
bench/results/validate.json.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import msgspec

from kiln.api._generated import wire
from kiln.api.contract import contract

RESULTS = Path(__file__).resolve().parent / "results"

CHAT: dict[str, Any] = {
    "model": "SmolLM2-135M-Instruct",
    "messages": [
        {"role": "system", "content": "You are a careful assistant. Answer briefly and cite facts."},
        {"role": "user", "content": "What is the boiling point of water at sea level in Celsius?"},
        {"role": "assistant", "content": "100 °C.", "reasoning_content": "Standard pressure."},
        {"role": "user", "content": "And in Fahrenheit? Use the weather tool if you must."},
        {"role": "assistant", "content": "212 °F at one standard atmosphere (101.325 kPa)."},
        {"role": "user", "content": "Thanks. What about at the top of Mount Everest, roughly?"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
                    "required": ["city"],
                },
            },
        }
    ],
    "tool_choice": "auto",
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "max_tokens": 256,
    "stop": ["</answer>", "\n\nUser:"],
    "seed": 1234,
    "chat_template_kwargs": {"enable_thinking": False},
    "thinking_budget_tokens": 128,
    "adapter": None,
    "stream": False,
}
BATCH: dict[str, Any] = {
    "prompts": [[{"role": "user", "content": f"Question number {i}: name a color."}] for i in range(64)],
    "n": 1,
    "max_tokens": 16,
    "temperature": 0.0,
}


def best_us(fn: Any, number: int, repeat: int = 5) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best * 1e6


def run() -> dict[str, Any]:
    c = contract()
    chat_body = msgspec.json.encode(CHAT)
    batch_body = msgspec.json.encode(BATCH)
    c.parse("ChatCompletionRequest", chat_body, wire.ChatCompletionRequest, "x")  # warm up
    c.parse("BatchCompletionRequest", batch_body, wire.BatchCompletionRequest, "x")
    chat_us = best_us(
        lambda: c.parse("ChatCompletionRequest", chat_body, wire.ChatCompletionRequest, "x"), 5000
    )
    batch_us = best_us(
        lambda: c.parse("BatchCompletionRequest", batch_body, wire.BatchCompletionRequest, "x"), 500
    )
    result = {
        "chat_request_bytes": len(chat_body),
        "chat_decode_validate_convert_us": round(chat_us, 2),
        "chat_goal_us": 20.0,
        "batch_64_request_bytes": len(batch_body),
        "batch_64_decode_validate_convert_us": round(batch_us, 2),
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "validate.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    for key, value in run().items():
        print(f"{key}: {value}")
