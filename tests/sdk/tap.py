#!/usr/bin/env python3
"""A recording reverse proxy in front of a real model server, for the SDK tests.

Standard library only. Every request is forwarded to `--forward` as it came
(streams pass through chunk by chunk, as the server writes them) and
recorded, as `scripted_upstream.py` records: `GET /_received` lists
`[{"method", "path", "headers", "body", "started", "ended", "status"}]`
(`started` and `ended` are seconds on this process's monotonic clock; `ended`
is null while the answer is still being written, and `status` is
"cut" when the client went away first), and `DELETE /_received` forgets
them. So a test can assert on what recall sent a real model, and on when.

With `--greedy`, a chat completion that sets no `temperature` (recall's own
summaries, notes and extractions) is forwarded with `temperature: 0`, so
that what a small model writes for them is the same from run to run; the
record keeps the body as it came.

    python3 tap.py --forward http://127.0.0.1:PORT --port 0 [--greedy]   # prints "listening on PORT"
"""

from __future__ import annotations

import argparse
import http.client
import json
import select
import socket
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Headers that describe one hop's connection, not the message.
HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.entries: list[dict] = []

    def record(self, entry: dict) -> dict:
        with self.lock:
            self.entries.append(entry)
        return entry

    def snapshot(self) -> list[dict]:
        with self.lock:
            return [dict(e) for e in self.entries]

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State
    target: urllib.parse.SplitResult
    greedy = False

    def log_message(self, fmt, *args):
        pass

    def send_json(self, status: int, payload) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/_received":
            return self.send_json(200, self.state.snapshot())
        if self.path == "/health":
            return self.send_json(200, {"ok": True})
        self.forward(b"")

    def do_DELETE(self):
        if self.path == "/_received":
            self.state.clear()
            return self.send_json(200, {"cleared": True})
        self.forward(b"")

    def do_POST(self):
        length = int(self.headers.get("content-length") or 0)
        self.forward(self.rfile.read(length))

    def forward(self, body: bytes) -> None:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode(errors="replace")
        entry = self.state.record({
            "method": self.command,
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": parsed,
            "started": time.monotonic(),
            "ended": None,
            "status": None,
        })
        if self.greedy and isinstance(parsed, dict) and "messages" in parsed and "temperature" not in parsed:
            body = json.dumps({**parsed, "temperature": 0}).encode()
        upstream = http.client.HTTPConnection(self.target.hostname, self.target.port, timeout=600)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP | {"host", "content-length"}}
        headers["content-length"] = str(len(body))
        done = threading.Event()
        try:
            upstream.request(self.command, self.target.path.rstrip("/") + self.path, body=body, headers=headers)
            threading.Thread(target=self.watch, args=(upstream, entry, done), daemon=True).start()
            resp = upstream.getresponse()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in HOP | {"content-length"}:
                    self.send_header(k, v)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            while True:
                piece = resp.read1(65536)
                if not piece:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
            # Answered whole: a close from here on is the client's own.
            done.set()
            if entry["status"] is None:
                entry["status"] = resp.status
        except (BrokenPipeError, ConnectionResetError, OSError, http.client.HTTPException):
            # The client (recall) went away: so does our request, which
            # lets the server stop generating.
            entry["status"] = "cut"
            self.close_connection = True
        finally:
            done.set()
            entry["ended"] = time.monotonic()
            upstream.close()

    def watch(self, upstream: http.client.HTTPConnection, entry: dict, done: threading.Event) -> None:
        """Closes the server's connection as soon as the client closes
        ours: a server writing nothing yet (a non-streamed answer) would
        otherwise never learn that nobody waits for it."""
        client = self.connection
        while not done.is_set():
            try:
                readable, _, _ = select.select([client], [], [], 0.05)
                if readable and client.recv(1, socket.MSG_PEEK) == b"":
                    if done.is_set():
                        return
                    entry["status"] = "cut"
                    if upstream.sock is not None:
                        upstream.sock.shutdown(socket.SHUT_RDWR)
                    return
                if readable:
                    return  # the client's next request: it is still there
            except OSError:
                return


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--forward", required=True, help="the server's base URL, e.g. http://127.0.0.1:8080")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--greedy", action="store_true", help="temperature 0 where a chat completion sets none")
    args = p.parse_args(argv)

    Handler.state = State()
    Handler.greedy = args.greedy
    Handler.target = urllib.parse.urlsplit(args.forward)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
