"""Fixtures for the real-model suite: llama.cpp's server (llama-cpp-python)
with SmolLM2-135M-Instruct, and recall in front of it through a recording
tap (tests/sdk/tap.py), so that the tests assert on what recall stored and
sent, never on what a 135M model says.

Without the server and the models (RECALL_TEST_LLAMA_PYTHON,
RECALL_TEST_LLAMA_MODEL, RECALL_TEST_MINILM_DIR: `.ci/models` installs
them), the suite says
SKIPPED on a developer's machine, and fails in CI (CI=true).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import llama  # noqa: E402
from launch import Stack  # noqa: E402

IN_CI = os.environ.get("CI") == "true"


def _why_not() -> str | None:
    found = llama.configured()
    return found if isinstance(found, str) else None


def pytest_collection_modifyitems(config, items):
    why = _why_not()
    if why is None:
        return
    if IN_CI:
        # Collected, then failed: a CI run without the real model is red.
        return
    print(f"\nSKIPPED: the real-model suite: {why}")
    for item in items:
        item.add_marker(pytest.mark.skip(reason=f"SKIPPED: {why}"))


@pytest.fixture(scope="session")
def llama_server():
    why = _why_not()
    if why is not None:
        pytest.fail(f"the real-model suite cannot run in CI: {why}")
    python, model = llama.configured()
    log = Path(tempfile.mkdtemp(prefix="recall-llama-")) / "llama.log"
    server = llama.LlamaServer(python, model, log).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def minilm_dir():
    """all-MiniLM-L6-v2's folder, for the built-in embedder (`.ci/models`
    unpacks it and sets RECALL_TEST_MINILM_DIR)."""
    found = os.environ.get("RECALL_TEST_MINILM_DIR")
    if found and (Path(found) / "model.safetensors").is_file():
        return found
    why = f"RECALL_TEST_MINILM_DIR ({found!r}) holds no model.safetensors"
    if IN_CI:
        pytest.fail(f"the real-model suite cannot run in CI: {why}")
    pytest.skip(f"SKIPPED: {why}")


def real_stack(server, extra_config: str = "", upstream_config: str = "max_concurrent = 1\ntimeout_secs = 300",
               **kw) -> Stack:
    # A real model on a busy 2-core machine may take long to finish a reply
    # whose original a drain reads.
    kw.setdefault("drain_timeout_secs", 120)
    return Stack("tap", forward=server.url, extra_config=extra_config, upstream_config=upstream_config, **kw)


@pytest.fixture(autouse=True)
def _logs_on_failure(request):
    yield


@pytest.fixture
def sid(request):
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:60]
    return f"real-{name}-{uuid.uuid4().hex[:8]}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        for stack in getattr(item, "stacks", []):
            report.sections.append(("recall and tap logs", stack.log_tail()))
        server = item.funcargs.get("llama_server") if hasattr(item, "funcargs") else None
        if server is not None:
            report.sections.append(("llama.cpp server log", server.tail()))
    return report
