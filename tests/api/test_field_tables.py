"""The tables of field names the request stages read a wire struct by (``getattr`` over a
name: the refused fields, the template-only fields, prompt scoring's neutral values, SGLang's
no-op update fields, the fields /inference/v1/generate passes on) name fields of the generated
structs they are read from: a contract field renamed or dropped fails here instead of reading
as missing. Everything else the shared request stages read is typed (kiln/api/wire_values.py's
unions of request structs): mypy fails there."""

from __future__ import annotations

from typing import Any

from kiln.api._generated import wire
from kiln.api.handlers.completions import SCORING_EMPTY, SCORING_NEUTRAL
from kiln.api.handlers.generate import PASSED
from kiln.api.handlers.training import NO_OP_FIELDS
from kiln.api.requests.prepare import TEMPLATE_FIELDS
from kiln.api.requests.prompt_ids import TEMPLATE_ONLY
from kiln.api.requests.refused import (
    BATCH_UNSUPPORTED,
    CHAT_UNSUPPORTED,
    COMPLETION_UNSUPPORTED,
    DEFAULT_ONLY,
    OPENAI_CHAT_UNSUPPORTED,
)


def fields(struct: Any) -> set[str]:
    return set(struct.__struct_fields__)


CHAT, BATCH = fields(wire.ChatCompletionRequest), fields(wire.BatchCompletionRequest)
TEXT = fields(wire.TextCompletionRequest)


def test_the_refused_fields_are_fields_of_the_routes_that_refuse_them() -> None:
    assert set(CHAT_UNSUPPORTED) <= CHAT & BATCH  # chat's and batch's share
    assert set(OPENAI_CHAT_UNSUPPORTED) <= CHAT  # batch has none of them
    assert set(BATCH_UNSUPPORTED) <= BATCH
    assert set(COMPLETION_UNSUPPORTED) <= TEXT
    assert set(DEFAULT_ONLY) <= CHAT | BATCH | TEXT


def test_the_template_fields_are_chat_s() -> None:
    assert set(TEMPLATE_ONLY) <= CHAT  # batch lacks add_generation_prompt, echo and the like
    assert set(TEMPLATE_FIELDS) <= CHAT & BATCH  # /tokenize's request has neither


def test_the_other_tables() -> None:
    assert set(SCORING_NEUTRAL) | set(SCORING_EMPTY) <= TEXT
    assert {name for name, _ in NO_OP_FIELDS} <= fields(wire.TrainingUpdateWeightsRequest)
    assert set(PASSED) <= fields(wire.GenerateRequest)
