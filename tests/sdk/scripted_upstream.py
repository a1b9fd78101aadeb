#!/usr/bin/env python3
"""A scripted OpenAI-compatible upstream for recall's SDK end-to-end tests.

Standard library only. It answers `POST /v1/chat/completions` according to
the text of the last message it receives, so that a test can choose the
answer by what it says:

- the last message is a tool result  -> "tool result received: <content>"
- the last message is a system or developer note (a framework's one-off note
  inside the conversation) -> "noted: <content>"
- "... what did I say first? ..."    -> "You first said: <first user message>"
                                        (proves the earlier turns were sent)
- "... weather tool ..."             -> an assistant `tool_calls` reply calling
                                        get_weather({"city": "Paris"})
- "fail"                             -> 500, OpenAI's error shape
- "fail 400" (or any 4xx/5xx code)   -> that status, OpenAI's error shape
- "slow ..."                         -> a reply of SLOW_WORDS words, streamed one
                                        word per chunk, SLOW_DELAY apart
- "stall ..."                        -> a stream that pauses STALL_SECS after a few
                                        words, then goes on; only the first time
                                        these exact messages arrive (since the
                                        last DELETE /_received), so a client that
                                        timed out and sends them again gets the
                                        reply at once
- "break ..."                        -> a stream cut off after a few chunks (the
                                        connection is closed mid-body)
- "truncate ..."                     -> a stream that ends cleanly after a few
                                        chunks, with no finish_reason and no [DONE]
- anything else                      -> "echo: <text>"

Streams are proper SSE: `chat.completion.chunk` events, a final chunk with
`finish_reason`, a usage chunk when `stream_options.include_usage` is set,
then `data: [DONE]`. Bodies are sent with chunked transfer encoding, so a
stream that is cut off is a transport error, not a short reply.

Every request is recorded: `GET /_received` lists them as
`[{"method", "path", "headers", "body"}]`, `DELETE /_received` forgets them.

    python3 scripted_upstream.py --port 0   # prints "listening on PORT"
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MODEL_FALLBACK = "scripted-model"
SLOW_WORDS = 60
SLOW_DELAY = 0.025
BREAK_AFTER_WORDS = 3
STALL_AFTER_WORDS = 3
STALL_SECS = 1.5

WEATHER_CALL = {
    "id": "call_weather_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}


def slow_text() -> str:
    return "slow reply: " + " ".join(f"word{i}" for i in range(SLOW_WORDS))


def break_text() -> str:
    return "this reply breaks off before it ends"


def stall_text() -> str:
    return "stalled reply: " + " ".join(f"word{i}" for i in range(10))


def text_of(content) -> str:
    """The text of a message's content: a string or a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def pieces(text: str) -> list[str]:
    """Word-sized pieces that concatenate back to `text`."""
    found = re.findall(r"\s*\S+\s*", text)
    return found if "".join(found) == text else [text]


class Plan:
    """What to answer: text, tool calls, an error, or a broken stream."""

    def __init__(self, text=None, tool_calls=None, status=200, error=None, delay=0.0, cut_after=None,
                 clean_cut=False, stall_after=None):
        self.text = text
        self.tool_calls = tool_calls
        self.status = status
        self.error = error
        self.delay = delay
        self.cut_after = cut_after
        self.clean_cut = clean_cut
        self.stall_after = stall_after


def plan_for(body: dict) -> Plan:
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list) or not messages:
        return Plan(text="echo: (no messages)")
    last = messages[-1] if isinstance(messages[-1], dict) else {}
    if last.get("role") == "tool":
        return Plan(text=f"tool result received: {text_of(last.get('content'))}")
    said_before = any(isinstance(m, dict) and m.get("role") in ("user", "assistant") for m in messages[:-1])
    if last.get("role") in ("system", "developer") and said_before:
        return Plan(text=f"noted: {text_of(last.get('content'))}")
    user_texts = [text_of(m.get("content")) for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    said = user_texts[-1] if user_texts else ""
    lowered = said.strip().lower()
    if "what did i say first" in lowered:
        return Plan(text=f"You first said: {user_texts[0]}")
    if "weather tool" in lowered:
        return Plan(tool_calls=[WEATHER_CALL])
    if lowered.startswith("fail"):
        m = re.match(r"fail\s+([45]\d\d)\b", lowered)
        status = int(m.group(1)) if m else 500
        kind = "invalid_request_error" if status < 500 else "server_error"
        return Plan(
            status=status,
            error={
                "error": {
                    "message": f"scripted upstream failure ({status}): {said}",
                    "type": kind,
                    "param": None,
                    "code": "scripted_failure",
                }
            },
        )
    if lowered.startswith("slow"):
        return Plan(text=slow_text(), delay=SLOW_DELAY)
    if lowered.startswith("stall"):
        return Plan(text=stall_text(), stall_after=STALL_AFTER_WORDS)
    if lowered.startswith("break"):
        return Plan(text=break_text(), cut_after=BREAK_AFTER_WORDS)
    if lowered.startswith("truncate"):
        return Plan(text=break_text(), cut_after=BREAK_AFTER_WORDS, clean_cut=True)
    return Plan(text=f"echo: {said}")


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.received: list[dict] = []
        self.counter = 0

    def record(self, entry: dict) -> int:
        with self.lock:
            self.received.append(entry)
            self.counter += 1
            return self.counter

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.received)

    def clear(self) -> None:
        with self.lock:
            self.received.clear()

    def times_seen(self, path: str, messages) -> int:
        """How many recorded requests to `path` carried these messages."""
        with self.lock:
            return sum(
                1 for e in self.received
                if e["path"] == path and isinstance(e["body"], dict) and e["body"].get("messages") == messages
            )


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "scripted-upstream/1"
    state: State  # set on the class by serve()

    def log_message(self, fmt, *args):  # quiet: the tests read /_received instead
        pass

    # -- plumbing -----------------------------------------------------------

    def read_body(self) -> bytes:
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def send_json(self, status: int, payload, extra_headers=None) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(raw)))
        self.send_header("x-request-id", "req-scripted")
        for k, v in (extra_headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(raw)
        self.wfile.flush()

    def write_chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def cut_connection(self) -> None:
        """Close the socket mid-body: the client sees a broken transfer."""
        self.close_connection = True
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # -- routes -------------------------------------------------------------

    def do_GET(self):
        if self.path == "/_received":
            self.send_json(200, self.state.snapshot())
        elif self.path in ("/health", "/healthz"):
            self.send_json(200, {"ok": True})
        elif self.path.endswith("/models"):
            self.send_json(200, {"object": "list", "data": [{"id": MODEL_FALLBACK, "object": "model"}]})
        else:
            self.send_json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})

    def do_DELETE(self):
        if self.path == "/_received":
            self.state.clear()
            self.send_json(200, {"cleared": True})
        else:
            self.send_json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})

    def do_POST(self):
        raw = self.read_body()
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        n = self.state.record(
            {
                "method": "POST",
                "path": self.path,
                "headers": {k.lower(): v for k, v in self.headers.items()},
                "body": body,
            }
        )
        if not self.path.endswith("/chat/completions"):
            self.send_json(404, {"error": {"message": f"no route {self.path}", "type": "invalid_request_error"}})
            return
        if not isinstance(body, dict):
            self.send_json(400, {"error": {"message": "body is not JSON", "type": "invalid_request_error"}})
            return
        plan = plan_for(body)
        if plan.stall_after is not None and self.state.times_seen(self.path, body.get("messages")) > 1:
            plan.stall_after = None  # stalls once: the same request again streams at once
        if plan.error is not None:
            # Retryable errors ask for a short wait, so the SDKs' retries are quick.
            retry = {"retry-after-ms": "20"} if plan.status >= 500 or plan.status == 429 else None
            self.send_json(plan.status, plan.error, retry)
            return
        model = body.get("model") or MODEL_FALLBACK
        cid = f"chatcmpl-scripted-{n}"
        if body.get("stream") is True:
            options = body.get("stream_options") or {}
            self.stream(plan, model, cid, bool(options.get("include_usage")))
        else:
            self.complete(plan, model, cid)

    # -- answers ------------------------------------------------------------

    def complete(self, plan: Plan, model: str, cid: str) -> None:
        if plan.cut_after is not None:
            # Headers promise a body that never comes whole.
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", "4096")
            self.end_headers()
            self.wfile.write(b'{"id": "' + cid.encode() + b'", "choices": [')
            self.cut_connection()
            return
        if plan.delay:
            time.sleep(plan.delay * len(pieces(plan.text or "")))
        message = {"role": "assistant", "content": plan.text, "refusal": None}
        finish = "stop"
        if plan.tool_calls:
            message["tool_calls"] = plan.tool_calls
            finish = "tool_calls"
        completion_tokens = len(pieces(plan.text or "")) + (1 if plan.tool_calls else 0)
        self.send_json(
            200,
            {
                "id": cid,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
                "usage": {"prompt_tokens": 7, "completion_tokens": completion_tokens,
                          "total_tokens": 7 + completion_tokens},
            },
        )

    def stream(self, plan: Plan, model: str, cid: str, include_usage: bool) -> None:
        created = int(time.time())

        def chunk(delta: dict, finish=None, choices=True, usage=None) -> bytes:
            data = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": None,
                "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]
                if choices
                else [],
            }
            if include_usage:
                data["usage"] = usage
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("x-request-id", "req-scripted-sse")
        self.end_headers()
        try:
            sent = 0
            if plan.tool_calls:
                self.write_chunk(chunk({"role": "assistant", "content": None}))
                for i, call in enumerate(plan.tool_calls):
                    head = {"index": i, "id": call["id"], "type": "function",
                            "function": {"name": call["function"]["name"], "arguments": ""}}
                    self.write_chunk(chunk({"tool_calls": [head]}))
                    args = call["function"]["arguments"]
                    for j in range(0, len(args), 8):
                        self.write_chunk(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[j:j + 8]}}]}))
                finish = "tool_calls"
            else:
                self.write_chunk(chunk({"role": "assistant", "content": ""}))
                for piece in pieces(plan.text or ""):
                    if plan.cut_after is not None and sent >= plan.cut_after:
                        if plan.clean_cut:  # a well-formed end of body, mid-reply
                            self.wfile.write(b"0\r\n\r\n")
                            self.wfile.flush()
                        else:
                            self.cut_connection()
                        return
                    if plan.delay:
                        time.sleep(plan.delay)
                    if plan.stall_after is not None and sent == plan.stall_after:
                        time.sleep(STALL_SECS)
                    self.write_chunk(chunk({"content": piece}))
                    sent += 1
                finish = "stop"
            self.write_chunk(chunk({}, finish=finish))
            if include_usage:
                n = sent + (1 if plan.tool_calls else 0)
                self.write_chunk(chunk({}, choices=False,
                                       usage={"prompt_tokens": 7, "completion_tokens": n, "total_tokens": 7 + n}))
            self.write_chunk(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            # The reader went away (recall closed the upstream early).
            self.close_connection = True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    handler = type("ScriptedHandler", (Handler,), {"state": State()})
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
