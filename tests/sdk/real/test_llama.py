"""recall in front of a real model server, through the official SDKs.

llama.cpp's server (llama-cpp-python) with SmolLM2-135M-Instruct, one slot,
recall's upstream `max_concurrent = 1` as config/local.toml sets it. Every
assertion is on what recall stored and what it sent the server (the tap
records it), never on what the model says.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from openai import OpenAI

from conftest import real_stack
from llama import MODEL


@pytest.fixture
def stacks(request, llama_server):
    """Starts recall stacks in front of the server; stops them after the test."""
    started = []
    request.node.stacks = started

    def start(extra_config: str = "", **kw):
        s = real_stack(llama_server, extra_config, **kw).start()
        started.append(s)
        return s

    yield start
    for s in started:
        s.stop()


def client(stack, session: str, user: str | None = None) -> OpenAI:
    headers = {"x-session-id": session}
    if user:
        headers["x-user-id"] = user
    return OpenAI(base_url=f"{stack.recall_url}/v1", api_key="unused", default_headers=headers,
                  max_retries=0, timeout=300)


def say(c: OpenAI, text: str, max_tokens: int = 24) -> str:
    answer = c.chat.completions.create(model=MODEL, max_tokens=max_tokens, temperature=0,
                                       messages=[{"role": "user", "content": text}])
    return answer.choices[0].message.content or ""


def pairs(body: dict) -> list[tuple[str, str]]:
    return [(m["role"], m["content"] if isinstance(m["content"], str) else str(m["content"]))
            for m in body["messages"]]


def test_memory_across_turns(stacks, sid):
    stack = stacks()
    c = client(stack, sid)
    first = say(c, "My name is Ada and I live in Hanoi.")
    second = say(c, "What is my name?")
    sent = stack.received()
    assert len(sent) == 2
    # The second request carried the first turn, as recall stored it.
    assert ("user", "My name is Ada and I live in Hanoi.") in pairs(sent[1])
    assert ("assistant", first) in pairs(sent[1])
    assert pairs(sent[1])[-1] == ("user", "What is my name?")
    contents = stack.history(sid)[1]["contents"]
    assert [(m["role"], m["content"]) for m in contents] == [
        ("user", "My name is Ada and I live in Hanoi."), ("assistant", first),
        ("user", "What is my name?"), ("assistant", second),
    ]


def test_a_stream_cut_mid_sentence_is_recorded_with_its_complete_original(stacks, sid):
    stack = stacks()
    c = client(stack, sid)
    stream = c.chat.completions.create(
        model=MODEL, stream=True, max_tokens=60, temperature=0,
        messages=[{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}])
    read = ""
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            read += chunk.choices[0].delta.content
        if len(read.split()) >= 6:
            break
    stream.close()
    contents = stack.wait_history(
        sid, lambda ms: len(ms) == 2 and ms[1].get("metadata", {}).get("original_complete") is True,
        within=180, what="the cut reply's complete original")
    reply = contents[1]
    meta = reply["metadata"]
    assert meta["interrupted"] is True and meta["cut_by"] == "client_gone", meta
    # Heard: at least what this client read, and no more than the model said.
    assert reply["content"].startswith(read), (reply["content"], read)
    assert meta["original"].startswith(reply["content"])
    assert len(meta["original"]) > len(reply["content"]), meta
    # The drain read the server's answer to its end, on the one request sent.
    entries = stack.entries()
    assert len(entries) == 1 and entries[0]["status"] == 200, entries


def test_a_summary_is_stored_and_sent(stacks, sid):
    stack = stacks("""
[memory]
summarize = true
summary_model = "smollm2"
summary_every_messages = 4
summary_max_chars = 2000
""", window_messages=4)
    c = client(stack, sid)
    for text in ("My name is Ada.", "I work as a nurse.", "I have two daughters.", "I like green tea."):
        say(c, text)
    status, session = 0, {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status, session = stack.history(sid)
        if status == 200 and (session.get("summary") or {}).get("text"):
            break
        time.sleep(0.2)
    summary = (session.get("summary") or {}).get("text")
    assert summary, f"no summary stored: {session}"
    # Its fold was a request of its own, bounded.
    folds = [b for b in stack.received() if b["messages"][0]["content"].startswith("You keep the memory")]
    assert folds, "no fold request reached the model"
    say(c, "What do I drink?")
    last = stack.received()[-1]
    systems = [content for role, content in pairs(last) if role == "system"]
    assert any(summary in s for s in systems), (summary, systems)


def test_a_responses_chain(stacks):
    stack = stacks()
    c = OpenAI(base_url=f"{stack.recall_url}/v1", api_key="unused", max_retries=0, timeout=300)
    first = c.responses.create(model=MODEL, input="My name is Ada.", max_output_tokens=24)
    second = c.responses.create(model=MODEL, input="What is my name?", previous_response_id=first.id,
                                max_output_tokens=24)
    assert second.previous_response_id == first.id
    sent = stack.received()
    assert len(sent) == 2
    assert ("user", "My name is Ada.") in pairs(sent[1])
    assert ("assistant", first.output_text) in pairs(sent[1])
    assert pairs(sent[1])[-1] == ("user", "What is my name?")


def test_the_agents_sdk(stacks, sid):
    agents = pytest.importorskip("agents")
    from openai import AsyncOpenAI

    stack = stacks()
    base = f"{stack.recall_url}/sessions/{sid}/v1"
    model = agents.OpenAIChatCompletionsModel(
        model=MODEL, openai_client=AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300))
    agent = agents.Agent(name="assistant", instructions="Answer in one short sentence.", model=model,
                         model_settings=agents.ModelSettings(max_tokens=24, temperature=0))
    agents.set_tracing_disabled(True)
    first = agents.Runner.run_sync(agent, "My name is Ada.")
    # The Agents SDK resends the whole conversation: recall keeps one copy.
    second = agents.Runner.run_sync(agent, first.to_input_list() + [{"role": "user", "content": "What is my name?"}])
    contents = stack.history(sid)[1]["contents"]
    assert [(m["role"], m["content"]) for m in contents] == [
        ("user", "My name is Ada."), ("assistant", first.final_output),
        ("user", "What is my name?"), ("assistant", second.final_output),
    ]
    sent = stack.received()
    assert pairs(sent[1])[0] == ("system", "You are recall's SDK test assistant.")
    assert ("assistant", first.final_output) in pairs(sent[1])


def test_a_barge_in_does_not_wait_for_the_cut_reply(stacks, sid):
    stack = stacks()
    c = client(stack, sid)
    stream = c.chat.completions.create(
        model=MODEL, stream=True, max_tokens=400, temperature=0,
        messages=[{"role": "user", "content": "Write a very long essay about the history of Rome."}])
    words = 0
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            words += 1
        if words >= 5:
            break
    # The user talks over the bot: the next turn, while the reply streams.
    started = time.monotonic()
    answer = say(c, "Stop. What is two plus two?", max_tokens=12)
    took = time.monotonic() - started
    stream.close()
    contents = stack.wait_history(sid, lambda ms: len(ms) == 4, within=60, what="both turns")
    cut = contents[1]["metadata"]
    assert cut["interrupted"] is True and cut["cut_by"] == "new_request", cut
    assert contents[3]["content"] == answer
    entries = stack.entries()
    essay = entries[0]
    # The cut reply's request was closed (its drain yielded the one slot)
    # before the barge-in's request reached the server.
    assert essay["status"] == "cut", essay
    assert essay["ended"] <= entries[1]["started"] + 0.05, (essay, entries[1])
    print(f"\nbarge-in answered in {took:.2f} s; the cut reply's request ran "
          f"{essay['ended'] - essay['started']:.2f} s and was closed as the barge-in's began")


def test_a_live_turn_with_background_jobs_due_does_not_wait_for_them(stacks, sid):
    """A fold and an extraction due after every turn, on the one slot the
    live turns use: each live request reaches the server with nothing of
    recall's own in flight there (a background call in flight was closed
    first, and is made again later)."""
    lines = ["Hi, I'm Lan. I work as a nurse in Hanoi.",
             "I am allergic to peanuts.",
             "I have two daughters, Mai and Lan.",
             "We are planning a trip to Da Nang.",
             "What snack should I bring to the party?"]

    sent_at = []

    def turns(stack, session):
        c = client(stack, session, user=f"user-{session}")
        took = []
        sent_at.clear()
        for line in lines:
            started = time.monotonic()  # the tap's clock too: CLOCK_MONOTONIC
            sent_at.append(started)
            say(c, line, max_tokens=24)
            took.append(time.monotonic() - started)
        return took

    plain = stacks(window_messages=2)
    baseline = turns(plain, sid + "-plain")
    jobs = stacks("""
[memory]
summarize = true
summary_model = "smollm2"
summary_every_messages = 2

[long_term]
enabled = true
extract_model = "smollm2"
embedding_model = "embedder"
extract_every_turns = 1

[[upstreams]]
name = "embeddings"
base_url = "mock://echo"
models = ["embedder"]
""", window_messages=2, upstream_config='models = ["smollm2"]\nmax_concurrent = 1\ntimeout_secs = 300')
    with_jobs = turns(jobs, sid)
    # Let the jobs of the last turn reach the server too.
    time.sleep(3)
    entries = [e for e in jobs.entries() if e["path"].endswith("/chat/completions")]
    live = [e for e in entries if e["body"]["messages"][0]["content"] == "You are recall's SDK test assistant."]
    background = [e for e in entries if e not in live]
    assert len(live) == len(lines)
    assert background, "no background call reached the server"
    for sent, turn in zip(sent_at, live):
        for job in background:
            overlapped = job["started"] < turn["started"] and (job["ended"] is None or job["ended"] > turn["started"] + 0.05)
            assert not overlapped, f"a background call was in flight when a live turn reached the server: {job} {turn}"
            # Nor did the live turn wait in recall for one to finish.
            waited = job["status"] == 200 and sent < job["ended"] <= turn["started"]
            assert not waited, f"a live turn waited for a background call to finish: {job} {turn} (sent {sent})"
    cut = [e for e in background if e["status"] == "cut"]
    t0 = entries[0]["started"]
    for e in entries:
        kind = "live" if e in live else "job "
        end = f"{e['ended'] - t0:7.2f}" if e["ended"] else "   open"
        print(f"  {kind} {e['started'] - t0:7.2f} .. {end} {e['status']} max_tokens={e['body'].get('max_tokens')}")
    print("  sent at " + " ".join(f"{t - t0:.2f}" for t in sent_at))
    _, metrics = __import__("launch").http("GET", f"{jobs.recall_url}/metrics")
    yields = sum(float(line.rsplit(" ", 1)[1]) for line in str(metrics).splitlines()
                 if line.startswith("recall_background_yields_total{"))
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"\nlive turns without background jobs: median {med(baseline):.2f} s, slowest {max(baseline):.2f} s;"
          f" with a fold and an extraction due every turn: median {med(with_jobs):.2f} s, slowest"
          f" {max(with_jobs):.2f} s ({med(with_jobs) / med(baseline):.2f}x); {len(background)} background"
          f" calls, {len(cut)} cut for a live turn, {yields:.0f} yields counted")
    # Every call the server saw cut was a counted yield (a call asked back
    # before it reached the server yields too, unseen by the tap).
    assert yields >= len(cut), (yields, cut)
    assert all(e["status"] == 200 for e in live), live


STOP = {"i", "am", "a", "an", "the", "and", "to", "of", "in", "my", "is", "have", "has", "who", "so", "at", "me",
        "user", "user's", "their", "they", "are", "with", "for", "as", "be"}


def clauses(text: str) -> list[str]:
    return [c for c in re.split(r"[.,;:!?\n]+", text) if c.strip()]


def words(text: str) -> set[str]:
    return {w.strip(".,!?;:'\"()").lower() for w in text.split()} - STOP - {""}


# A question for each fact the user states below, about it but in none of
# its words, and one about none of them.
ABOUT = {
    "peanut": "What snack should I bring to the party?",
    "nurse": "How can I cope with night shifts?",
    "daughter": "What gift should I buy for my kids?",
}
UNRELATED = "Can you recommend some music?"


def facts_sent(body: dict) -> str:
    """The system message of long-term facts a request carried, or ""."""
    return next((content for role, content in pairs(body)
                 if role == "system" and content.startswith("Relevant facts about the user:")), "")


def test_facts_are_extracted_in_the_shape_asked_for_and_recalled_by_meaning(stacks, sid, minilm_dir):
    """llama-cpp-python's server refuses `json_schema`: recall asks again
    with `json_object` and the schema, keeps to that, and stores what the
    grammar-constrained model answered, embedded by the built-in embedder.
    In a later session a question about a stored fact, in none of its
    words, is sent it; a question about none of them is sent none; and
    the model server is never asked for an embedding."""
    user = f"user-{sid}"
    said = ["Hi, I'm Lan. I work as a nurse in Hanoi.",
            "I am allergic to peanuts.",
            "I have two daughters, Mai and Lan."]
    stack = stacks(f"""
[long_term]
enabled = true
extract_model = "smollm2"
embedding_model = "local:{minilm_dir}"
extract_every_turns = 100
retrieve = "inline"
inline_timeout_ms = 30000
""", upstream_config='models = ["smollm2"]\nmax_concurrent = 1\ntimeout_secs = 300')
    c = client(stack, sid, user=user)
    for line in said:
        say(c, line)
    launch = __import__("launch")
    status, answer = launch.http("POST", f"{stack.recall_url}/v1/sessions/{sid}/memory/extract", {}, timeout=300)
    assert status == 200, answer
    extractions = [b for b in stack.received() if "response_format" in b]
    assert extractions, "no extraction reached the model"
    kinds = [b["response_format"]["type"] for b in extractions]
    # json_schema once (refused, with the server's 500), then json_object
    # with the schema, remembered for the next extraction.
    assert kinds[0] == "json_schema" and set(kinds[1:]) == {"json_object"}, kinds
    assert "schema" in extractions[1]["response_format"]
    assert all(isinstance(b.get("max_tokens"), int) for b in extractions), extractions
    _, records = launch.http("GET", f"{stack.recall_url}/v1/users/{user}/memory/records")
    texts = [r["text"] for r in records["data"]]
    assert texts, f"no record stored: {answer}"
    # At least one record holds a sentence or clause of what the user said
    # (not the model's wit: its shape): one of two content words or more,
    # all of them words the user said.
    heard = set().union(*(words(line) for line in said))
    drawn = [t for t in texts if any(len(words(c)) >= 2 and words(c) <= heard for c in clauses(t))]
    print(f"\nrecords: {texts}")
    assert drawn, (texts, heard)

    # Recalled by meaning: a question about a stored fact, in none of its
    # words, ranks that fact first among the user's records (the model
    # writes the records, so which topics they cover varies)...
    asked = {topic: question for topic, question in ABOUT.items() if any(topic in t.lower() for t in drawn)}
    assert asked, f"no stored fact is about {list(ABOUT)}: {drawn}"
    for topic, question in asked.items():
        _, found = launch.http("POST", f"{stack.recall_url}/v1/users/{user}/memory/records/search",
                               {"query": question, "score_threshold": 0})
        ranked = [(round(r["score"], 3), r["text"]) for r in found["data"]]
        print(f"  {question!r}: {ranked}")
        assert ranked and topic in ranked[0][1].lower(), (question, ranked)
    # ... and at the default score_threshold, a live turn of a new session
    # that asks one is sent it, where one that asks about none of them is
    # sent no fact.
    sent_for = {}
    for n, question in enumerate([*asked.values(), UNRELATED]):
        say(client(stack, f"{sid}-later-{n}", user=user), question, max_tokens=8)
        sent_for[question] = facts_sent(stack.received()[-1])
    print(f"  sent: {sent_for}")
    assert any(any(topic in t.lower() and t in sent_for[q] for t in drawn) for topic, q in asked.items()), sent_for
    assert sent_for[UNRELATED] == "", sent_for
    paths = {e["path"] for e in stack.entries()}
    assert not any(p.endswith("/embeddings") for p in paths), paths


def test_config_local_toml_runs_as_shipped(stacks, sid, minilm_dir):
    """config/local.toml, as README's "Local models" runs it: only its
    port and its server's address changed, its model folder where it says
    (relative to where recall starts). Turns reach the server with the
    config's system message; ending the session leaves the user a note
    and long-term records, from the same one-slot server, every one of
    recall's own calls bounded, no embedding asked of the server."""
    shipped = (Path(__file__).resolve().parents[3] / "config" / "local.toml").read_text()
    assert 'embedding_model = "local:models/all-MiniLM-L6-v2"' in shipped

    def config_from(port: int, base_url: str) -> str:
        listen, upstream = 'listen = "127.0.0.1:8081"', 'base_url = "http://127.0.0.1:8080/v1"'
        # The active upstream is the only uncommented one at that address.
        assert shipped.count(listen) == 1 and shipped.count(upstream) == 1, "config/local.toml moved on"
        return shipped.replace(listen, f'listen = "127.0.0.1:{port}"').replace(upstream, f'base_url = "{base_url}"')

    stack = stacks(config_from=config_from, links={"models/all-MiniLM-L6-v2": minilm_dir})
    user = f"user-{sid}"
    c = client(stack, sid, user=user)
    for line in ("Hi, I'm Lan. I work as a nurse in Hanoi.", "I am allergic to peanuts."):
        say(c, line)
    live = stack.received()
    assert [pairs(b)[0] for b in live] == [("system", "You are a helpful assistant. Answer briefly.")] * 2, live
    launch = __import__("launch")
    status, ended = launch.http("POST", f"{stack.recall_url}/v1/sessions/{sid}/end", {}, timeout=60)
    assert status == 200, ended
    deadline = time.monotonic() + 600
    note, texts = None, []
    while time.monotonic() < deadline and not (note and texts):
        status, memory = launch.http("GET", f"{stack.recall_url}/v1/users/{user}/memory")
        note = memory.get("note") if status == 200 else None
        _, records = launch.http("GET", f"{stack.recall_url}/v1/users/{user}/memory/records")
        texts = [r["text"] for r in records["data"]]
        time.sleep(1)
    print(f"\nnote: {note!r}\nrecords: {texts}")
    assert note, "no note carried for the user"
    assert texts, "no record stored for the user"
    own = [b for b in stack.received() if b not in live]
    assert own and all(isinstance(b.get("max_tokens"), int) for b in own), own
    assert any((b.get("response_format") or {}).get("type") == "json_object" for b in own), own
    paths = {e["path"] for e in stack.entries()}
    assert not any(p.endswith("/embeddings") for p in paths), paths
