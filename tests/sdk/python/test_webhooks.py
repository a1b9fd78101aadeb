"""Webhook deliveries from the real recall binary, verified with the Standard
Webhooks reference library (`standardwebhooks` on PyPI), as a receiver would.

recall posts to a small HTTP receiver in this test. A session is ended
through the session API (`DELETE /v1/sessions/{id}`), which sends
`session_ended`. Checked:

- `Webhook(secret).verify(body, headers)` accepts the delivery, with a
  `whsec_` secret (the base64 of the key) configured in recall;
- a tampered body, or another id, fails verification;
- a delivery the receiver refused (500) is retried with the same
  `webhook-id`, a later `webhook-timestamp` and a new signature that also
  verifies;
- a plain (non-`whsec_`) secret verifies when passed to the library as
  `whsec_` + base64 of its bytes.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from launch import Stack, http

# 32 key bytes, as Standard Webhooks senders generate them, in whsec_ form.
SECRET = "whsec_" + base64.b64encode(b"recall-sdk-test-webhook-key-0032").decode()
PLAIN_SECRET = "a plain secret, not base64"


class Receiver:
    """Records every POST (headers, body); refuses the next `fail` with 500."""

    def __init__(self):
        self.attempts: list[tuple[int, dict, bytes]] = []
        self.fail = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                with receiver.lock:
                    status = 200
                    if receiver.fail > 0:
                        receiver.fail -= 1
                        status = 500
                    receiver.attempts.append((status, dict(self.headers.items()), body))
                self.send_response(status)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def for_session(self, sid: str) -> list[tuple[int, dict, bytes]]:
        with self.lock:
            return [a for a in self.attempts if json.loads(a[2]).get("session_id") == sid]

    def wait_accepted(self, sid: str, within: float = 15.0) -> list[tuple[int, dict, bytes]]:
        """Every attempt for `sid`, once one was accepted."""
        deadline = time.monotonic() + within
        while True:
            attempts = self.for_session(sid)
            if any(status == 200 for status, _, _ in attempts):
                return attempts
            assert time.monotonic() < deadline, f"no accepted delivery for {sid}: {attempts}"
            time.sleep(0.02)


def hooked_stack(receiver: Receiver, secret: str) -> Stack:
    # A retry waits over a second, so that its timestamp differs.
    config = f"""
[webhook]
url = "{receiver.url}"
secret_env = "SDK_TEST_WEBHOOK_SECRET"
max_retries = 3
retry_backoff_ms = 1100
"""
    return Stack("scripted", extra_config=config, env={"SDK_TEST_WEBHOOK_SECRET": secret}).start()


@pytest.fixture(scope="module")
def receiver():
    r = Receiver()
    yield r
    r.stop()


@pytest.fixture(scope="module")
def hooked(receiver):
    s = hooked_stack(receiver, SECRET)
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _logs_on_failure(request):
    """Attach recall's log to a failing test's report (conftest's hook)."""
    for name in ("hooked", "plain"):
        if name in request.fixturenames:
            request.node.stack = request.getfixturevalue(name)
    yield


def end_session(stack: Stack, sid: str, text: str):
    status, body = http(
        "POST",
        f"{stack.recall_url}/v1/sessions/{sid}/messages",
        {"messages": [{"role": "user", "content": text}]},
    )
    assert status == 200, body
    status, body = http("DELETE", f"{stack.recall_url}/v1/sessions/{sid}")
    assert status == 200, body


def test_a_delivery_verifies_with_the_standard_webhooks_library(hooked, receiver, sid):
    end_session(hooked, sid, "hello from the SDK suite")
    attempts = receiver.wait_accepted(sid)
    assert [status for status, _, _ in attempts] == [200]
    _, headers, body = attempts[0]
    assert headers["webhook-id"].startswith("msg_"), headers
    assert "x-recall-signature" not in {k.lower() for k in headers}

    event = Webhook(SECRET).verify(body, headers)
    assert event["event"] == "session_ended"
    assert event["session_id"] == sid
    assert event["reason"] == "ended"
    assert event["contents"][0]["content"] == "hello from the SDK suite"

    # Tampering with the body, or with the id, breaks the signature.
    tampered = body.replace(b"hello from", b"HELLO from")
    assert tampered != body
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(tampered, headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(body, {**headers, "webhook-id": headers["webhook-id"] + "x"})
    # And another key does not verify it.
    other = "whsec_" + base64.b64encode(b"another key entirely, 32 bytes!!").decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(other).verify(body, headers)


def test_a_retried_delivery_keeps_its_id_and_is_signed_anew(hooked, receiver, sid):
    with receiver.lock:
        receiver.fail = 1
    end_session(hooked, sid, "retry me")
    attempts = receiver.wait_accepted(sid)
    assert [status for status, _, _ in attempts] == [500, 200], attempts
    (_, first, first_body), (_, second, second_body) = attempts
    assert first_body == second_body
    assert first["webhook-id"] == second["webhook-id"]
    assert int(second["webhook-timestamp"]) > int(first["webhook-timestamp"])
    assert first["webhook-signature"] != second["webhook-signature"]
    # Each attempt verifies on its own headers, and not on the other's timestamp.
    for headers in (first, second):
        assert Webhook(SECRET).verify(second_body, headers)["session_id"] == sid
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(second_body, {**second, "webhook-timestamp": first["webhook-timestamp"]})


def test_a_plain_secret_verifies_as_whsec_and_its_base64(receiver, sid):
    plain = hooked_stack(receiver, PLAIN_SECRET)
    try:
        end_session(plain, sid, "plain secret")
        _, headers, body = receiver.wait_accepted(sid)[-1]
    finally:
        plain.stop()
    # What README says to do with a secret that is not whsec_: pass its
    # bytes, base64-encoded, after `whsec_` (or the bytes themselves).
    as_whsec = "whsec_" + base64.b64encode(PLAIN_SECRET.encode()).decode()
    assert Webhook(as_whsec).verify(body, headers)["session_id"] == sid
    assert Webhook(PLAIN_SECRET.encode()).verify(body, headers)["session_id"] == sid
