"""llama.cpp's OpenAI-compatible server (the llama-cpp-python package), for the
real-model SDK tests: started with a small GGUF model on a free port, stopped
at the end. Standard library only; the server runs in the Python that has
llama-cpp-python installed (`RECALL_TEST_LLAMA_PYTHON`), which need not be
the test's own.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from launch import _die_with_parent, free_port, http

# The name clients send: the server answers with its one model whatever the
# request names, but recall routes by it.
MODEL = "smollm2"


class LlamaServer:
    def __init__(self, python: str, model: str, log: Path):
        self.python = python
        self.model = model
        self.log = log
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, within: float = 180.0) -> "LlamaServer":
        port = free_port()
        argv = [
            self.python, "-m", "llama_cpp.server",
            "--model", self.model, "--model_alias", MODEL,
            "--host", "127.0.0.1", "--port", str(port),
            "--n_threads", "2", "--n_ctx", "4096",
            # One request at a time, each to its end: a new request does not
            # cut the one generating (recall decides what is cut).
            "--interrupt_requests", "False",
        ]
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                     preexec_fn=_die_with_parent)
        out.close()
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama_cpp.server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if http("GET", f"{url}/v1/models", timeout=1.0)[0] == 200:
                    self.url = url
                    return self
            except OSError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"llama_cpp.server was not ready within {within}s:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def configured() -> tuple[str, str] | str:
    """(python, model) from the environment, or why the tests cannot run."""
    python = os.environ.get("RECALL_TEST_LLAMA_PYTHON", "")
    model = os.environ.get("RECALL_TEST_LLAMA_MODEL", "")
    if not python or not model:
        return "RECALL_TEST_LLAMA_PYTHON and RECALL_TEST_LLAMA_MODEL are not set (.ci/models sets them)"
    if not Path(python).is_file():
        return f"RECALL_TEST_LLAMA_PYTHON={python} is not a file"
    if not Path(model).is_file():
        return f"RECALL_TEST_LLAMA_MODEL={model} is not a file"
    return python, model
