//! Token counts for `[history] window_tokens`.
//!
//! OpenAI models are counted with their real tokenizer (tiktoken's
//! `o200k_base` or `cl100k_base`); any other model with an estimate of one
//! token per four characters, rounded up, since recall cannot know the
//! tokenizer of a llama or a qwen.
//!
//! A message costs what OpenAI's cookbook counts: 3 tokens of framing,
//! plus its role, its content, its name (and 1 more token when it has one),
//! its tool calls as JSON text and its `tool_call_id`. This is an
//! approximation: the framing is OpenAI's published estimate, not part of
//! the API; tool calls are counted as the JSON recall sends, not as the
//! model's internal format; content parts other than text (images, audio)
//! are counted as their JSON, which overestimates inline images; other
//! fields (`refusal`, extensions) are not counted. A message is counted as
//! stored, before an upstream's rendering of interrupted replies. The 3
//! tokens that prime the reply are counted by no message: they do not
//! depend on how much history is sent.
//!
//! Counting a message is done once: the count is cached in the message
//! (`message::Counted`, by the encoding's `id`), so that a window over a
//! long history costs a load per message, not a tokenisation.

use std::sync::OnceLock;

use serde_json::Value;
use tiktoken_rs::tokenizer::{get_tokenizer, Tokenizer};
use tiktoken_rs::CoreBPE;

use crate::memory::message::Message;

/// How a model's text is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Encoding {
    /// Not an OpenAI model: characters / 4, rounded up.
    #[default]
    Approx,
    /// gpt-4, gpt-3.5-turbo.
    Cl100k,
    /// gpt-4o, gpt-4.1, gpt-4.5, gpt-5, o1, o3, o4, gpt-oss.
    O200k,
}

type Slot = OnceLock<Option<CoreBPE>>;
type Build = fn() -> Result<CoreBPE, String>;

/// Framing tokens per message, and the extra one a `name` costs (OpenAI's
/// cookbook, for every model since gpt-3.5-turbo-0613).
const PER_MESSAGE: usize = 3;
const PER_NAME: usize = 1;

/// Text longer than this is tokenised in pieces. The regex engine under
/// tiktoken fails (and tiktoken-rs panics) on runs of whitespace of about a
/// million characters, and its cost grows faster than the length of a
/// run; pieces of this size stay far from both (see `split`).
const PIECE_BYTES: usize = 32 * 1024;

impl Encoding {
    /// The encoding of a model, by tiktoken's table of OpenAI model names
    /// (exact names and prefixes such as `gpt-4o-`, `ft:` models too). A
    /// provider prefix such as `openai/` is ignored. Legacy completion
    /// models and everything else are estimated.
    pub fn for_model(model: &str) -> Encoding {
        let name = model.rsplit('/').next().unwrap_or(model);
        match get_tokenizer(name) {
            Some(Tokenizer::O200kBase | Tokenizer::O200kHarmony) => Encoding::O200k,
            Some(Tokenizer::Cl100kBase) => Encoding::Cl100k,
            _ => Encoding::Approx,
        }
    }

    /// Where the tokenizer is kept once built, and how to build it.
    fn cell(self) -> Option<(&'static Slot, Build)> {
        static O200K: Slot = OnceLock::new();
        static CL100K: Slot = OnceLock::new();
        match self {
            Encoding::Approx => None,
            Encoding::O200k => Some((&O200K, || {
                tiktoken_rs::o200k_base().map_err(|e| e.to_string())
            })),
            Encoding::Cl100k => Some((&CL100K, || {
                tiktoken_rs::cl100k_base().map_err(|e| e.to_string())
            })),
        }
    }

    /// The tokenizer, built on first use. `None` for the estimate, and if
    /// tiktoken-rs cannot build it (it parses files it embeds, so that
    /// would be a broken build): the estimate is used instead.
    fn bpe(self) -> Option<&'static CoreBPE> {
        let (cell, build) = self.cell()?;
        cell.get_or_init(|| {
            build()
                .inspect_err(|e| {
                    tracing::error!(encoding = ?self, error = %e,
                        "cannot build the tokenizer; estimating tokens as characters / 4")
                })
                .ok()
        })
        .as_ref()
    }

    /// Whether counting can start without building a tokenizer first.
    /// Building one takes a noticeable time and tens of MB, so it is left
    /// to the first request that needs it, not start-up.
    pub fn is_ready(self) -> bool {
        self.cell().is_none_or(|(cell, _)| cell.get().is_some())
    }

    /// Builds the tokenizer now, blocking for as long as that takes, so
    /// that counting under a session's lock never has to.
    pub fn load(self) {
        self.bpe();
    }

    /// Tokens in `text`.
    pub fn count(self, text: &str) -> usize {
        let Some(bpe) = self.bpe() else {
            return approx(text);
        };
        split(text, PIECE_BYTES)
            .map(|piece| {
                // tiktoken-rs unwraps the regex engine's result; a text it
                // cannot split is estimated rather than taking the
                // request down.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    bpe.encode_ordinary(piece).len()
                }))
                .unwrap_or_else(|_| {
                    tracing::warn!(
                        bytes = piece.len(),
                        "the tokenizer failed on a text; estimating it"
                    );
                    approx(piece)
                })
            })
            .sum()
    }

    /// The encoding's id in a message's `Counted` (0 there is none).
    pub(in crate::memory) fn id(self) -> u32 {
        match self {
            Encoding::Approx => 1,
            Encoding::Cl100k => 2,
            Encoding::O200k => 3,
        }
    }
}

fn approx(text: &str) -> usize {
    text.chars().count().div_ceil(4)
}

/// `text` cut into pieces of at most `max` bytes (at least one character
/// each). A cut goes after a line break that ends a run of whitespace,
/// where tiktoken's split patterns also end a piece, so counting the
/// pieces is counting the whole; failing that, before a space that begins
/// a word (usually exact too); failing that, anywhere, which may cost a
/// token.
fn split(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let cut = if rest.len() <= max {
            rest.len()
        } else {
            cut_point(rest, max)
        };
        let (piece, tail) = rest.split_at(cut);
        rest = tail;
        Some(piece)
    })
}

fn cut_point(text: &str, max: usize) -> usize {
    let bytes = text.as_bytes();
    let starts_word = |i: usize| text[i..].chars().next().is_some_and(|c| !c.is_whitespace());
    let after_line_break = (1..=max)
        .rev()
        .find(|&i| bytes[i - 1] == b'\n' && text.is_char_boundary(i) && starts_word(i));
    let before_word = || {
        (1..max).rev().find(|&i| {
            bytes[i] == b' ' && !bytes[i - 1].is_ascii_whitespace() && starts_word(i + 1)
        })
    };
    let anywhere = || {
        (1..=max)
            .rev()
            .find(|&i| text.is_char_boundary(i))
            // A first character longer than `max` is one piece.
            .unwrap_or_else(|| text.char_indices().nth(1).map_or(text.len(), |(i, _)| i))
    };
    after_line_break
        .or_else(before_word)
        .unwrap_or_else(anywhere)
}

impl Message {
    /// Tokens this message costs in a window (see the module's comment),
    /// counted once per encoding it is asked for in a row.
    pub fn tokens(&self, enc: Encoding) -> usize {
        self.counted().get(enc.id()).unwrap_or_else(|| {
            let n = count_message(self, enc);
            self.counted().set(enc.id(), n);
            n
        })
    }
}

/// A message's tokens, by the rules in the module's comment.
pub fn count_message(m: &Message, enc: Encoding) -> usize {
    let mut n = PER_MESSAGE + enc.count(m.role.as_str()) + content_tokens(&m.content, enc);
    if let Some(name) = m.name() {
        n += enc.count(name) + PER_NAME;
    }
    if let Some(calls) = m.tool_calls() {
        n += serde_json::to_string(calls).map_or(0, |json| enc.count(&json));
    }
    if let Some(id) = m.tool_call_id() {
        n += enc.count(id);
    }
    n
}

fn content_tokens(content: &Value, enc: Encoding) -> usize {
    match content {
        Value::Null => 0,
        Value::String(text) => enc.count(text),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part.get("text").and_then(Value::as_str) {
                Some(text) if part.get("type").and_then(Value::as_str) == Some("text") => {
                    enc.count(text)
                }
                _ => enc.count(&part.to_string()),
            })
            .sum(),
        other => enc.count(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::message::Role;
    use serde_json::json;

    const BOTH: [Encoding; 2] = [Encoding::O200k, Encoding::Cl100k];

    #[test]
    fn models_map_to_their_encoding() {
        for model in [
            "gpt-4o",
            "gpt-4o-mini",
            "gpt-4o-2024-08-06",
            "chatgpt-4o-latest",
            "gpt-4.1",
            "gpt-4.1-nano",
            "o1",
            "o3-mini",
            "o4-mini",
            "gpt-5",
            "gpt-5-mini",
            "openai/gpt-4o",
            "ft:gpt-4o-mini-2024-07-18:org::abc",
        ] {
            assert_eq!(Encoding::for_model(model), Encoding::O200k, "{model}");
        }
        for model in [
            "gpt-4",
            "gpt-4-turbo",
            "gpt-3.5-turbo",
            "gpt-3.5-turbo-0125",
        ] {
            assert_eq!(Encoding::for_model(model), Encoding::Cl100k, "{model}");
        }
        for model in [
            "",
            "llama-3.1-8b-instruct",
            "meta-llama/Llama-3.3-70B-Instruct",
            "qwen2.5-72b",
            "claude-sonnet-4",
            "text-davinci-003",
        ] {
            assert_eq!(Encoding::for_model(model), Encoding::Approx, "{model}");
        }
    }

    #[test]
    fn known_texts_have_known_counts() {
        for enc in BOTH {
            assert_eq!(enc.count(""), 0);
            assert_eq!(enc.count("hello world"), 2);
            assert_eq!(enc.count("Hello, world!"), 4);
            assert_eq!(
                enc.count("The quick brown fox jumps over the lazy dog."),
                10
            );
            for role in ["user", "assistant", "tool"] {
                assert_eq!(enc.count(role), 1);
            }
        }
        // The encodings differ where o200k's larger vocabulary pays off.
        assert_eq!(Encoding::O200k.count("héllo wörld 你好世界"), 8);
        assert_eq!(Encoding::Cl100k.count("héllo wörld 你好世界"), 12);
    }

    #[test]
    fn unknown_models_count_characters_over_four_rounded_up() {
        let e = Encoding::Approx;
        assert_eq!(e.count(""), 0);
        assert_eq!(e.count("abcd"), 1);
        assert_eq!(e.count("abcde"), 2);
        // Characters, not bytes.
        assert_eq!(e.count("héllo wörld"), 3);
        // 3 + "user" 1 + "hello world" 3
        assert_eq!(
            count_message(&Message::new(Role::User, "hello world"), e),
            7
        );
    }

    #[test]
    fn a_message_costs_framing_role_content_name_and_tool_calls() {
        for enc in BOTH {
            let m = Message::new(Role::User, "hello world");
            assert_eq!(count_message(&m, enc), 3 + 1 + 2);
            let mut named = m.clone();
            named.set_name(Some("hello".into()));
            assert_eq!(count_message(&named, enc), 6 + 1 + 1);
            let mut call = Message::new(Role::Assistant, Value::Null);
            let calls = vec![json!({"id": "c1", "type": "function",
                "function": {"name": "f", "arguments": ""}})];
            let json = serde_json::to_string(&calls).unwrap();
            call.set_tool_calls(Some(calls));
            assert_eq!(count_message(&call, enc), 3 + 1 + enc.count(&json));
            let mut result = Message::new(Role::Tool, "hello world");
            result.set_tool_call_id(Some("call_1".into()));
            assert_eq!(count_message(&result, enc), 3 + 1 + 2 + enc.count("call_1"));
            // Text parts count their text; other parts their JSON.
            let image = json!({"type": "image_url", "image_url": {"url": "https://x/y.png"}});
            let parts = Message::new(
                Role::User,
                json!([{"type": "text", "text": "hello world"}, image.clone()]),
            );
            assert_eq!(
                count_message(&parts, enc),
                3 + 1 + 2 + enc.count(&image.to_string())
            );
        }
    }

    #[test]
    fn long_text_is_cut_where_counting_the_pieces_counts_the_whole() {
        let text = "First line of a letter, with words.\n\nSecond paragraph: 42 apples\
                    \n  indented code();\n\tand a tab\r\nCRLF line ending here.\n\
                    \u{00e9}t\u{00e9} \u{4f60}\u{597d}, the end.\n";
        let text = text.repeat(8);
        for max in [16, 40, 64, 300] {
            let pieces: Vec<&str> = split(&text, max).collect();
            assert_eq!(pieces.concat(), text);
            assert!(pieces.iter().all(|p| p.len() <= max), "{max}");
            for enc in BOTH {
                let sum: usize = pieces
                    .iter()
                    .map(|p| enc.bpe().unwrap().encode_ordinary(p).len())
                    .sum();
                assert_eq!(sum, enc.bpe().unwrap().encode_ordinary(&text).len());
            }
        }
        // No line break: cut before a word, else anywhere on a character.
        let words: Vec<&str> = split("aaaa bbbb cccc", 7).collect();
        assert_eq!(words, ["aaaa", " bbbb", " cccc"]);
        let runs: Vec<&str> = split("ééééé", 5).collect();
        assert_eq!(runs, ["éé", "éé", "é"]);
        let wide: Vec<&str> = split("你好", 2).collect();
        assert_eq!(wide, ["你", "好"]);
    }

    #[test]
    fn a_megabyte_of_whitespace_is_counted_without_a_panic() {
        // Whole, tiktoken-rs panics on this (the regex engine gives up).
        let spaces = " ".repeat(1 << 20);
        let n = Encoding::O200k.count(&spaces);
        assert!(n > 0 && n < spaces.len(), "{n}");
    }
}
