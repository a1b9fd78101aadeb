#!/usr/bin/env python3
"""Live turns with background jobs due, on a one-slot real model server.

Not a test: a measurement for BENCHMARKS.md. It starts llama.cpp's server
(RECALL_TEST_LLAMA_PYTHON, RECALL_TEST_LLAMA_MODEL, as for tests/sdk/real)
and, one after the other, recall in front of it with `max_concurrent = 1`:
  - "none": no memory beyond the window;
  - "jobs": a summary fold due every turn and a fact extraction every turn,
    both by the same model (the embeddings from the built-in mock, so that
    only the chat model's slot is shared).
Each drives the same conversation (TURNS user turns, PAUSE seconds between
a reply and the next turn, as a voice agent's user takes to speak) and
prints each live turn's time, its median and maximum, and the ratio of
the "jobs" figures to the "none" ones, over ROUNDS alternating rounds.

    python3 tests/sdk/real/background_bench.py [--rounds 2] [--turns 8] [--pause 1.0]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import llama  # noqa: E402
from launch import Stack  # noqa: E402

from openai import OpenAI  # noqa: E402

LINES = [
    "Hi, I'm Lan. I work as a nurse in Hanoi.",
    "I am allergic to peanuts, so I have to be careful at parties.",
    "I have two daughters, Mai and Lan, who are six and nine.",
    "My husband is a teacher at a primary school.",
    "We are planning a trip to Da Nang in the summer.",
    "I usually drink green tea in the morning.",
    "On weekends I go running by the lake.",
    "What snack should I bring to my daughter's party?",
]

JOBS = """
[memory]
summarize = true
summary_model = "smollm2"
summary_every_messages = 2

[long_term]
enabled = true
extract_model = "smollm2"
embedding_model = "embedder"
extract_every_turns = 1
"""

MOCK = """
[[upstreams]]
name = "embeddings"
base_url = "mock://echo"
models = ["embedder"]
"""


def run(server, kind: str, turns: int, pause: float) -> list[float]:
    extra = (JOBS + MOCK) if kind == "jobs" else ""
    stack = Stack("tap", forward=server.url, extra_config=extra, window_messages=2,
                  upstream_config='models = ["smollm2"]\nmax_concurrent = 1\ntimeout_secs = 300').start()
    try:
        sid = f"bench-{kind}-{uuid.uuid4().hex[:8]}"
        c = OpenAI(base_url=f"{stack.recall_url}/v1", api_key="unused", max_retries=0, timeout=600,
                   default_headers={"x-session-id": sid, "x-user-id": f"user-{sid}"})
        times = []
        for line in (LINES * 4)[:turns]:
            started = time.monotonic()
            c.chat.completions.create(model="smollm2", max_tokens=32, temperature=0,
                                      messages=[{"role": "user", "content": line}])
            times.append(time.monotonic() - started)
            time.sleep(pause)
        return times
    finally:
        stack.stop()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--pause", type=float, default=1.0)
    args = p.parse_args()
    found = llama.configured()
    if isinstance(found, str):
        print(f"cannot run: {found}", file=sys.stderr)
        return 2
    python, model = found
    server = llama.LlamaServer(python, model, Path(tempfile.mkdtemp()) / "llama.log").start()
    try:
        figures = {"none": [], "jobs": []}
        for r in range(args.rounds):
            for kind in ("none", "jobs") if r % 2 == 0 else ("jobs", "none"):
                t = run(server, kind, args.turns, args.pause)
                figures[kind].append(t)
                print(f"round {r + 1} {kind}: " + " ".join(f"{x:.2f}" for x in t), flush=True)
        med = {k: statistics.median(statistics.median(t) for t in v) for k, v in figures.items()}
        mx = {k: statistics.median(max(t) for t in v) for k, v in figures.items()}
        print(f"\n| | median live turn (s) | slowest live turn (s) |\n|---|---|---|")
        for k in ("none", "jobs"):
            print(f"| {k} | {med[k]:.2f} | {mx[k]:.2f} |")
        print(f"| jobs / none | {med['jobs'] / med['none']:.2f}x | {mx['jobs'] / mx['none']:.2f}x |")
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
