//! The seam between recall and an upstream's protocol: where a turn is
//! sent, the body it is sent as, how the answer is read (a stream's events,
//! a whole completion), the shape of an answer recall gives itself (from
//! the answer cache), and the calls recall makes for itself (a summary, a
//! note, facts; embeddings) with their answers.
//!
//! One protocol is spoken today, OpenAI's chat completions, which every
//! OpenAI-compatible server (llama.cpp, vLLM, Ollama, the hosted APIs)
//! serves. Another is a variant here and a file beside `chat_body.rs`: the
//! matches below are where it must say what it does, and the callers (the
//! upstream client, the relay, the chat turn, recall's own models) ask the
//! protocol rather than knowing a path or a wire shape.

use std::borrow::Borrow;

use serde_json::{Map, Value};

use crate::config::UpstreamConfig;
use crate::exchange::accumulate::{self, CompletionRead, Event};
use crate::memory::message::Message;

mod asks;
mod cached;
mod chat_body;
mod embeddings;
mod rules;

pub use asks::Said;

pub use chat_body::RECALL_SUMMARY;
pub use rules::{TurnInfo, VendorRules};
// The vendor mode, as configured (`vendor = "openai" | "custom"`).
pub use crate::config::Vendor;

/// The wire protocol an upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `POST {base_url}/chat/completions`, answered by a `chat.completion`
    /// or a stream of `chat.completion.chunk` events.
    ChatCompletions,
}

impl Protocol {
    /// The protocol an upstream's config asks for.
    pub fn of(_config: &UpstreamConfig) -> Self {
        Protocol::ChatCompletions
    }

    /// Where a turn goes, relative to the upstream's base URL.
    pub fn turn_path(self) -> &'static str {
        match self {
            Protocol::ChatCompletions => "/chat/completions",
        }
    }

    /// The turn's body, serialised: the client's `body` with its messages
    /// replaced by `instructions` and `history` (the window, as
    /// `render::outbound` made it for this upstream), rewritten for the
    /// vendor mode in `rules`.
    pub fn turn_body<H: Borrow<Message>>(
        self,
        rules: &VendorRules,
        body: &Map<String, Value>,
        instructions: &[Message],
        history: &[H],
        turn: Option<TurnInfo<'_>>,
        now_ms: i64,
    ) -> serde_json::Result<Vec<u8>> {
        match self {
            Protocol::ChatCompletions => {
                chat_body::write(rules, body, instructions, history, turn, now_ms)
            }
        }
    }

    /// One event of a streamed answer (an SSE event's data), read once.
    pub fn stream_event(self, data: &str) -> Event {
        match self {
            Protocol::ChatCompletions => Event::parse(data),
        }
    }

    /// A whole (non-streamed) answer: the reply it holds, and with `parts`
    /// what the Responses API rebuilds its output from. `None` when the
    /// body is not an answer this protocol knows.
    pub fn read_whole(self, body: &[u8], parts: bool) -> Option<CompletionRead> {
        match self {
            Protocol::ChatCompletions => accumulate::completion_read(body, parts),
        }
    }

    /// An answer recall gives without a call (a cache hit), as the client's
    /// SDK expects it from this protocol: a whole body, or with `stream` a
    /// stream's text (and a usage event when `include_usage`).
    pub fn given_answer(self, model: &str, text: &str, created_ms: i64) -> Value {
        match self {
            Protocol::ChatCompletions => cached::completion(model, text, created_ms),
        }
    }

    /// `given_answer` as the stream a streaming client expects.
    pub fn given_stream(
        self,
        model: &str,
        text: &str,
        created_ms: i64,
        include_usage: bool,
    ) -> String {
        match self {
            Protocol::ChatCompletions => cached::stream(model, text, created_ms, include_usage),
        }
    }

    /// The body of one of recall's own calls (sent to the turn's path):
    /// `messages` answered, not streamed, in at most `max_tokens`, in `response_format`'s shape
    /// when one is given.
    pub fn ask_body(
        self,
        model: &str,
        messages: &[Value],
        max_tokens: u32,
        response_format: Option<Value>,
    ) -> Vec<u8> {
        match self {
            Protocol::ChatCompletions => asks::body(model, messages, max_tokens, response_format),
        }
    }

    /// The answer to one of recall's own calls; else why the body is not
    /// one.
    pub fn read_said(self, body: &[u8]) -> Result<Said, String> {
        match self {
            Protocol::ChatCompletions => asks::read(body),
        }
    }

    /// Where embeddings are asked for, relative to the base URL.
    pub fn embeddings_path(self) -> &'static str {
        match self {
            Protocol::ChatCompletions => "/embeddings",
        }
    }

    /// The request for `texts`' vectors, each in `encoding_format`.
    pub fn embeddings_body(self, model: &str, texts: &[String], encoding_format: &str) -> Vec<u8> {
        match self {
            Protocol::ChatCompletions => embeddings::body(model, texts, encoding_format),
        }
    }

    /// The `n` vectors of an embeddings answer, in input order; else what
    /// is wrong with it.
    pub fn read_embeddings(self, body: &[u8], n: usize) -> Result<Vec<Vec<f32>>, String> {
        match self {
            Protocol::ChatCompletions => embeddings::vectors(body, n),
        }
    }
}
