"""Structural tags in xgrammar's nested ``format`` form end to end on the default model:
``triggered_tags`` on /v1/completions, ``sequence`` + ``tag`` on chat's ``response_format``, and
``structured_outputs.structural_tag`` (JSON text) on /v1/completions/batch."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from tests import HANG_S
from tests.e2e.conftest import LiveServer

pytestmark = pytest.mark.slow
NUMBER = {"type": "integer", "minimum": 0, "maximum": 99}
EQUALS: dict[str, Any] = {"type": "triggered_tags", "triggers": ["="], "tags": [
    {"begin": "=", "content": {"type": "json_schema", "json_schema": NUMBER}, "end": ";"}]}
ANSWER: dict[str, Any] = {"type": "sequence", "elements": [
    {"type": "const_string", "value": "Answer: "},
    {"type": "tag", "begin": "<n>", "content": {"type": "regex", "pattern": "[0-9]{1,3}"},
     "end": "</n>"}]}
ANSWER_TEXT = re.compile(r"Answer: <n>[0-9]{1,3}</n>")


def completions(server: LiveServer, **kw: Any) -> list[tuple[str, str]]:
    r = httpx.post(server.url + "/v1/completions", timeout=HANG_S, json={"max_tokens": 16, **kw})
    assert r.status_code == 200, r.text
    return [(c["text"], c["finish_reason"]) for c in r.json()["choices"]]


def test_triggered_tags_enforce_each_tag_after_its_trigger(live_server: LiveServer) -> None:
    """Free text, but every "=" the model writes starts `=<integer 0..99>;`."""
    written = 0
    for seed in (1, 2, 3):
        (text, finish), = completions(live_server, prompt="a=1; b=2; c=3; d", seed=seed,
                                      response_format={"type": "structural_tag",
                                                       "format": EQUALS})
        closed = re.fullmatch(r"[^=]*(=(0|[1-9][0-9]?);[^=]*)*", text)
        cut = re.fullmatch(r"[^=]*(=(0|[1-9][0-9]?);[^=]*)*=[0-9]{0,2}", text)
        assert closed or (finish == "length" and cut), (text, finish)
        written += text.count("=")
    assert written > 0  # the prompt's pattern makes the model write the trigger


def test_triggered_tags_at_least_one_and_stop_after_first_force_one_tag(
        live_server: LiveServer) -> None:
    fmt = {**EQUALS, "at_least_one": True, "stop_after_first": True}
    got = completions(live_server, prompt="The answer", n=3, seed=4,
                      structured_outputs={"structural_tag": json.dumps({"format": fmt})})
    for text, finish in got:
        assert finish == "stop" and re.fullmatch(r"=(0|[1-9][0-9]?);", text), (text, finish)


def test_sequence_and_tag_on_chat(live_server: LiveServer) -> None:
    body = {"messages": [{"role": "user", "content": "How many legs has a spider?"}],
            "max_tokens": 24, "n": 2, "seed": 5,
            "response_format": {"type": "structural_tag", "format": ANSWER}}
    r = httpx.post(live_server.url + "/v1/chat/completions", json=body, timeout=HANG_S)
    assert r.status_code == 200, r.text
    for choice in r.json()["choices"]:
        text = choice["message"]["content"]
        assert choice["finish_reason"] == "stop" and ANSWER_TEXT.fullmatch(text), choice


def test_sequence_and_tag_on_batch(live_server: LiveServer) -> None:
    body = {"prompts": [[{"role": "user", "content": "Pick a number."}],
                        [{"role": "user", "content": "What is 2 + 2?"}]],
            "max_tokens": 24, "seed": 6,
            "structured_outputs": {"structural_tag": json.dumps({"type": "structural_tag",
                                                                  "format": ANSWER})}}
    r = httpx.post(live_server.url + "/v1/completions/batch", json=body, timeout=HANG_S)
    assert r.status_code == 200, r.text
    items = r.json()["completions"]
    assert len(items) == 2
    for item in items:
        assert item["finish_reason"] == "stop" and ANSWER_TEXT.fullmatch(item["text"]), item


def test_a_bad_format_is_a_400_naming_its_path(live_server: LiveServer) -> None:
    fmt = {"type": "sequence", "elements": [{"type": "any_text"}, {"type": "const_string",
                                                                   "value": "x"}]}
    r = httpx.post(live_server.url + "/v1/completions", timeout=HANG_S, json={
        "prompt": "x", "max_tokens": 4,
        "response_format": {"type": "structural_tag", "format": fmt}})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "response_format.format.elements[0]"
