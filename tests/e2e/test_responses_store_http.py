"""The Responses store over HTTP on the default model: a conversation stored under --data-dir
survives a restart (a new app over the same directory continues it), and an evicted response is
a 404 that says so, to the openai SDK too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest

from kiln.model import LoadedModel
from kiln.model.loader import load_model
from tests import HANG_S
from tests.e2e.app_client import app_client
from tests.e2e.named_sse import check


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(None)


def create(c: Any, **body: Any) -> dict[str, Any]:
    r = c.post("/v1/responses", json={"max_output_tokens": 6, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    check("ResponsesObject", data)
    return data


def test_a_conversation_survives_a_restart(loaded: LoadedModel, tmp_path: Path) -> None:
    with app_client(loaded, None, kv_memory_mb=64, data_dir=str(tmp_path)) as c:
        first = create(c, input="My name is Ada.")
        second = create(c, input="What is my name?", previous_response_id=first["id"])
        items = c.get(f"/v1/responses/{second['id']}/input_items").json()
    with app_client(loaded, None, kv_memory_mb=64, data_dir=str(tmp_path)) as c:
        assert c.get(f"/v1/responses/{second['id']}").json() == second
        assert c.get(f"/v1/responses/{second['id']}/input_items").json() == items
        third = create(c, input="Spell it.", previous_response_id=second["id"])
        assert third["usage"]["input_tokens"] > second["usage"]["input_tokens"]


def test_evicted_is_a_404_that_says_so(loaded: LoadedModel) -> None:
    with app_client(loaded, None, kv_memory_mb=64, responses_max_count=2) as c:
        ids = [create(c, input=f"Count to {i}.")["id"] for i in range(3)]
        r = c.get(f"/v1/responses/{ids[0]}")
        assert r.status_code == 404 and "evicted" in r.json()["error"]["message"]
        check("ErrorResponse", r.json())
        assert c.get(f"/v1/responses/{ids[2]}").status_code == 200
        transport: Any = c  # Starlette's TestClient is an httpx client
        sdk = openai.OpenAI(base_url="http://testserver/v1", api_key="unused", http_client=transport,
                            timeout=HANG_S, max_retries=0)
        with pytest.raises(openai.NotFoundError, match="evicted"):
            sdk.responses.create(model=loaded.served_name,
                                 input="And then?", previous_response_id=ids[0])
