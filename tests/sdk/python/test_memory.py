"""Memory beyond the window through the official Python SDK, on the shipped
`config/demo-memory.toml` (the built-in mock://echo upstream writes the
summaries too): the README's walk-through, with nothing but the SDK and
recall's HTTP API.
"""

from __future__ import annotations

import time

from openai import OpenAI

from launch import http, shipped_config


def client(base: str, session: str, user: str) -> OpenAI:
    return OpenAI(base_url=f"{base}/v1", api_key="sk-...",
                  default_headers={"x-session-id": session, "x-user-id": user})


def say(c: OpenAI, text: str) -> str:
    r = c.chat.completions.create(model="gpt-4o-mini", messages=[{"role": "user", "content": text}])
    return r.choices[0].message.content


def wait_for(check, what: str, within: float = 10.0):
    deadline = time.time() + within
    while True:
        got = check()
        if got:
            return got
        assert time.time() < deadline, f"no {what}"
        time.sleep(0.05)


def test_the_model_still_names_the_user_after_thirty_turns_and_in_their_next_session():
    with shipped_config("demo-memory.toml") as base:
        ada = client(base, "py-memory", "ada")
        say(ada, "My name is Ada.")
        for i in range(1, 31):
            say(ada, f"Tell me about topic {i}.")
        answer = say(ada, "What is my name?")
        assert "(2 system," in answer, answer
        assert "My notes say: Summary of the conversation so far: The user said: My name is Ada;" in answer
        status, session = http("GET", f"{base}/v1/sessions/py-memory")
        assert status == 200
        assert session["summary"]["model"] == "summarizer"
        assert session["summary"]["last_seq"] >= 40

        status, _ = http("DELETE", f"{base}/v1/sessions/py-memory")
        assert status == 200

        def note():
            status, body = http("GET", f"{base}/v1/users/ada/memory")
            return body if status == 200 else None

        assert "My name is Ada" in wait_for(note, "note for ada")["note"]
        again = client(base, "py-memory-2", "ada")
        assert "Previously, the user talked about: The user said: My name is Ada;" in say(again, "Hello again.")
        # Another user starts with nothing carried.
        bob = client(base, "py-memory-3", "bob")
        assert "My notes say" not in say(bob, "Hello.")
