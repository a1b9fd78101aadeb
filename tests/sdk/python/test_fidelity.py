"""Conversation fidelity through the official OpenAI Python SDK: what a
client does that is not "one new message" (README, "How recall decides what
is new"), checked on what the upstream received and on the stored history.

- a full-resend client regenerates its last reply;
- a reply that never reached the client whole is asked for again, by the
  app after the SDK's read timeout fired mid-stream, or by the SDK's own
  retry after recall had delivered the reply;
- the model asks for a tool, and the agent moves on without answering it.

Each test runs against the scripted upstream and against llmock.
"""

from __future__ import annotations

import httpx2
import openai
import pytest
from openai import OpenAI

from launch import SYSTEM_MESSAGE, http
from test_openai_sdk import (
    API_KEY,
    LLMOCK_PREFIX,
    MODEL,
    WEATHER_TOOL,
    client,
    collect_tool_calls,
    complete,
    transcript,
)


def history(stack, sid: str, *, superseded: bool = False) -> list[dict]:
    query = "?include_superseded=true" if superseded else ""
    status, h = http("GET", f"{stack.recall_url}/v1/sessions/{sid}/history{query}")
    assert status == 200, h
    return h["contents"]


def is_superseded(m: dict) -> bool:
    return (m.get("metadata") or {}).get("superseded") is True


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


STREAMS = pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])


# -- (1) regenerate -------------------------------------------------------------------


@STREAMS
def test_a_regenerate_supersedes_the_last_reply_and_sends_the_conversation_once(stack, sid, stream):
    """A UI that resends the whole conversation, then presses "regenerate":
    the same conversation again, up to the last user message."""
    c = client(stack, header=sid)
    u1, u2 = "My name is Ada.", "I live in Paris."
    a1 = complete(c, [user(u1)], stream=stream)
    a2 = complete(c, [user(u1), assistant(a1), user(u2)], stream=stream)
    a3 = complete(c, [user(u1), assistant(a1), user(u2)], stream=stream)

    got = stack.received()
    assert len(got) == 3, got
    conversation = [("system", SYSTEM_MESSAGE), ("user", u1), ("assistant", a1), ("user", u2)]
    assert transcript(got[1]["messages"]) == conversation
    # The regenerate: exactly what the client sent, not a2, not u2 twice.
    assert transcript(got[2]["messages"]) == conversation, "the upstream was sent more than the client's conversation"
    if stack.upstream == "scripted":
        assert (a1, a2, a3) == (f"echo: {u1}", f"echo: {u2}", f"echo: {u2}")
    else:
        assert a3.startswith(f"{LLMOCK_PREFIX}{SYSTEM_MESSAGE} {u1}"), a3

    h = history(stack, sid)
    assert transcript(h) == [("user", u1), ("assistant", a1), ("user", u2), ("assistant", a3)]
    assert [m["turn_id"] for m in h] == [1, 1, 2, 2]
    assert not any(is_superseded(m) for m in h)

    everything = history(stack, sid, superseded=True)
    assert [m for m in everything if not is_superseded(m)] == h
    gone = [m for m in everything if is_superseded(m)]
    assert [(m["role"], m["content"]) for m in gone] == [("assistant", a2)], everything
    assert isinstance(gone[0]["metadata"]["superseded_at"], int)
    assert gone[0]["metadata"]["source"] == "llm"
    # It stays where it was: after u2, before the reply that replaced it.
    assert transcript(everything) == [
        ("user", u1), ("assistant", a1), ("user", u2), ("assistant", a2), ("assistant", a3),
    ]

    # The next turn builds on the regenerated reply; a2 is never sent again.
    u3 = "what did I say first?"
    a4 = complete(c, [user(u1), assistant(a1), user(u2), assistant(a3), user(u3)], stream=stream)
    assert transcript(stack.received()[-1]["messages"]) == conversation + [("assistant", a3), ("user", u3)]
    assert transcript(history(stack, sid))[3:] == [("assistant", a3), ("user", u3), ("assistant", a4)]


# -- (2) retries ------------------------------------------------------------------------


def test_a_resend_after_the_sdks_read_timeout_mid_stream_stores_the_message_once(stack, sid):
    """The SDK's read timeout fires while the stream has stalled; the app
    catches it and sends the same request again at once. By then the SDK
    has closed the connection, so recall has a reply cut with `client_gone`
    (undelivered), not a barge-in."""
    if stack.upstream == "scripted":
        text = "stall then tell me a story"
    else:
        text = "tell me a story"
        # A few chunks, then a pause much longer than the client's timeout;
        # consumed by this request only, so the resend streams at once.
        stack.llmock({"type": "stream_fault", "kind": "stall", "after_chunks": 4, "stall_seconds": 1.0})

    impatient = OpenAI(
        base_url=f"{stack.recall_url}/v1", api_key=API_KEY, default_headers={"x-session-id": sid},
        max_retries=0, timeout=0.5,
    )
    read = ""
    with pytest.raises((httpx2.TimeoutException, openai.APITimeoutError)):
        with impatient.chat.completions.create(model=MODEL, messages=[user(text)], stream=True) as s:
            for chunk in s:
                read += "".join(ch.delta.content or "" for ch in chunk.choices)
    assert read, "some of the reply arrived before the stall"

    # The app sends the same request again, at once.
    again = complete(client(stack, header=sid), [user(text)], stream=True)

    got = stack.received()
    assert len(got) == 2, got
    assert transcript(got[1]["messages"]) == [("system", SYSTEM_MESSAGE), ("user", text)], (
        "the resend must run the turn again, not add the message a second time"
    )
    if stack.upstream == "scripted":
        from scripted_upstream import stall_text

        assert again == stall_text()
    else:
        assert again == f"{LLMOCK_PREFIX}{SYSTEM_MESSAGE} {text}"
    assert again.startswith(read)

    assert transcript(history(stack, sid)) == [("user", text), ("assistant", again)]
    everything = history(stack, sid, superseded=True)
    assert [m["role"] for m in everything] == ["user", "assistant", "assistant"], everything
    cut = everything[1]
    assert is_superseded(cut), cut
    meta = cut["metadata"]
    assert meta["interrupted"] is True and meta["cut_by"] == "client_gone", meta
    assert cut["content"] == read, "the cut record holds what the client read before the stall"
    assert not is_superseded(everything[2]) and everything[2]["content"] == again


class LoseTheFirstResponse(httpx2.BaseTransport):
    """Passes requests through to recall, but the first response is read
    whole and then lost on the way, as a timeout: the SDK retries it, as it
    would a response a flaky network dropped after recall had sent it all."""

    def __init__(self):
        self.inner = httpx2.HTTPTransport()
        self.retry_counts: list[str | None] = []
        self.lost: bytes = b""

    def handle_request(self, request):
        self.retry_counts.append(request.headers.get("x-stainless-retry-count"))
        response = self.inner.handle_request(request)
        if len(self.retry_counts) > 1:
            return response
        try:
            self.lost = b"".join(response.stream)
        finally:
            response.close()
        raise httpx2.ReadTimeout("the response was lost on its way to the client", request=request)

    def close(self):
        self.inner.close()


@STREAMS
def test_the_sdks_retry_after_a_delivered_reply_stores_the_message_once(stack, sid, stream):
    """recall delivered the whole reply, but it never reached the SDK, which
    retries with x-stainless-retry-count: 1."""
    transport = LoseTheFirstResponse()
    c = OpenAI(
        base_url=f"{stack.recall_url}/v1", api_key=API_KEY, default_headers={"x-session-id": sid},
        max_retries=1, timeout=20, http_client=httpx2.Client(transport=transport),
    )
    text = "Remember the number 42."
    answer = complete(c, [user(text)], stream=stream)
    assert transport.retry_counts == ["0", "1"]
    # The lost response was whole: recall delivered it.
    assert (b"data: [DONE]" in transport.lost) if stream else (b'"finish_reason":"stop"' in transport.lost.replace(b" ", b""))

    got = stack.received()
    assert len(got) == 2, got
    assert got[0]["messages"] == got[1]["messages"]
    assert transcript(got[1]["messages"]) == [("system", SYSTEM_MESSAGE), ("user", text)]

    assert transcript(history(stack, sid)) == [("user", text), ("assistant", answer)]
    everything = history(stack, sid, superseded=True)
    assert [m["role"] for m in everything] == ["user", "assistant", "assistant"], everything
    first = everything[1]
    assert is_superseded(first) and first["metadata"]["source"] == "llm", first
    assert not first["metadata"].get("interrupted"), "the first reply went out whole"
    assert not is_superseded(everything[2]) and everything[2]["content"] == answer

    # The next turn sees the conversation once.
    complete(client(stack, header=sid), [user("and then?")], stream=False)
    assert transcript(stack.received()[-1]["messages"]) == [
        ("system", SYSTEM_MESSAGE), ("user", text), ("assistant", answer), ("user", "and then?"),
    ]


# -- (3) a tool call the agent never answers --------------------------------------------


def assert_grammatical(messages: list[dict]):
    """Every assistant message with tool_calls is followed by tool messages
    answering each of its ids, and every tool message answers such a call."""
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if m.get("role") == "tool":
            assert m.get("tool_call_id") in open_calls, f"message {i} answers no open tool call: {messages}"
            open_calls.discard(m["tool_call_id"])
            continue
        assert not open_calls, f"tool calls {sorted(open_calls)} unanswered before message {i}: {messages}"
        if m.get("role") == "assistant" and m.get("tool_calls"):
            open_calls = {t["id"] for t in m["tool_calls"]}
    assert not open_calls, f"tool calls {sorted(open_calls)} unanswered at the end: {messages}"


@STREAMS
def test_a_tool_call_the_agent_drops_is_not_sent_upstream_unanswered(stack, sid, stream):
    c = client(stack, header=sid)
    ask = "please call the weather tool for Paris"
    if stream:
        with c.chat.completions.create(model=MODEL, messages=[user(ask)], tools=[WEATHER_TOOL], stream=True) as s:
            calls, finish = collect_tool_calls(s)
    else:
        r = c.chat.completions.create(model=MODEL, messages=[user(ask)], tools=[WEATHER_TOOL])
        finish = r.choices[0].finish_reason
        calls = [{"id": t.id, "name": t.function.name} for t in r.choices[0].message.tool_calls or []]
    assert finish == "tool_calls" and len(calls) == 1, calls
    call_id = calls[0]["id"]

    # The agent does not run the tool: the user said something else.
    u2 = "never mind, just say hello"
    answer = complete(c, [user(u2)], stream=stream)

    got = stack.received()
    assert len(got) == 2, got
    sent = got[1]["messages"]
    assert_grammatical(sent)
    assert [(m["role"], m.get("content")) for m in sent if m["role"] == "user"] == [("user", ask), ("user", u2)]
    assert sent[0] == {"role": "system", "content": SYSTEM_MESSAGE}
    assert sent[-1] == {"role": "user", "content": u2}
    assert call_id not in str(sent), sent
    if stack.upstream == "scripted":
        assert answer == f"echo: {u2}"

    # The call stays in the history.
    h = history(stack, sid)
    assert [m["role"] for m in h] == ["user", "assistant", "user", "assistant"], h
    assert h[0]["content"] == ask
    assert [t["id"] for t in h[1]["tool_calls"]] == [call_id]
    assert h[1]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert (h[2]["content"], h[3]["content"]) == (u2, answer)
    assert not any(is_superseded(m) for m in history(stack, sid, superseded=True))

    # A turn later it is still left out.
    complete(c, [user("and goodbye")], stream=False)
    later = stack.received()[-1]["messages"]
    assert_grammatical(later)
    assert call_id not in str(later), later
    assert transcript(later)[-3:] == [("user", u2), ("assistant", answer), ("user", "and goodbye")]
