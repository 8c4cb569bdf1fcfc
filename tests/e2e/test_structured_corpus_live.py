"""The JSON-schema corpus (tests/fixtures/structured/schemas.json: OpenAI's structured-output
example shapes, function parameter schemas, pydantic-generated schemas with $defs and anyOf)
against the default model: every completed output validates against its schema (jsonschema),
and the schemas the engine cannot enforce are a 400 naming the keyword. A quick subset runs by
default; the whole corpus with three seeds each is ``slow``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from tests import HANG_S
from tests.e2e.conftest import LiveServer

CORPUS: list[dict[str, Any]] = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "structured" / "schemas.json").read_text())
ENFORCED = [s for s in CORPUS if "refused" not in s]
REFUSED = [s for s in CORPUS if "refused" in s]
QUICK = ["calendar_event", "sentiment", "fn_get_weather", "fn_calculator", "fn_set_light",
         "pydantic_pet", "pydantic_flags", "pydantic_ticket"]


def test_corpus_size_and_sources() -> None:
    assert len(ENFORCED) >= 50
    assert {s["source"] for s in ENFORCED} == {"openai-example", "function-parameters",
                                                "pydantic"}
    assert any("$defs" in s["schema"] for s in ENFORCED)
    assert any("anyOf" in json.dumps(s["schema"]) for s in ENFORCED)
    assert set(QUICK) <= {s["name"] for s in ENFORCED}


def _body(entry: dict[str, Any], seed: int, max_tokens: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": f"Reply with JSON: {entry['name']}."}],
            "seed": seed, "max_tokens": max_tokens,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": entry["name"], "schema": entry["schema"], "strict": True}}}


async def _sweep(server: LiveServer, entries: list[dict[str, Any]], seeds: list[int],
                 max_tokens: int) -> list[tuple[dict[str, Any], int, dict[str, Any]]]:
    limit = asyncio.Semaphore(4)  # the engine batches these rows together
    async with httpx.AsyncClient(base_url=server.url, timeout=HANG_S) as client:
        async def one(entry: dict[str, Any], seed: int) -> tuple[dict[str, Any], int,
                                                                 dict[str, Any]]:
            async with limit:
                r = await client.post("/v1/chat/completions",
                                      json=_body(entry, seed, max_tokens))
            assert r.status_code == 200, (entry["name"], r.text)
            return entry, seed, r.json()["choices"][0]
        return list(await asyncio.gather(*(one(e, s) for e in entries for s in seeds)))


def _check(results: list[tuple[dict[str, Any], int, dict[str, Any]]]) -> int:
    completed = 0
    for entry, seed, choice in results:
        assert choice["finish_reason"] in ("stop", "length"), (entry["name"], seed, choice)
        if choice["finish_reason"] == "stop":
            completed += 1
            jsonschema.validate(json.loads(choice["message"]["content"]), entry["schema"])
    return completed


def test_quick_subset_validates(live_server: LiveServer) -> None:
    entries = [s for s in ENFORCED if s["name"] in QUICK]
    results = asyncio.run(_sweep(live_server, entries, [1], 160))
    assert _check(results) >= len(entries) // 2  # most finish within 160 tokens


@pytest.mark.slow
def test_whole_corpus_three_seeds_validates(live_server: LiveServer) -> None:
    results = asyncio.run(_sweep(live_server, ENFORCED, [1, 2, 3], 256))
    assert _check(results) >= len(results) // 2


@pytest.mark.parametrize("entry", REFUSED, ids=lambda e: e["name"])
def test_refused_schemas_are_a_400_naming_the_keyword(live_server: LiveServer,
                                                      entry: dict[str, Any]) -> None:
    r = httpx.post(live_server.url + "/v1/chat/completions", json=_body(entry, 1, 8),
                   timeout=HANG_S)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "response_format.json_schema.schema"
    assert entry["refused"] in err["message"], err
