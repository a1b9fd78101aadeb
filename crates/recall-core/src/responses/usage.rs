//! A Response's `usage`, from chat's. Pure.

use serde::Serialize;
use serde_json::Value;

use crate::json;

/// A Response's `usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Usage {
    input_tokens: u64,
    input_tokens_details: Cached,
    output_tokens: u64,
    output_tokens_details: Reasoning,
    total_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct Cached {
    cached_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
struct Reasoning {
    reasoning_tokens: u64,
}

impl Usage {
    pub(super) fn write(&self, out: &mut Vec<u8>) {
        let mut n = |key: &str, v: u64, close: &str| {
            out.extend_from_slice(key.as_bytes());
            // A number is written without escaping anything.
            let _ = json::value(out, &v);
            out.extend_from_slice(close.as_bytes());
        };
        n("{\"input_tokens\":", self.input_tokens, "");
        n(
            ",\"input_tokens_details\":{\"cached_tokens\":",
            self.input_tokens_details.cached_tokens,
            "}",
        );
        n(",\"output_tokens\":", self.output_tokens, "");
        n(
            ",\"output_tokens_details\":{\"reasoning_tokens\":",
            self.output_tokens_details.reasoning_tokens,
            "}",
        );
        n(",\"total_tokens\":", self.total_tokens, "}");
    }

    /// Chat's counts, in the order chat names them: prompt, cached,
    /// completion, reasoning, total.
    pub(super) fn of_chat([prompt, cached, completion, reasoning, total]: [u64; 5]) -> Usage {
        Usage {
            input_tokens: prompt,
            input_tokens_details: Cached {
                cached_tokens: cached,
            },
            output_tokens: completion,
            output_tokens_details: Reasoning {
                reasoning_tokens: reasoning,
            },
            total_tokens: total,
        }
    }
}

/// Chat's usage in the Responses API's words (`None`, written `null`,
/// when the upstream gave none).
pub fn usage(chat: &Value) -> Option<Usage> {
    if !chat.is_object() {
        return None;
    }
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    Some(Usage::of_chat([
        n(&chat["prompt_tokens"]),
        n(&chat["prompt_tokens_details"]["cached_tokens"]),
        n(&chat["completion_tokens"]),
        n(&chat["completion_tokens_details"]["reasoning_tokens"]),
        n(&chat["total_tokens"]),
    ]))
}
