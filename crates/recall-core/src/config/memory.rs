//! `[history]`, `[interruption]` and `[[system_messages]]`: what a session
//! keeps, what the upstream is sent of it, and how replies are cut off.

use serde::{Deserialize, Serialize};

/// No model reads this many tokens: a larger `window_tokens` is a typo,
/// not a wish.
pub const MAX_WINDOW_TOKENS: usize = 100_000_000;

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistoryConfig {
    /// How many of the newest stored messages are sent upstream (0 = all).
    pub window_messages: usize,
    /// Upper bound on the characters of the history sent upstream (0 = none).
    pub window_chars: usize,
    /// Upper bound on the tokens of the history sent upstream, counted with
    /// the model's tokenizer (estimated for non-OpenAI models) (0 = none).
    pub window_tokens: usize,
    /// How many messages a session keeps (0 = all).
    pub max_messages: usize,
    /// Bytes of text a session keeps (`Message::byte_cost`), oldest
    /// dropped first, like `max_messages` (0 = no limit).
    pub max_bytes: usize,
    /// When set, a failed upstream call is recorded as an assistant message
    /// with this content and `metadata.source = "llm_failure"`.
    pub failure_message: Option<String>,
}

impl Default for HistoryConfig {
    fn default() -> Self {
        Self {
            window_messages: 20,
            window_chars: 0,
            window_tokens: 0,
            max_messages: 1000,
            max_bytes: 4 * 1024 * 1024,
            failure_message: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct InterruptionConfig {
    /// Keep reading the upstream after the client has gone, to store the
    /// complete reply as `metadata.original`.
    pub capture_original: bool,
    pub drain_timeout_secs: u64,
    pub drain_max_bytes: usize,
    pub on_new_request: OnNewRequest,
    /// A new request of a session arriving within this many ms of its
    /// client closing the reply's stream mid-reply is a barge-in: a client
    /// that cancels before it sends the next turn (Pipecat) is not one that
    /// left. It covers what the user says after the cut and the turn
    /// detection after that. 0 = a close is always `client_gone`.
    pub barge_in_after_close_ms: u64,
}

impl Default for InterruptionConfig {
    fn default() -> Self {
        Self {
            capture_original: true,
            drain_timeout_secs: 30,
            drain_max_bytes: 1024 * 1024,
            on_new_request: OnNewRequest::Interrupt,
            barge_in_after_close_ms: 10_000,
        }
    }
}

/// What a request does when its session still has a reply in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnNewRequest {
    /// Barge-in: the reply in flight is recorded as interrupted.
    Interrupt,
    /// The new request gets 409.
    Reject,
}

/// How an interrupted reply is shown to the model in later turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum InterruptedRendering {
    /// The text that went out, as stored.
    #[default]
    Truncated,
    /// The complete text the model generated.
    Original,
    /// The text that went out followed by a marker.
    Annotated,
}

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SystemMessage {
    #[serde(default = "default_system_role")]
    pub role: String,
    pub content: String,
    #[serde(default)]
    pub name: Option<String>,
}

fn default_system_role() -> String {
    "system".into()
}
