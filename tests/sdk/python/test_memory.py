"""Memory beyond the window through the official Python SDK, on the shipped
`config/demo-memory.toml` (the built-in mock://echo upstream writes the
summaries too): the README's walk-through, with nothing but the SDK and
recall's HTTP API.
"""

from __future__ import annotations
import re
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


def test_a_fact_told_in_one_session_is_recalled_in_the_next_when_relevant():
    """README's "Long-term memory", on the shipped `config/demo-long-term.toml`."""
    with shipped_config("demo-long-term.toml") as base:
        say(client(base, "py-monday", "ana"), "I am allergic to peanuts. I live in Hanoi.")
        status, _ = http("DELETE", f"{base}/v1/sessions/py-monday")
        assert status == 200

        def records():
            status, body = http("GET", f"{base}/v1/users/ana/memory/records")
            return body["data"] if status == 200 and len(body["data"]) == 2 else None

        texts = sorted(r["text"] for r in wait_for(records, "records for ana"))
        assert texts == ["I am allergic to peanuts", "I live in Hanoi"]
        answer = say(client(base, "py-tuesday", "ana"), "What snack should I bring?")
        # The fact with the day it was said (today, UTC).
        assert re.search(r"My notes say: Relevant facts about the user:\n"
                         r"- \(\d{1,2} [A-Z][a-z]{2} \d{4}\) I am allergic to peanuts$", answer), answer
        assert "My notes say" not in say(client(base, "py-wednesday", "ana"), "Can you recommend some music?")
        # Searched through the API, the same facts by meaning.
        status, found = http("POST", f"{base}/v1/users/ana/memory/records/search",
                             {"query": "What snack should I bring?", "score_threshold": 0})
        assert status == 200
        assert [r["text"] for r in found["data"]][0] == "I am allergic to peanuts"
        status, err = http("POST", f"{base}/v1/users/ana/memory/records/search",
                           {"query": "snack", "limit": 201})
        assert status == 400 and err["error"]["param"] == "limit"
        # Forgetting the user forgets the records.
        status, gone = http("DELETE", f"{base}/v1/users/ana/memory")
        assert status == 200 and gone["records"] == 2
        status, left = http("GET", f"{base}/v1/users/ana/memory/records")
        assert left["data"] == []


def test_the_users_own_words_are_remembered_dated_and_a_changed_fact_supersedes_the_old():
    """The `verbatim` strategy (no extract model) through the SDK: the
    messages' `timestamp` dates the records, and "I moved to Berlin"
    supersedes "I live in Paris"."""
    no_extractor = lambda text: re.sub(r"(?m)^extract_model = .*$", "", text)
    with shipped_config("demo-long-term.toml", edit=no_extractor) as base:
        for session, text, at in [("py-paris", "I live in Paris.", 1_683_554_160_000),
                                  ("py-berlin", "I moved to Berlin last week.", 1_684_573_200_000)]:
            c = client(base, session, "ana")
            c.chat.completions.create(model="gpt-4o-mini", messages=[
                {"role": "user", "content": text, "timestamp": at}])
            status, done = http("POST", f"{base}/v1/sessions/{session}/memory/extract")
            assert status == 200, done
        status, page = http("GET", f"{base}/v1/users/ana/memory/records?include_superseded=true")
        assert status == 200
        by_text = {r["text"]: r for r in page["data"]}
        assert set(by_text) == {"I live in Paris.", "I moved to Berlin last week."}, by_text
        paris, berlin = by_text["I live in Paris."], by_text["I moved to Berlin last week."]
        assert (paris["strategy"], paris["said_at"]) == ("verbatim", 1_683_554_160_000)
        assert paris["superseded_by"] == berlin["id"] and paris["valid_to"] == 1_684_573_200_000
        assert berlin["superseded_by"] is None
        answer = say(client(base, "py-sunday", "ana"), "Where do I live now?")
        assert answer.endswith("My notes say: Relevant facts about the user:\n"
                               "- (20 May 2023) I moved to Berlin last week."), answer
