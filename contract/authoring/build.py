"""Assemble the definition modules into the three contract files and render them."""

from __future__ import annotations

import json
from typing import Any

from .added import added_defs
from .batch import batch_defs
from .chat import chat_response_defs
from .chat_request import chat_request_defs
from .common import BASE_URI, DIALECT, MAIN_FILE, TB_FILE, Schema, ref
from .completions import completion_defs
from .examples import ENTRYPOINTS, SEED_ROOT_ANNOTATIONS
from .latency import latency_defs
from .metadata import metadata_defs
from .rollout import rollout_defs
from .routes import routes
from .scalars import scalar_defs
from .thinking_budget import thinking_budget_schema
from .tokenizer import tokenizer_defs


def inference_defs() -> dict[str, Schema]:
    """Every definition of the seed's Definitions section (``inference_schema`` sorts them)."""
    defs: dict[str, Schema] = {}
    for part in (
        scalar_defs,
        chat_request_defs,
        chat_response_defs,
        batch_defs,
        completion_defs,
        rollout_defs,
        metadata_defs,
        latency_defs,
    ):
        for name, schema in part().items():
            assert name not in defs, name
            defs[name] = schema
    return defs


def inference_schema() -> Schema:
    defs = inference_defs()
    defs.update(added_defs())
    defs.update(tokenizer_defs())
    return {
        "$schema": DIALECT,
        "$id": BASE_URI + MAIN_FILE,
        "title": "Kiln inference API contract v1",
        "description": (
            "Canonical field-level wire contract for POST /v1/chat/completions, POST "
            "/v1/completions, and POST /v1/completions/batch. Request objects explicitly identify "
            "Kiln's OpenAI-compatibility policy for unknown inputs; response objects describe "
            "only fields Kiln emits. Arbitrary JSON remains deliberate only for OpenAI tool "
            "definitions, tool choices, calls, and chat-template extension values."
        ),
        "oneOf": [ref(name) for name in ENTRYPOINTS],
        **SEED_ROOT_ANNOTATIONS,
        "$defs": {name: defs[name] for name in sorted(defs)},
    }


def render(value: Any) -> str:
    """Deterministic JSON text: key order as built, exact integers, UTF-8, trailing newline."""
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"


def outputs() -> dict[str, str]:
    return {
        MAIN_FILE: render(inference_schema()),
        TB_FILE: render(thinking_budget_schema()),
        "routes.json": render(routes()),
    }
