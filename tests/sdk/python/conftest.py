"""Fixtures for the OpenAI Python SDK suite: one recall per upstream kind.

Every test runs twice, against the scripted upstream and against llmock.
"""

from __future__ import annotations

import re
import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from launch import UPSTREAMS, Stack  # noqa: E402


@pytest.fixture(scope="module", params=UPSTREAMS)
def stack(request):
    """recall in front of the scripted upstream, then in front of llmock."""
    s = Stack(request.param).start()
    request.node.stack = s
    yield s
    s.stop()


@pytest.fixture(autouse=True)
def _fresh_upstream(request):
    """Each test starts with an upstream that has received nothing."""
    if "stack" in request.fixturenames:
        stack = request.getfixturevalue("stack")
        stack.reset()
        request.node.stack = stack
    yield


@pytest.fixture
def sid(request):
    """A session id of this test's own."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", request.node.name)[:80]
    return f"py-{name}-{uuid.uuid4().hex[:8]}"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    stack = getattr(item, "stack", None)
    if report.failed and stack is not None:
        report.sections.append(("recall and upstream logs", stack.log_tail()))
    return report
