"""Pipecat through recall, in text mode: its OpenAI LLM service with
`base_url` at the session's path, its context aggregators, typed turns
(transcription frames, no audio), barge-ins mid-reply, and the next turn.

Pipecat keeps its own context and resends it whole every turn, with each
cut reply shortened to what went out before the cut. Asserted on recall's
record: every message stored once (no duplicate from the resends); each
cut reply stored as heard with its complete original, `cut_by:
"new_request"` although Pipecat closes the stream before it sends the next
turn; the developer note Pipecat adds after a barge-in that yields no
transcript kept in its place, sent there and never as a top-level
instruction; and the setup shown in README's Pipecat snippet raising no
deprecation warning of the installed Pipecat.

Runs against the scripted upstream ("stall ..." streams three words, then
pauses) and against llmock (a stall queued for each cut reply), so each
interruption lands mid-reply.
"""

from __future__ import annotations

import asyncio
import sys
import time
import warnings

from loguru import logger
from pipecat.frames.frames import (
    EndFrame,
    InterimTranscriptionFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    TranscriptionFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.turns.empty_user_turn import DEFAULT_EMPTY_USER_TURN_INTERRUPTED_PROMPT as NOTE
from pipecat.turns.user_start import TranscriptionUserTurnStartStrategy
from pipecat.turns.user_stop import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.utils.time import time_now_iso8601
from pipecat.workers.runner import WorkerRunner

from launch import SYSTEM_MESSAGE, http
from test_openai_sdk import API_KEY, MODEL

# Pipecat logs every frame at DEBUG; its warnings are enough here.
logger.remove()
logger.add(sys.stderr, level="WARNING")

PROMPT = "You are a helpful assistant. Keep it short."
USER = "caller"
U1 = "stall: tell me a story"
U2 = "stall: no, a joke instead"
U3 = "what did I say first?"
# llmock: a few chunks, then a pause far longer than it takes to barge in.
STALL = {"type": "stream_fault", "kind": "stall", "after_chunks": 4, "stall_seconds": 1.5}


class Heard(FrameProcessor):
    """What the LLM service sent down the pipeline, reply by reply."""

    def __init__(self):
        super().__init__()
        self.replies: list[str] = []
        self.ended = 0

    async def process_frame(self, frame, direction: FrameDirection):
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMFullResponseStartFrame):
            self.replies.append("")
        elif isinstance(frame, LLMTextFrame) and self.replies:
            self.replies[-1] += frame.text
        elif isinstance(frame, LLMFullResponseEndFrame):
            self.ended = len(self.replies)
        await self.push_frame(frame, direction)


async def until(what: str, pred, within: float = 20.0):
    deadline = time.monotonic() + within
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.01)


def typed(text: str) -> TranscriptionFrame:
    """A typed message, as an STT service's final transcription."""
    return TranscriptionFrame(text, USER, time_now_iso8601())


def text_mode() -> LLMUserAggregatorParams:
    """README's text-mode setup: a transcription starts a turn (and cuts the
    bot off if it is replying), and the turn ends shortly after the last
    one. Pipecat's default turn detection needs audio (VAD, smart-turn)."""
    return LLMUserAggregatorParams(
        user_turn_strategies=UserTurnStrategies(
            start=[TranscriptionUserTurnStartStrategy()],
            stop=[SpeechTimeoutUserTurnStopStrategy()],
        ),
    )


def counted(stack, cause: str) -> float:
    status, text = http("GET", f"{stack.recall_url}/metrics")
    assert status == 200, text
    series = f'recall_interruptions_total{{cause="{cause}"}} '
    return float(next(l for l in text.splitlines() if l.startswith(series)).split()[-1])


async def converse(stack, sid: str) -> list[dict]:
    """The conversation, driven through a running pipeline; returns
    Pipecat's context at the end."""
    llm = OpenAILLMService(
        api_key=API_KEY,
        base_url=f"{stack.recall_url}/sessions/{sid}/v1",
        settings=OpenAILLMService.Settings(model=MODEL, system_instruction=PROMPT),
    )
    context = LLMContext()
    pair = LLMContextAggregatorPair(context, user_params=text_mode())
    heard = Heard()
    worker = PipelineWorker(Pipeline([pair.user(), llm, heard, pair.assistant()]), cancel_on_idle_timeout=False)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker, frame):
        started.set()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())

    try:
        await asyncio.wait_for(started.wait(), 10)
        await worker.queue_frame(typed(U1))
        await until("the first reply to begin", lambda: len(heard.replies) == 1 and heard.replies[0])
        # The user cuts it off: the app interrupts, then the next turn comes.
        await worker.queue_frame(InterruptionFrame())
        await worker.queue_frame(typed(U2))
        await until("the second reply to begin", lambda: len(heard.replies) == 2 and heard.replies[1])
        # A barge-in no transcript comes of: Pipecat ends the empty turn after
        # `user_turn_stop_timeout` (5 s), adds its developer note, runs the LLM.
        await worker.queue_frame(InterimTranscriptionFrame("...", USER, time_now_iso8601()))
        await until("the reply to Pipecat's note", lambda: heard.ended == 3, within=30)
        await worker.queue_frame(typed(U3))
        await until("the reply to the next turn", lambda: heard.ended == 4)
    finally:
        await worker.queue_frame(EndFrame())
        await asyncio.wait_for(running, 15)
    return [dict(m) for m in context.messages]


def text(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.get("text", "") for p in content or [] if isinstance(p, dict))


def test_a_pipecat_pipeline_in_text_mode_keeps_memory_and_interruptions_exact(stack, sid):
    if stack.upstream == "llmock":
        stack.llmock(STALL, STALL)
    barge_ins, closes = counted(stack, "new_request"), counted(stack, "client_gone")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        context = asyncio.run(converse(stack, sid))
    # Pipecat's own deprecations say "is deprecated since <version>".
    deprecated = [str(w.message) for w in caught if "deprecated since" in str(w.message)]
    assert not deprecated, deprecated

    # Pipecat's context: the two cut replies as heard, its note, and the rest.
    roles = ["user", "assistant", "user", "assistant", "developer", "assistant", "user", "assistant"]
    assert [m["role"] for m in context] == roles, context
    assert [text(m["content"]) for m in context][::2][:2] == [U1, U2]
    assert text(context[4]["content"]) == NOTE and text(context[6]["content"]) == U3

    # Every message once, in Pipecat's order: nothing duplicated by its resends.
    contents = stack.wait_history(sid, lambda c: c and c[-1]["role"] == "assistant", what="the last reply")
    assert [m["role"] for m in contents] == roles, contents
    # The cut replies' drains end with their complete originals.
    contents = stack.wait_history(
        sid,
        lambda c: all(c[i]["metadata"].get("original_complete") for i in (1, 3)),
        within=15,
        what="both cut replies' complete originals",
    )
    for stored, sent in zip(contents, context):
        assert stored["content"].rstrip() == text(sent["content"]).rstrip(), (stored, sent)
    for i in (1, 3):
        cut = contents[i]["metadata"]
        assert cut["interrupted"] is True, contents[i]
        assert cut["cut_by"] == "new_request", contents[i]
        heard_text = contents[i]["content"]
        assert heard_text and cut["original"].startswith(heard_text), contents[i]
        assert len(cut["original"]) > len(heard_text), "the reply was cut mid-reply"
    # The note is the client's, kept in its place and not an instruction.
    assert contents[4]["content"] == NOTE and contents[4]["metadata"]["source"] == "message"
    if stack.upstream == "scripted":
        assert contents[5]["content"] == f"noted: {NOTE}"
        assert contents[7]["content"] == f"You first said: {U1}"

    # What the upstream was sent: instructions first, then the conversation
    # in order, the note once, where Pipecat put it.
    got = stack.received()
    assert len(got) == 4, [g["messages"] for g in got]
    instructions = [("system", SYSTEM_MESSAGE), ("system", PROMPT)]
    def seen(body):
        return [(m["role"], text(m["content"])) for m in body["messages"]]
    assert seen(got[2])[:2] == instructions and seen(got[2])[-1] == ("developer", NOTE)
    last = seen(got[3])
    assert last[:2] == instructions
    assert [r for r, _ in last[2:]] == roles[:-1], last
    assert [r for r, _ in last].count("developer") == 1, last
    assert [(m["role"], m["content"].rstrip()) for m in contents[:-1]] == [(r, t.rstrip()) for r, t in last[2:]]

    # Both barge-ins are counted as barge-ins, at once; no close as a client that left.
    assert counted(stack, "new_request") - barge_ins == 2
    assert counted(stack, "client_gone") - closes == 0
