"""The `openai-agents` SDK runs an Agent with one function tool against Kiln's Responses API end
to end (the tool forced: the default model is too small to choose it), and a second Agent turn
answers from the tool's output."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from tests import HANG_S
from tests.e2e.conftest import LiveServer

pytestmark = pytest.mark.slow

agents = pytest.importorskip("agents")


def test_agent_with_a_function_tool(live_server: LiveServer) -> None:
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)
    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        calls.append(city)
        return f"Sunny and 21 C in {city}"

    model_name = httpx.get(live_server.url + "/v1/models", timeout=HANG_S).json()["data"][0]["id"]
    client = AsyncOpenAI(base_url=live_server.url + "/v1", api_key="unused", timeout=HANG_S,
                         max_retries=0)
    model = agents.OpenAIResponsesModel(model=model_name, openai_client=client)
    settings: Any = agents.ModelSettings(tool_choice="get_weather", temperature=0,
                                         max_tokens=48)
    forced = agents.Agent(name="weather", instructions="Use the tool.", tools=[get_weather],
                          model=model, model_settings=settings,
                          tool_use_behavior="stop_on_first_tool")
    # the tool's output then goes back to the model, which answers in text
    answer = agents.Agent(name="weather", instructions="Answer briefly.", tools=[get_weather],
                          model=model, model_settings=agents.ModelSettings(
                              temperature=0, max_tokens=24, tool_choice="none"))

    async def both() -> tuple[Any, Any]:  # one event loop: the client's connections live in it
        first = await agents.Runner.run(forced, "What is the weather in Paris?")
        again = [*first.to_input_list(), {"role": "user", "content": "Say it in a sentence."}]
        return first, await agents.Runner.run(answer, again)

    result, follow = asyncio.run(both())
    assert len(calls) == 1
    assert result.final_output == f"Sunny and 21 C in {calls[0]}"
    assert isinstance(follow.final_output, str) and follow.final_output
