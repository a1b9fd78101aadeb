//! What the echo mock answers: a fixed sentence built from the messages it
//! received, so that a person trying recall sees its memory and its window
//! at work without a model. Pure and deterministic: the same messages give
//! the same text, word for word.

use serde_json::Value;

use crate::memory::summary::headings::{CARRY_HEADING, FOLD_HEADING};

/// Roles in the order the tally names them; any other role follows, in
/// the order first seen.
const ROLE_ORDER: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// The echo for `messages` (the `messages` array of a chat request):
///
/// `You said: "<last user>" Before that you said: "<previous user>" I received 4 messages (1 system, 2 user, 1 assistant).`
///
/// With only one user message, the middle sentence is
/// `I see nothing you said before that.`, and with none at all the first
/// two become `I see nothing you said.`
///
/// Given recall's summary prompt (`summary::FOLD_HEADING` or
/// `CARRY_HEADING` in its last message), it summarizes instead (`summarize`).
/// With more than one system message, it ends by quoting the last one
/// (`My notes say: ...`): where recall puts the running summary.
pub fn reply(messages: &[Value]) -> String {
    let asked = messages
        .iter()
        .rev()
        .find(|m| role(m) == "user")
        .map(|m| text(&m["content"]))
        .unwrap_or_default();
    if asked.contains(FOLD_HEADING) || asked.contains(CARRY_HEADING) {
        return summarize(&asked);
    }
    if super::embed::is_extraction(&asked) {
        return super::embed::facts(&asked);
    }
    let said: Vec<String> = messages
        .iter()
        .filter(|m| role(m) == "user")
        .map(|m| text(&m["content"]))
        .collect();
    let mut out = match said.as_slice() {
        [] => "I see nothing you said.".to_owned(),
        [last] => format!("You said: \"{last}\" I see nothing you said before that."),
        [.., previous, last] => {
            format!("You said: \"{last}\" Before that you said: \"{previous}\"")
        }
    };
    out.push_str(&format!(" {}", tally(messages)));
    let system: Vec<&Value> = messages.iter().filter(|m| role(m) == "system").collect();
    if let [_, .., last] = system.as_slice() {
        out.push_str(&format!(" My notes say: {}", text(&last["content"])));
    }
    out
}

/// What the mock remembers of a summary request: every statement the
/// user made (a line `user: ...` not ending in `?`), after those the
/// summary or note so far holds, as `The user said: a; b.`, up to
/// `SUMMARY_CHARS` (the oldest kept: a name comes first).
fn summarize(request: &str) -> String {
    let mut facts: Vec<String> = Vec::new();
    let mut add = |fact: &str| {
        let fact = fact.trim().trim_end_matches(['.', ';']).trim();
        if !fact.is_empty() && !fact.ends_with('?') && !facts.iter().any(|f| f == fact) {
            facts.push(fact.to_owned());
        }
    };
    for line in request.lines() {
        if let Some(said) = line.strip_prefix(SAID) {
            said.trim_end_matches('.').split("; ").for_each(&mut add);
        } else if let Some(said) = line.strip_prefix("user: ") {
            add(said);
        }
    }
    let mut out = String::new();
    for fact in facts {
        let next = if out.is_empty() {
            format!("{SAID}{fact}")
        } else {
            format!("{out}; {fact}")
        };
        if next.len() + 1 > SUMMARY_CHARS {
            break;
        }
        out = next;
    }
    if out.is_empty() {
        return "The user has said nothing to remember yet.".into();
    }
    out.push('.');
    out
}

const SAID: &str = "The user said: ";
const SUMMARY_CHARS: usize = 1000;

/// `I received 4 messages (1 system, 2 user, 1 assistant).`: the size of
/// the window recall sent, plus the system messages.
fn tally(messages: &[Value]) -> String {
    let mut counts: Vec<(&str, usize)> = ROLE_ORDER.iter().map(|r| (*r, 0)).collect();
    for m in messages {
        let r = role(m);
        match counts.iter_mut().find(|(known, _)| *known == r) {
            Some((_, n)) => *n += 1,
            None => counts.push((r, 1)),
        }
    }
    let parts: Vec<String> = counts
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(r, n)| format!("{n} {r}"))
        .collect();
    let total = messages.len();
    let noun = if total == 1 { "message" } else { "messages" };
    if parts.is_empty() {
        format!("I received {total} {noun}.")
    } else {
        format!("I received {total} {noun} ({}).", parts.join(", "))
    }
}

fn role(m: &Value) -> &str {
    m["role"].as_str().unwrap_or("unknown")
}

/// The text of a message's content: a string as it is, the text parts of
/// a multimodal array joined by spaces, anything else empty.
fn text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// `text` within a request's `max_tokens` (the mock's tokens are words),
/// and its `finish_reason`: `"length"` when it was cut there, as a model
/// that stops at the limit says.
pub fn within(text: String, max_tokens: Option<u64>) -> (String, &'static str) {
    let Some(max) = max_tokens.and_then(|n| usize::try_from(n).ok()) else {
        return (text, "stop");
    };
    if words(&text) <= max {
        return (text, "stop");
    }
    let cut = match max {
        0 => "",
        _ => pieces(&text, max).first().map_or("", |p| p.trim_end()),
    };
    (cut.to_owned(), "length")
}

/// Whitespace-separated words in every message's text: the mock's stand-in
/// for token counts in `usage`.
pub fn prompt_words(messages: &[Value]) -> usize {
    messages.iter().map(|m| words(&text(&m["content"]))).sum()
}

pub fn words(text: &str) -> usize {
    text.split_whitespace().count()
}

/// `text` cut into pieces of `per_piece` words, each piece carrying the
/// whitespace that follows its words, so that the pieces joined are
/// exactly `text`.
pub fn pieces(text: &str, per_piece: usize) -> Vec<&str> {
    let per_piece = per_piece.max(1);
    let mut out = Vec::new();
    let (mut start, mut words, mut in_word) = (0, 0, false);
    for (i, c) in text.char_indices() {
        if c.is_whitespace() {
            in_word = false;
        } else if !in_word {
            in_word = true;
            if words == per_piece {
                out.push(&text[start..i]);
                start = i;
                words = 0;
            }
            words += 1;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn echoes_the_last_two_user_messages_and_counts_by_role() {
        let messages = [
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "My name is Ada."}),
            json!({"role": "assistant", "content": "Hello."}),
            json!({"role": "user", "content": [{"type": "text", "text": "What is"},
                                               {"type": "image_url", "image_url": {"url": "x"}},
                                               {"type": "text", "text": "my name?"}]}),
        ];
        assert_eq!(
            reply(&messages),
            "You said: \"What is my name?\" Before that you said: \"My name is Ada.\" \
             I received 4 messages (1 system, 2 user, 1 assistant)."
        );
    }

    #[test]
    fn says_when_nothing_earlier_reached_it() {
        let one = [json!({"role": "user", "content": "Hi"})];
        assert_eq!(
            reply(&one),
            "You said: \"Hi\" I see nothing you said before that. I received 1 message (1 user)."
        );
        let odd = [json!({"role": "function", "content": null})];
        assert_eq!(
            reply(&odd),
            "I see nothing you said. I received 1 message (1 function)."
        );
        assert_eq!(reply(&[]), "I see nothing you said. I received 0 messages.");
    }

    #[test]
    fn an_answer_stops_at_max_tokens_words() {
        let text = || "one two three four".to_owned();
        assert_eq!(within(text(), None), (text(), "stop"));
        assert_eq!(within(text(), Some(4)), (text(), "stop"));
        assert_eq!(within(text(), Some(2)), ("one two".to_owned(), "length"));
        assert_eq!(within(text(), Some(0)), (String::new(), "length"));
    }

    #[test]
    fn pieces_rejoin_to_the_text() {
        let text = "  You said: \"a  b\"\nc ";
        for n in 1..6 {
            assert_eq!(pieces(text, n).concat(), text, "{n}");
        }
        assert_eq!(pieces("a b c d e", 2), ["a b ", "c d ", "e"]);
        assert_eq!(pieces("one", 0), ["one"]);
        assert!(pieces("", 1).is_empty());
        assert_eq!(words("  a b\nc "), 3);
    }
}
