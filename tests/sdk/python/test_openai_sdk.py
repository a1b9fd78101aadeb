"""recall end to end through the official OpenAI Python SDK.

Each test runs against the scripted upstream (tests/sdk/scripted_upstream.py,
which answers by what the last message says) and against llmock (a
third-party mock that echoes the whole prompt, and is scripted through its
/_llmock/scenario API). The client sends only the new message each turn:
whatever else the upstream gets, recall remembered.
"""

from __future__ import annotations

import json

import openai
import pytest
from openai import OpenAI

from launch import SYSTEM_MESSAGE, http

MODEL = "gpt-4o-mini"
API_KEY = "sk-sdk-test"
LLMOCK_PREFIX = "Hello! You said: "

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def client(stack, *, header=None, path=None, max_retries=0) -> OpenAI:
    """An SDK client naming its session by header or by the base-URL form."""
    base = f"{stack.recall_url}/sessions/{path}/v1" if path else f"{stack.recall_url}/v1"
    return OpenAI(
        base_url=base,
        api_key=API_KEY,
        default_headers={"x-session-id": header} if header else None,
        max_retries=max_retries,
        timeout=20,
    )


def say(c: OpenAI, text: str, *, stream: bool, **extra) -> str:
    """Sends one user message and returns the reply's text."""
    return complete(c, [{"role": "user", "content": text}], stream=stream, **extra)


def complete(c: OpenAI, messages: list[dict], *, stream: bool, **extra) -> str:
    """Sends `messages` as they are and returns the reply's text, checking
    the response's shape on the way (chunks, finish reason)."""
    if not stream:
        r = c.chat.completions.create(model=MODEL, messages=messages, **extra)
        assert r.object == "chat.completion"
        assert r.choices[0].finish_reason == "stop"
        assert r.choices[0].message.role == "assistant"
        return r.choices[0].message.content
    parts, finishes = [], []
    with c.chat.completions.create(model=MODEL, messages=messages, stream=True, **extra) as s:
        for chunk in s:
            assert chunk.object == "chat.completion.chunk"
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                if choice.finish_reason:
                    finishes.append(choice.finish_reason)
    assert finishes == ["stop"], finishes
    return "".join(parts)


def transcript(messages) -> list[tuple[str, str]]:
    """(role, content) of each message, the configured system message included."""
    return [(m["role"], m.get("content")) for m in messages]


def expect_answer(stack, answer: str, said: str):
    """What each upstream answers to a plain message, given all it was sent."""
    if stack.upstream == "scripted":
        assert answer == f"echo: {said}"
    else:
        assert answer.startswith(LLMOCK_PREFIX), answer


def history(stack, sid):
    status, h = stack.history(sid)
    assert status == 200, h
    return h["contents"]


# -- (1) and (3): a conversation named by the header, streaming and not --------


def test_header_session_remembers_every_turn_streaming_or_not(stack, sid):
    c = client(stack, header=sid)
    turns = [("My name is Ada.", False), ("I live in Paris.", True), ("what did I say first?", False)]
    expected = [("system", SYSTEM_MESSAGE)]
    for n, (text, stream) in enumerate(turns, start=1):
        answer = say(c, text, stream=stream)
        expected.append(("user", text))
        got = stack.received()
        assert len(got) == n, got
        # The client sent one message; the upstream got the whole conversation.
        assert transcript(got[-1]["messages"]) == expected
        assert got[-1]["model"] == MODEL
        assert got[-1].get("stream", False) is stream
        assert "session_id" not in got[-1]
        expected.append(("assistant", answer))
        if n < 3:
            expect_answer(stack, answer, text)

    # The SDK's answer itself depends on the first turn.
    if stack.upstream == "scripted":
        assert answer == "You first said: My name is Ada."
    else:
        assert answer.startswith(f"{LLMOCK_PREFIX}{SYSTEM_MESSAGE} My name is Ada.")

    h = history(stack, sid)
    assert transcript(h) == expected[1:]
    assert [m["turn_id"] for m in h] == [1, 1, 2, 2, 3, 3]
    assert [m["metadata"]["source"] for m in h] == ["message", "llm"] * 3

    if stack.upstream == "scripted":  # llmock's journal keeps no headers
        _, entries = http("GET", f"{stack.upstream_url}/_received")
        assert entries[-1]["headers"]["authorization"] == f"Bearer {API_KEY}"
        assert "x-session-id" not in entries[-1]["headers"]


# -- (2) the base-URL form -------------------------------------------------------


def test_base_url_session_form_remembers_and_keeps_sessions_apart(stack, sid):
    c = client(stack, path=sid)
    first = say(c, "Remember the number 42.", stream=True, stream_options={"include_usage": True})
    expect_answer(stack, first, "Remember the number 42.")
    second = say(c, "what did I say first?", stream=False)
    got = stack.received()
    assert transcript(got[-1]["messages"]) == [
        ("system", SYSTEM_MESSAGE),
        ("user", "Remember the number 42."),
        ("assistant", first),
        ("user", "what did I say first?"),
    ]
    if stack.upstream == "scripted":
        assert second == "You first said: Remember the number 42."
    else:
        assert "Remember the number 42." in second

    # Another session on the same recall does not see this one.
    other = say(client(stack, header=f"{sid}-other"), "what did I say first?", stream=False)
    assert transcript(stack.received()[-1]["messages"]) == [
        ("system", SYSTEM_MESSAGE),
        ("user", "what did I say first?"),
    ]
    if stack.upstream == "scripted":
        assert other == "You first said: what did I say first?"

    # The header form reads the same memory as the path form.
    assert [m["content"] for m in history(stack, sid)] == [
        "Remember the number 42.", first, "what did I say first?", second,
    ]


# -- (3) a stream relayed whole ---------------------------------------------------


def test_a_stream_arrives_whole_with_its_usage_chunk(stack, sid):
    text = "Tell me something in several words please."
    c = client(stack, header=sid)
    chunks = []
    with c.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": text}],
        stream=True,
        stream_options={"include_usage": True},
    ) as s:
        chunks = list(s)
    assert len(chunks) >= 4, chunks
    assert chunks[0].choices[0].delta.role == "assistant"
    ids = {ch.id for ch in chunks}
    assert len(ids) == 1, ids
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finish == ["stop"]
    # The usage chunk comes last, with no choices.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.total_tokens > 0
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    content_chunks = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
    assert len(content_chunks) > 1, "the reply should come in several chunks"

    # The same message, not streamed, in a fresh session: the same answer.
    plain = say(client(stack, header=f"{sid}-plain"), text, stream=False)
    assert streamed == plain
    expect_answer(stack, streamed, text)
    assert stack.received()[0]["stream_options"] == {"include_usage": True}

    # recall remembered exactly what was streamed.
    assert transcript(history(stack, sid)) == [("user", text), ("assistant", streamed)]


# -- (4) a tool call round trip ------------------------------------------------------


def collect_tool_calls(stream) -> tuple[list[dict], str | None]:
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            for d in choice.delta.tool_calls or []:
                call = calls.setdefault(d.index, {"id": None, "name": "", "arguments": ""})
                if d.id:
                    call["id"] = d.id
                if d.function and d.function.name:
                    call["name"] += d.function.name
                if d.function and d.function.arguments:
                    call["arguments"] += d.function.arguments
            finish = choice.finish_reason or finish
    return [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_tool_call_round_trip_is_remembered_in_order(stack, sid, stream):
    c = client(stack, header=sid)
    ask = "please call the weather tool for Paris"
    if stream:
        with c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": ask}], tools=[WEATHER_TOOL], stream=True
        ) as s:
            calls, finish = collect_tool_calls(s)
    else:
        r = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ask}], tools=[WEATHER_TOOL])
        finish = r.choices[0].finish_reason
        calls = [
            {"id": t.id, "name": t.function.name, "arguments": t.function.arguments}
            for t in r.choices[0].message.tool_calls or []
        ]
    assert finish == "tool_calls"
    assert len(calls) == 1, calls
    call = calls[0]
    assert call["name"] == "get_weather" and call["id"]
    assert isinstance(json.loads(call["arguments"]), dict)
    if stack.upstream == "scripted":
        assert json.loads(call["arguments"]) == {"city": "Paris"}

    # The client sends only the tool's result; recall supplies the rest.
    result = '{"city": "Paris", "temp_c": 21}'
    tool_msg = {"role": "tool", "tool_call_id": call["id"], "content": result}
    if stream:
        parts = []
        with c.chat.completions.create(model=MODEL, messages=[tool_msg], tools=[WEATHER_TOOL], stream=True) as s:
            for chunk in s:
                parts += [ch.delta.content or "" for ch in chunk.choices]
        final = "".join(parts)
    else:
        r = c.chat.completions.create(model=MODEL, messages=[tool_msg], tools=[WEATHER_TOOL])
        assert r.choices[0].finish_reason == "stop"
        assert not r.choices[0].message.tool_calls
        final = r.choices[0].message.content
    if stack.upstream == "scripted":
        assert final == f"tool result received: {result}"
    else:
        assert final.startswith(LLMOCK_PREFIX) and result in final

    sent = stack.received()[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "tool"]
    assert sent[1]["content"] == ask
    assert [t["id"] for t in sent[2]["tool_calls"]] == [call["id"]]
    assert sent[2]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": call["arguments"]}
    assert sent[3] == {"role": "tool", "tool_call_id": call["id"], "content": result}

    h = history(stack, sid)
    assert [m["role"] for m in h] == ["user", "assistant", "tool", "assistant"]
    assert h[0]["content"] == ask
    assert h[1]["tool_calls"][0]["id"] == call["id"]
    assert h[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert h[2]["tool_call_id"] == call["id"] and h[2]["content"] == result
    assert h[3]["content"] == final and not h[3].get("tool_calls")
    assert [m["turn_id"] for m in h] == [1, 1, 1, 1]


# -- (5) a stream the client closes early ----------------------------------------------

LONG_REPLY = " ".join(f"piece{i}" for i in range(40))


def test_a_stream_closed_early_is_recorded_as_interrupted(stack, sid):
    c = client(stack, header=sid)
    if stack.upstream == "scripted":
        ask = "slow story please"
        from scripted_upstream import slow_text

        full = slow_text()
    else:
        ask = "tell me a long story"
        full = LONG_REPLY
        # The role chunk and 3 words go out, then llmock pauses long enough
        # for the client to hang up in the middle of the reply.
        stack.llmock(
            {"type": "reply", "text": full},
            {"type": "stream_fault", "kind": "stall", "after_chunks": 4, "stall_seconds": 2.0},
        )
    read = ""
    pieces = 0
    s = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": ask}], stream=True)
    with s:
        for chunk in s:
            delta = chunk.choices[0].delta.content if chunk.choices else None
            if delta:
                read += delta
                pieces += 1
            if pieces == 3:
                break  # leaving the block closes the response
    assert read and full.startswith(read)

    def interrupted(contents):
        return len(contents) >= 2 and contents[1].get("metadata", {}).get("interrupted") is True

    h = stack.wait_history(sid, interrupted, within=10, what="the interrupted reply")
    cut = h[1]
    assert [m["role"] for m in h] == ["user", "assistant"]
    assert h[0]["content"] == ask
    meta = cut["metadata"]
    assert meta["source"] == "llm"
    assert isinstance(meta["interrupt_timestamp"], int) and meta["interrupt_timestamp"] >= cut["timestamp"]
    # content is what went out to the client: at least what it read, never the whole reply.
    assert cut["content"].startswith(read), (cut["content"], read)
    assert full.startswith(cut["content"]) and len(cut["content"]) < len(full)
    if stack.upstream == "llmock":
        # llmock paused right after those chunks: nothing more went out.
        assert cut["content"] == read
        assert meta["original_complete"] is False

    # recall keeps reading the upstream and completes the original.
    h = stack.wait_history(
        sid, lambda cs: cs[1]["metadata"].get("original_complete") is True, within=15, what="the complete original"
    )
    assert h[1]["metadata"]["original"] == full
    assert h[1]["content"] == cut["content"]
    assert h[1]["metadata"]["interrupted"] is True

    # The next turn shows the model what was actually said.
    say(c, "and then?", stream=False)
    sent = stack.received()[-1]["messages"]
    assert transcript(sent)[1:] == [("user", ask), ("assistant", cut["content"]), ("user", "and then?")]


# -- (6) errors arrive as the SDK's own exceptions -------------------------------------


def test_recall_rejects_a_bad_session_id(stack):
    with pytest.raises(openai.BadRequestError) as e:
        say(client(stack, header="bad id"), "hello", stream=False)
    assert e.value.status_code == 400
    assert "a session id is 1 to 128 characters" in e.value.message
    assert e.value.body["type"] == "invalid_request_error"
    assert e.value.body["param"] == "x-session-id"

    with pytest.raises(openai.BadRequestError) as e:
        say(client(stack, path="bad%01id"), "hello", stream=True)
    assert "a session id is 1 to 128 characters" in e.value.message
    assert e.value.body["param"] == "session_id"
    assert stack.received() == []


def test_an_upstream_4xx_is_the_sdks_bad_request_error(stack, sid):
    c = client(stack, header=sid)
    if stack.upstream == "scripted":
        text, message = "fail 400 too hot", "scripted upstream failure (400): fail 400 too hot"
    else:
        text, message = "anything", "llmock refuses this request"
        stack.llmock({"type": "fail", "status": 400, "message": message, "code": "llmock_no"})
    with pytest.raises(openai.BadRequestError) as e:
        say(c, text, stream=False)
    assert e.value.status_code == 400
    assert e.value.message == message or message in e.value.message
    # The failed call kept the user's message, and nothing else.
    assert transcript(history(stack, sid)) == [("user", text)]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_an_upstream_5xx_is_retried_then_raised_without_duplicating_the_message(stack, sid, stream):
    c = client(stack, header=sid, max_retries=1)
    if stack.upstream == "scripted":
        text, message = "fail again", "scripted upstream failure (500): fail again"
    else:
        text, message = "anything", "llmock is down"
        stack.llmock({"type": "fail", "status": 500, "message": message, "retry_after": 0.02, "times": 2})
    with pytest.raises(openai.InternalServerError) as e:
        say(c, text, stream=stream)
    assert e.value.status_code == 500
    assert message in e.value.message
    got = stack.received()
    assert len(got) == 2, "the SDK retried once"
    assert got[0]["messages"] == got[1]["messages"]
    assert transcript(history(stack, sid)) == [("user", text)]


FAULTS = {
    # the connection is cut mid-body: a transport error
    "disconnect": ("break off please", "upstream stream broke off"),
    # the body ends cleanly, but with no finish_reason and no [DONE]
    "truncate": ("truncate please", "upstream stream ended before the reply was complete"),
}


def broken_stream(stack, c: OpenAI, fault: str):
    """Streams a reply that the upstream breaks after a few words; returns
    what the client read and the exception the SDK raised."""
    text, _ = FAULTS[fault]
    if stack.upstream == "llmock":
        text = "one two three four five six seven"
        stack.llmock({"type": "stream_fault", "kind": fault, "after_chunks": 4})
    read = ""
    with pytest.raises(openai.APIError) as e:
        for chunk in c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": text}], stream=True):
            read += "".join(ch.delta.content or "" for ch in chunk.choices)
    return text, read, e.value


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_stream_the_upstream_breaks_raises_and_is_recorded_as_interrupted(stack, sid, fault):
    text, read, err = broken_stream(stack, client(stack, header=sid), fault)
    # The stream had begun with a 200, so this is not a status error: recall
    # sent an SSE error event, which the SDK raised.
    assert not isinstance(err, openai.APIStatusError)
    assert FAULTS[fault][1] in err.message
    assert err.body["code"] == "stream_broken" and err.body["type"] == "upstream_error"
    assert read, "some text arrived before the break"
    if stack.upstream == "llmock":
        assert read == "Hello! You said: "  # the three chunks before the fault

    h = history(stack, sid)
    assert [m["role"] for m in h] == ["user", "assistant"]
    assert h[0]["content"] == text
    meta = h[1]["metadata"]
    assert meta["interrupted"] is True and meta["original_complete"] is False
    assert FAULTS[fault][1] in meta["error"]
    assert meta["original"] == read  # all that arrived before the break
    assert read.startswith(h[1]["content"])


@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_broken_streams_record_holds_all_the_client_was_sent(stack, sid, fault):
    for i in range(10):
        session = f"{sid}-{i}"
        _, read, _ = broken_stream(stack, client(stack, header=session), fault)
        h = history(stack, session)
        assert h[1]["content"] == read, f"round {i}: the client got {read!r}, recall stored {h[1]}"
