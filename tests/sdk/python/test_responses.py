"""The Responses and Conversations APIs through the official Python SDK and
the OpenAI Agents SDK, with recall in front of the scripted chat upstream
(which has no Responses API of its own). Each request sends only what is
new; what else the upstream gets, recall remembered.
"""

from __future__ import annotations

import asyncio

import pytest
from openai import AsyncOpenAI, OpenAI

from launch import SYSTEM_MESSAGE, Stack

MODEL = "gpt-4o-mini"
API_KEY = "sk-sdk-test"

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture(scope="module")
def scripted():
    s = Stack("scripted").start()
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _fresh(scripted):
    scripted.reset()
    yield


def client(stack) -> OpenAI:
    return OpenAI(base_url=f"{stack.recall_url}/v1", api_key=API_KEY, max_retries=0, timeout=20)


def last_messages(stack) -> list[dict]:
    return stack.received()[-1]["messages"]


def test_a_chain_by_previous_response_id(scripted):
    c = client(scripted)
    r1 = c.responses.create(model=MODEL, input="My name is Ada.", instructions="Be brief.")
    assert r1.object == "response" and r1.status == "completed"
    assert r1.output_text == "echo: My name is Ada."
    assert r1.usage is not None and r1.usage.total_tokens > 0
    r2 = c.responses.create(model=MODEL, input="What did I say first?", previous_response_id=r1.id)
    assert r2.output_text == "You first said: My name is Ada."
    sent = last_messages(scripted)
    # Recall's system message; the first response's instructions stay with it.
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[0]["content"] == SYSTEM_MESSAGE
    got = c.responses.retrieve(r2.id)
    assert got.output_text == r2.output_text
    assert got.previous_response_id == r1.id
    items = c.responses.input_items.list(r2.id)
    assert [i.content[0].text for i in items.data] == ["What did I say first?"]


def test_a_streamed_response_through_the_stream_helper(scripted):
    c = client(scripted)
    first = c.responses.create(model=MODEL, input="Remember the tea.")
    deltas = []
    with c.responses.stream(model=MODEL, input="slow please", previous_response_id=first.id) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert len(deltas) > 10
    assert final.status == "completed"
    assert final.output_text == "".join(deltas)
    assert final.output_text.startswith("slow reply: word0")
    assert c.responses.retrieve(final.id).output_text == final.output_text


def test_function_calls_round_trip(scripted):
    c = client(scripted)
    r1 = c.responses.create(model=MODEL, input="Ask the weather tool about Paris.", tools=[WEATHER_TOOL])
    calls = [o for o in r1.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    r2 = c.responses.create(
        model=MODEL,
        previous_response_id=r1.id,
        tools=[WEATHER_TOOL],
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21C"}],
    )
    assert r2.output_text == "tool result received: sunny, 21C"
    sent = last_messages(scripted)
    assert sent[-2]["tool_calls"][0]["id"] == calls[0].call_id
    assert sent[-1] == {"role": "tool", "tool_call_id": calls[0].call_id, "content": "sunny, 21C"}


def test_a_conversation_holds_the_memory(scripted):
    c = client(scripted)
    conv = c.conversations.create(
        metadata={"topic": "names"},
        items=[{"type": "message", "role": "user", "content": "I am Grace."}],
    )
    assert conv.id.startswith("conv_")
    r = c.responses.create(model=MODEL, input="What did I say first?", conversation=conv.id)
    assert r.output_text == "You first said: I am Grace."
    items = c.conversations.items.list(conv.id, order="asc")
    kinds = [(i.type, getattr(i, "role", None)) for i in items.data]
    assert kinds == [("message", "user"), ("message", "user"), ("message", "assistant")]
    assert c.conversations.retrieve(conv.id).metadata == {"topic": "names"}
    c.conversations.delete(conv.id)
    with pytest.raises(Exception) as err:
        c.responses.create(model=MODEL, input="hello?", conversation=conv.id)
    assert getattr(err.value, "status_code", None) == 404


def test_an_agent_holds_a_two_turn_conversation_with_a_tool(scripted):
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        seen.append(city)
        return f"sunny in {city}"

    async def run():
        model = OpenAIResponsesModel(
            model=MODEL,
            openai_client=AsyncOpenAI(base_url=f"{scripted.recall_url}/v1", api_key=API_KEY, max_retries=0),
        )
        agent = Agent(name="assistant", instructions="Answer briefly.", tools=[get_weather], model=model)
        first = await Runner.run(agent, "Ask the weather tool about Paris.")
        second = await Runner.run(
            agent, "What did I say first?", previous_response_id=first.last_response_id
        )
        return first, second

    first, second = asyncio.run(run())
    assert seen == ["Paris"]
    assert first.final_output == "tool result received: sunny in Paris"
    assert second.final_output == "You first said: Ask the weather tool about Paris."
    # The second turn sent only its new message; recall sent the whole chain.
    roles = [m["role"] for m in last_messages(scripted)]
    assert roles == ["system", "system", "user", "assistant", "tool", "assistant", "user"]


def test_the_readme_agent_runs_on_the_shipped_demo_config():
    """The README's Agents SDK example, against `config/demo.toml` (the
    built-in mock://echo upstream), on a port of its own."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    from launch import shipped_config

    with shipped_config("demo.toml") as base:
        set_tracing_disabled(True)

        @function_tool
        def get_weather(city: str) -> str:
            """Get the current weather for a city."""
            return f"sunny in {city}"

        model = OpenAIResponsesModel(
            model="gpt-4o-mini",
            openai_client=AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-..."),
        )
        agent = Agent(name="assistant", instructions="Answer briefly.", tools=[get_weather], model=model)

        async def run():
            first = await Runner.run(agent, "What's the weather in Paris?")
            second = await Runner.run(
                agent, "And what did I ask first?", previous_response_id=first.last_response_id
            )
            return first, second

        first, second = asyncio.run(run())
        assert "I see nothing you said before that" in first.final_output
        # The mock's echo shows the chain reached it: the first question is
        # quoted back, and the window held both turns.
        assert 'Before that you said: "What\'s the weather in Paris?"' in second.final_output
        assert "2 user, 1 assistant" in second.final_output
