//! Memory beyond the window, as plain data: the running summary, when a
//! fold is due and what it folds, the summary model's prompt, what of its
//! answer is a summary, and how a summary or a carried note is sent.
//!
//! The rule that keeps nothing from falling between the window and the
//! summary: every message from the summary's end (`until`) on is either
//! in the window or reached back to by it (`render::Reach`), and a fold
//! only ever moves `until` to where a plain window began, which is a
//! group boundary (never inside a tool-call group).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::memory::interruption::{self, is_failure, is_superseded};
use crate::memory::message::{Message, Role};
use crate::memory::tokens::Encoding;

/// What the messages before sequence number `until` said, as the summary
/// model (or an operator) wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub text: String,
    /// It covers the messages numbered below this.
    pub until: u64,
    /// The model that wrote it, or `"manual"`.
    pub model: String,
    pub at_ms: i64,
    /// What the messages it covers cost in tokens, as their folds counted
    /// them (what the summary saves each turn, its own cost aside).
    #[serde(default)]
    pub covered_tokens: u64,
}

/// What recall carries from a user's ended sessions into their next one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Note {
    pub text: String,
    /// The model that wrote it, or `"manual"`.
    pub model: String,
    pub at_ms: i64,
    /// The user's memory was deleted at `at_ms`: this holds nothing, and
    /// keeps sessions that began before from writing it back.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forgotten: bool,
}

impl Note {
    /// What is left of a user's memory deleted at `at_ms`.
    pub fn forgotten(at_ms: i64) -> Self {
        Self {
            text: String::new(),
            model: String::new(),
            at_ms,
            forgotten: true,
        }
    }

    /// The note's text, unless it was deleted.
    pub fn text(&self) -> Option<&str> {
        (!self.forgotten).then_some(self.text.as_str())
    }
}

/// A summary as the session API and vendor "custom" show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View<'a> {
    pub text: &'a str,
    /// The newest message it covers (`None`: none yet).
    pub last_seq: Option<u64>,
    pub model: &'a str,
    pub created_at: i64,
}

impl Summary {
    pub fn view(&self) -> View<'_> {
        View {
            text: &self.text,
            last_seq: self.until.checked_sub(1),
            model: &self.model,
            created_at: self.at_ms,
        }
    }
}

/// `model` of a summary set through the session API.
pub const MANUAL: &str = "manual";

/// What a session remembers besides its messages; stored with its meta.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Remembered {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<Box<Summary>>,
    /// The user's note this session started with (carry-over).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carried: Option<String>,
    /// Whose note this session's memory is carried into when it ends
    /// (the note's key, tenant-scoped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The user's memory was deleted while this session lived: it carries
    /// nothing into a note, ever.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forgotten: bool,
    /// Moves when the history is cleared or replaced: a fold begun before
    /// does not apply after.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub epoch: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Remembered {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The first sequence number no summary covers, in a history whose
    /// oldest stored message is `first_seq`.
    pub fn uncovered_from(&self, first_seq: u64) -> u64 {
        self.summary.as_ref().map_or(0, |s| s.until).max(first_seq)
    }

    /// A cleared or replaced history: nothing of the summary holds.
    pub fn reset(&mut self) {
        self.summary = None;
        self.epoch += 1;
    }
}

/// The messages a fold turns into the next summary, and where they lie.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fold {
    /// The summary it extends covers up to here, and so must it still be
    /// when the fold's answer comes (else the answer is stale).
    pub from: u64,
    /// The new summary covers the messages below this.
    pub until: u64,
    pub epoch: u64,
    /// When the session it was taken from was created (`Session`'s
    /// stored creation time; 0 until the session sets it): a session
    /// started anew under the same id is another conversation.
    pub born: i64,
    /// The summary it extends.
    pub previous: Option<Summary>,
    /// The messages numbered `from..until`, as stored.
    pub messages: Vec<Arc<Message>>,
}

/// A fold's answer, ready to store.
#[derive(Debug, Clone)]
pub struct Folded {
    pub fold: Fold,
    pub text: String,
    pub model: String,
    pub covered_tokens: u64,
    pub at_ms: i64,
}

/// When a fold is due: every how many uncovered messages outside the
/// window, or tokens in them (0 = not counted).
#[derive(Debug, Clone, Copy)]
pub struct Due {
    pub messages: usize,
    pub tokens: usize,
    pub encoding: Encoding,
}

/// What of `history` (whose first message is numbered `first_seq`) a fold
/// would take: from the first uncovered message to `plain_start`, the
/// index where the plain window began (never past the newest user
/// message). `None` if that holds nothing a
/// model would read, or (when `due` is given) less than it asks for.
pub fn fold(
    history: &[Arc<Message>],
    first_seq: u64,
    remembered: &Remembered,
    plain_start: usize,
    due: Option<Due>,
) -> Option<Fold> {
    // The newest user message and what follows it are the turn under
    // way, never folded: a call there may still be waiting for its results.
    let newest_user = history
        .iter()
        .rposition(|m| m.role == Role::User && !is_superseded(m))?;
    fold_to(
        history,
        first_seq,
        remembered,
        plain_start.min(newest_user),
        due,
    )
}

/// The fold of an ended session: everything the summary does not cover,
/// its last turn included.
pub fn last_fold(
    history: &[Arc<Message>],
    first_seq: u64,
    remembered: &Remembered,
) -> Option<Fold> {
    fold_to(history, first_seq, remembered, history.len(), None)
}

fn fold_to(
    history: &[Arc<Message>],
    first_seq: u64,
    remembered: &Remembered,
    end: usize,
    due: Option<Due>,
) -> Option<Fold> {
    let from = remembered.uncovered_from(first_seq);
    let start = usize::try_from(from - first_seq).ok()?;
    let range = history.get(start..end)?;
    let read: Vec<&Message> = range.iter().map(|m| &**m).filter(|m| read(m)).collect();
    if read.is_empty() {
        return None;
    }
    if let Some(due) = due {
        let tokens = || read.iter().map(|m| m.tokens(due.encoding)).sum::<usize>();
        let enough = read.len() >= due.messages || (due.tokens != 0 && tokens() >= due.tokens);
        if !enough {
            return None;
        }
    }
    Some(Fold {
        from,
        until: first_seq + end as u64,
        epoch: remembered.epoch,
        born: 0,
        previous: remembered.summary.as_deref().cloned(),
        messages: range.to_vec(),
    })
}

/// Whether a fold reads a stored message: not one a regenerate, an edit
/// or a retry replaced, nor a failure record (the model never said it).
pub fn read(m: &Message) -> bool {
    !is_superseded(m) && !is_failure(m)
}

pub use headings::{CARRY_HEADING, FOLD_HEADING};

/// The summary model's messages for a fold.
pub fn prompt(instructions: &str, fold: &Fold) -> Vec<Value> {
    let mut text = format!(
        "Summary so far:\n{}\n\n{FOLD_HEADING}\n",
        fold.previous.as_ref().map_or("(none)", |s| s.text.as_str())
    );
    for m in fold.messages.iter().filter(|m| read(m)) {
        text.push_str(&line(m));
        text.push('\n');
    }
    vec![
        json!({"role": "system", "content": instructions}),
        json!({"role": "user", "content": text}),
    ]
}

/// The summary model's messages for folding a session's last summary into
/// its user's note, asked to stay within `max_chars`.
pub fn carry_prompt(
    instructions: &str,
    note: Option<&str>,
    summary: &str,
    max_chars: usize,
) -> Vec<Value> {
    let text = format!(
        "Note so far:\n{}\n\n{CARRY_HEADING}\n{summary}\n\nKeep the note within {max_chars} characters.",
        note.unwrap_or("(none)")
    );
    vec![
        json!({"role": "system", "content": instructions}),
        json!({"role": "user", "content": text}),
    ]
}

/// A message's text as heard, on one line.
pub fn said(m: &Message) -> String {
    flat(&text_of(&m.content))
}

/// A message as one line of the fold: who said it and what was heard.
pub fn line(m: &Message) -> String {
    let text = flat(&text_of(&m.content));
    match m.role {
        Role::Assistant if interruption::is_interrupted(m) => {
            format!("assistant (cut off; the user heard only this): {text}")
        }
        Role::Assistant if m.has_tool_calls() => {
            let calls = calls(m);
            let said = if text.is_empty() {
                String::new()
            } else {
                format!("{text} ")
            };
            format!("assistant: {said}[called {}]", calls.join(", "))
        }
        Role::Tool | Role::Function => format!("tool result: {text}"),
        _ => format!("{}: {text}", m.role.as_str()),
    }
}

/// A message's tool calls, each as `name(arguments)`.
pub fn calls(m: &Message) -> Vec<String> {
    m.tool_calls()
        .into_iter()
        .flatten()
        .map(|c| {
            let f = &c["function"];
            format!(
                "{}({})",
                f["name"].as_str().unwrap_or("?"),
                f["arguments"].as_str().unwrap_or("")
            )
        })
        .collect()
}

/// The text of a content: a string, or the text parts of an array (other
/// parts named by their type).
pub fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match p["text"].as_str() {
                Some(t) => t.to_owned(),
                None => format!("[{}]", p["type"].as_str().unwrap_or("part")),
            })
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// One line: a message's own line breaks would read as other messages.
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Why an answer of the summary model is not kept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejected {
    #[error("the summary model answered nothing")]
    Empty,
    #[error("the summary model answered {0} characters, more than the {1} allowed")]
    TooLong(usize, usize),
    #[error("the summary model stopped at max_tokens: its answer is cut off (memory.summary_max_tokens, carry_over_max_tokens)")]
    CutOff,
}

/// What of the model's answer is kept: its text, trimmed, if there is
/// some, it fits in `max_chars`, and the model did not stop at
/// `max_tokens` (`cut_off`): a summary's end may be what it says last of
/// the conversation, and a cut one would be stored as if it were whole.
pub fn accept(answer: &str, max_chars: usize, cut_off: bool) -> Result<String, Rejected> {
    if cut_off {
        return Err(Rejected::CutOff);
    }
    let text = answer.trim();
    if text.is_empty() {
        return Err(Rejected::Empty);
    }
    let n = text.chars().count();
    if n > max_chars {
        return Err(Rejected::TooLong(n, max_chars));
    }
    Ok(text.to_owned())
}

/// A summary or a note as the system message that carries it.
pub fn message(template: &str, slot: &str, text: &str) -> Message {
    Message::new(Role::System, template.replace(slot, text))
}

/// `message`, within the `left` tokens of a budget (characters / 4), and
/// what it took of them: its text cut at a word and marked `...` when the
/// whole does not fit; none when not even the template does.
pub fn message_within(template: &str, slot: &str, text: &str, left: &mut usize) -> Option<Message> {
    let count = |t: &str| t.chars().count().div_ceil(4);
    let frame = count(&template.replace(slot, ""));
    let whole = count(text);
    let room = left.checked_sub(frame).filter(|&r| r > 0)?;
    let text = if whole <= room {
        std::borrow::Cow::Borrowed(text)
    } else {
        // Room for the marker, then the text up to its last word that fits.
        let chars = room.saturating_mul(4).saturating_sub(4);
        let end = text
            .char_indices()
            .nth(chars)
            .map_or(text.len(), |(i, _)| i);
        let cut = &text[..end];
        let cut = cut.rfind(char::is_whitespace).map_or(cut, |i| &cut[..i]);
        if cut.trim().is_empty() {
            return None;
        }
        std::borrow::Cow::Owned(format!("{} ...", cut.trim_end()))
    };
    let m = message(template, slot, &text);
    *left = left.saturating_sub(frame + count(&text));
    Some(m)
}

pub mod headings;
#[cfg(test)]
mod tests;
