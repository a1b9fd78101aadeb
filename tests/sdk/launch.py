#!/usr/bin/env python3
"""Starts an upstream and a real recall binary in front of it, for the SDK tests.

Used by the Python suite as a module (`Stack`) and by the Node suite as a
command:

    python3 tests/sdk/launch.py scripted|llmock

prints one JSON line, {"recall_url", "upstream_url", "upstream", "recall_log"},
then keeps both servers running until its standard input closes or it gets
SIGTERM, and tears them down.

The upstream is either `scripted_upstream.py` (beside this file) or `llmock`
from PyPI (`llmock serve`, found next to this Python or on PATH). recall is
`$RECALL_BIN`, else `$CARGO_TARGET_DIR/debug/recall`, else
`target/debug/recall` under the repository root. Its config and logs go in
a temporary directory, removed at the end unless RECALL_SDK_KEEP_LOGS is set.
Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
UPSTREAMS = ("scripted", "llmock")
# "tap": `tap.py` in front of a real model server (`Stack(forward=URL)`).
KINDS = UPSTREAMS + ("tap",)

# llmock's answers: the echo style repeats the prompt (every message's
# content, joined), so what recall sent upstream shows in the answer.
LLMOCK_ARGS = ["--response-style", "echo", "--stream-chunk-delay-ms", "2", "--log-level", "warning"]

SYSTEM_MESSAGE = "You are recall's SDK test assistant."


def recall_bin() -> Path:
    if os.environ.get("RECALL_BIN"):
        path = Path(os.environ["RECALL_BIN"])
    else:
        target = Path(os.environ.get("CARGO_TARGET_DIR") or "target")
        if not target.is_absolute():
            target = REPO / target
        path = target / "debug" / "recall"
    if not path.is_file():
        raise RuntimeError(f"recall binary not found at {path}: run `cargo build` (or set RECALL_BIN)")
    return path


def llmock_bin() -> str:
    beside = Path(sys.executable).parent / "llmock"
    if beside.is_file():
        return str(beside)
    found = shutil.which("llmock")
    if not found:
        raise RuntimeError("llmock is not installed: pip install -r tests/sdk/python/requirements.txt")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    """Children get SIGTERM if the launcher dies, so no server outlives a run."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


def http(method: str, url: str, body=None, timeout: float = 5.0):
    """(status, parsed JSON or text) of one request; never raises on HTTP errors."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


@contextlib.contextmanager
def shipped_config(name: str, edit=None):
    """recall on `config/<name>` as shipped (its mock://echo upstream), on a
    port of its own, or as `edit` (text to text) changes it; yields its
    base URL."""
    port = free_port()
    text = (REPO / "config" / name).read_text()
    if edit is not None:
        text = edit(text)
    config = Path(tempfile.mkdtemp()) / name
    config.write_text(re.sub(r"(?m)^listen = .*$", f'listen = "127.0.0.1:{port}"', text))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RECALL_")}
    proc = subprocess.Popen([str(recall_bin()), "--config", str(config)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if http("GET", f"{base}/readyz", timeout=1.0)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class Stack:
    """An upstream (scripted or llmock) and recall in front of it."""

    def __init__(self, upstream: str = "scripted", extra_config: str = "", env: dict | None = None,
                 forward: str = "", upstream_config: str = "", window_messages: int = 20,
                 drain_timeout_secs: int = 10, config_from=None, links: dict | None = None):
        if upstream not in KINDS:
            raise ValueError(f"upstream must be one of {KINDS}, not {upstream!r}")
        if (upstream == "tap") != bool(forward):
            raise ValueError("a tap, and only a tap, forwards to a server")
        self.upstream = upstream
        self.forward = forward
        # Keys added to the [[upstreams]] entry (max_concurrent, say).
        self.upstream_config = upstream_config
        self.window_messages = window_messages
        self.drain_timeout_secs = drain_timeout_secs
        self.extra_config = extra_config
        # A config of the caller's instead of ours: called with recall's
        # port and the upstream's base URL.
        self.config_from = config_from
        # Variables recall gets on top of ours (a webhook secret, say).
        self.env = dict(env or {})
        self.dir = Path(tempfile.mkdtemp(prefix=f"recall-sdk-{upstream}-"))
        # Paths under recall's working directory (this one) and what they
        # point at: the files a config names relative to it.
        for name, target in (links or {}).items():
            (self.dir / name).parent.mkdir(parents=True, exist_ok=True)
            (self.dir / name).symlink_to(target)
        self.procs: list[subprocess.Popen] = []
        self.recall_url = ""
        self.upstream_url = ""
        self.recall_log = self.dir / "recall.log"
        self.upstream_log = self.dir / "upstream.log"

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> "Stack":
        try:
            self._start_upstream()
            self._start_recall()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, argv, log: Path, env=None) -> subprocess.Popen:
        out = open(log, "ab")
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=env, cwd=self.dir, preexec_fn=_die_with_parent,
        )
        out.close()
        self.procs.append(proc)
        return proc

    def _wait_ready(self, proc: subprocess.Popen, url: str, log: Path, what: str, within: float = 30.0):
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
            try:
                status, _ = http("GET", url, timeout=1.0)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{what} was not ready at {url} within {within}s:\n{log.read_text(errors='replace')[-3000:]}")

    def _start_upstream(self):
        # A port picked here may be taken by someone else before the server
        # binds it: try a few.
        for attempt in range(3):
            port = free_port()
            if self.upstream == "scripted":
                argv = [sys.executable, str(HERE / "scripted_upstream.py"), "--port", str(port)]
                health = f"http://127.0.0.1:{port}/health"
            elif self.upstream == "tap":
                argv = [sys.executable, str(HERE / "tap.py"), "--forward", self.forward, "--port", str(port), "--greedy"]
                health = f"http://127.0.0.1:{port}/health"
            else:
                argv = [llmock_bin(), "serve", "--host", "127.0.0.1", "--port", str(port), *LLMOCK_ARGS]
                health = f"http://127.0.0.1:{port}/health"
            proc = self._spawn(argv, self.upstream_log)
            try:
                self._wait_ready(proc, health, self.upstream_log, f"the {self.upstream} upstream")
                self.upstream_url = f"http://127.0.0.1:{port}"
                return
            except RuntimeError:
                self._kill(proc)
                if attempt == 2:
                    raise

    def _start_recall(self):
        binary = recall_bin()
        for attempt in range(3):
            port = free_port()
            config = self.dir / "recall.toml"
            text = self.config_from(port, f"{self.upstream_url}/v1") if self.config_from else self.config(port)
            config.write_text(text)
            env = {k: v for k, v in os.environ.items() if not k.startswith("RECALL_")}
            env["RUST_LOG"] = os.environ.get("RECALL_SDK_LOG", "recall=info,warn")
            env["NO_COLOR"] = "1"  # plain log lines, shown when a test fails
            env.update(self.env)
            proc = self._spawn([str(binary), "--config", str(config)], self.recall_log, env=env)
            try:
                self._wait_ready(proc, f"http://127.0.0.1:{port}/readyz", self.recall_log, "recall")
                self.recall_url = f"http://127.0.0.1:{port}"
                return
            except RuntimeError:
                self._kill(proc)
                if attempt == 2:
                    raise

    def config(self, port: int) -> str:
        return f"""# Written by tests/sdk/launch.py
[server]
listen = "127.0.0.1:{port}"
shutdown_grace_secs = 1

[storage]
backend = "memory"

[history]
window_messages = {self.window_messages}              # 20: every turn of a test's conversation is sent
max_messages = 200

[interruption]
capture_original = true
drain_timeout_secs = {self.drain_timeout_secs}

[log]
level = "info"

[[system_messages]]
content = "{SYSTEM_MESSAGE}"

[[upstreams]]
name = "{self.upstream}"
base_url = "{self.upstream_url}/v1"
# no api_key_env: the client's Authorization header is forwarded
{self.upstream_config}
{self.extra_config}
"""

    @staticmethod
    def _kill(proc: subprocess.Popen):
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def stop(self):
        for proc in reversed(self.procs):
            self._kill(proc)
        self.procs.clear()
        # The config and logs go too, unless asked to keep them.
        if not os.environ.get("RECALL_SDK_KEEP_LOGS"):
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def info(self) -> dict:
        return {
            "recall_url": self.recall_url,
            "upstream_url": self.upstream_url,
            "upstream": self.upstream,
            "recall_log": str(self.recall_log),
            "upstream_log": str(self.upstream_log),
        }

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for name, path in (("recall", self.recall_log), (self.upstream, self.upstream_log)):
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                out.append(f"--- {name} log ({path}) ---\n" + "\n".join(tail))
        return "\n".join(out)

    # -- what the upstream saw ------------------------------------------------

    def received(self) -> list[dict]:
        """The bodies of the chat completions the upstream received, oldest first."""
        if self.upstream in ("scripted", "tap"):
            _, entries = http("GET", f"{self.upstream_url}/_received")
            return [e["body"] for e in entries if e["path"].endswith("/chat/completions")]
        _, journal = http("GET", f"{self.upstream_url}/_llmock/requests", timeout=10)
        return [r["body"] for r in journal["requests"] if r["path"].endswith("/chat/completions")]

    def reset(self):
        """Forgets what the upstream received (and llmock's queued behaviours)."""
        if self.upstream in ("scripted", "tap"):
            http("DELETE", f"{self.upstream_url}/_received")
        else:
            http("POST", f"{self.upstream_url}/_llmock/reset")

    def llmock(self, *behaviors: dict):
        """Queues llmock scenario behaviours, e.g. {"type": "fail", "status": 400}."""
        assert self.upstream == "llmock", "scenarios are llmock's"
        status, body = http("POST", f"{self.upstream_url}/_llmock/scenario", {"behaviors": list(behaviors)})
        assert status == 201, body

    # -- recall's session API -------------------------------------------------

    def entries(self) -> list[dict]:
        """Everything a tap recorded: method, path, body, started, ended, status."""
        assert self.upstream == "tap", "timings are a tap's"
        return http("GET", f"{self.upstream_url}/_received")[1]

    def history(self, session: str):
        return http("GET", f"{self.recall_url}/v1/sessions/{session}/history")

    def wait_history(self, session: str, pred, within: float = 10.0, what: str = "a matching history"):
        """Polls the history until `pred(contents)` holds; returns the contents."""
        deadline = time.monotonic() + within
        last = None
        while True:
            status, last = self.history(session)
            if status == 200 and pred(last["contents"]):
                return last["contents"]
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {within}s waiting for {what} in {session}: {last}")
            time.sleep(0.02)


def main(argv) -> int:
    if len(argv) != 1 or argv[0] not in UPSTREAMS:
        print(f"usage: {Path(__file__).name} {'|'.join(UPSTREAMS)}", file=sys.stderr)
        return 2
    stack = Stack(argv[0])

    def on_signal(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        stack.start()
        print(json.dumps(stack.info()), flush=True)
        sys.stdin.read()  # until the caller closes our stdin (or goes away)
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
