//! The `verbatim` strategy: what the user said, as records, with no model
//! call. A user message is split into sentences (Unicode's rules); a
//! sentence with few words of meaning ("It was so powerful.") stays with
//! the one before it, or the one after, so that a record reads on its
//! own; what still carries almost nothing ("Thanks!") is not kept.

use std::collections::HashMap;
use std::sync::Arc;

use unicode_segmentation::UnicodeSegmentation;

use super::words::content_words;
use super::MAX_FACT_CHARS;
use crate::memory::message::{Message, Role};
use crate::memory::summary;

/// A sentence with fewer words of meaning than this joins a neighbour: a
/// record of a few words is found by chance and read without what it is
/// about (benches/memory measured 3 to 10; 6 to 10 did best).
const JOIN_BELOW: usize = 8;
/// A record holds at least this many words of meaning.
const KEEP_FROM: usize = 2;
/// How much of the reply a record quotes (`with_replies`), in characters.
const REPLY_CHARS: usize = 160;

/// Words the user said, as a record will hold them.
#[derive(Debug, Clone, PartialEq)]
pub struct Said {
    pub text: String,
    /// The message's timestamp (Unix ms).
    pub said_at: Option<i64>,
}

/// The user's words in `messages` (as heard: superseded and failed turns
/// left out), a record each, without repeats, in the order said. With
/// `with_replies`, a message's first record quotes the end of the reply
/// it answers. Longer than `MAX_FACT_CHARS`: left out, and counted.
pub fn said(messages: &[Arc<Message>], with_replies: bool) -> (Vec<Said>, usize) {
    let mut out: Vec<Said> = Vec::new();
    // A repeat is dated when it was said last, as a merge into a stored
    // record would date it: what is stored does not depend on how the
    // turns were batched.
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut too_long = 0;
    let mut reply: Option<String> = None;
    for m in messages.iter().filter(|m| summary::read(m)) {
        match m.role {
            Role::Assistant => {
                let text = summary::said(m);
                reply = (!text.trim().is_empty()).then_some(text);
            }
            Role::User => {
                let chunks = chunks(&summary::said(m));
                for (i, chunk) in chunks.into_iter().enumerate() {
                    let key = chunk.to_lowercase();
                    if let Some(&k) = seen.get(&key) {
                        out[k].said_at = m.timestamp.or(out[k].said_at);
                        continue;
                    }
                    let text = match (&reply, i) {
                        (Some(r), 0) if with_replies => {
                            format!("{chunk} (replying to: \"{}\")", tail(r, REPLY_CHARS))
                        }
                        _ => chunk,
                    };
                    if text.chars().nth(MAX_FACT_CHARS).is_some() {
                        too_long += 1;
                        continue;
                    }
                    seen.insert(key, out.len());
                    out.push(Said {
                        text,
                        said_at: m.timestamp,
                    });
                }
                reply = None;
            }
            _ => {}
        }
    }
    (out, too_long)
}

/// A message's records: its sentences, the short ones joined to a
/// neighbour, those that still say almost nothing left out.
pub fn chunks(text: &str) -> Vec<String> {
    let mut parts: Vec<(String, usize)> = Vec::new();
    for sentence in text.unicode_sentences() {
        let sentence = sentence.trim();
        if sentence.is_empty() {
            continue;
        }
        let words = content_words(sentence);
        match parts.last_mut() {
            Some((last, n)) if *n < JOIN_BELOW || words < JOIN_BELOW => {
                last.push(' ');
                last.push_str(sentence);
                *n += words;
            }
            _ => parts.push((sentence.to_owned(), words)),
        }
    }
    parts
        .into_iter()
        .filter(|(_, n)| *n >= KEEP_FROM)
        .map(|(text, _)| text)
        .collect()
}

/// The last `max` characters of `text`, from a word's start.
fn tail(text: &str, max: usize) -> String {
    let text = text.trim();
    match text.char_indices().rev().nth(max) {
        None => text.to_owned(),
        Some((at, _)) => {
            let rest = &text[at..];
            let from = rest.find(' ').map_or(0, |i| i + 1);
            format!("...{}", &rest[from..])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: Role, text: &str, at: i64) -> Arc<Message> {
        let mut m = Message::new(role, serde_json::Value::from(text));
        m.timestamp = Some(at);
        Arc::new(m)
    }

    #[test]
    fn sentences_become_records_and_short_ones_join_a_neighbour() {
        assert_eq!(
            chunks("Hey Mel! I went to a LGBTQ support group yesterday. It was so powerful."),
            ["Hey Mel! I went to a LGBTQ support group yesterday. It was so powerful."]
        );
        assert_eq!(
            chunks("I moved to Berlin last week. My new job at the bakery starts on Monday!"),
            ["I moved to Berlin last week. My new job at the bakery starts on Monday!"]
        );
        let two = "I moved to Berlin last week with my sister, her dog and two cats. \
                   My new job at the corner bakery near the station starts next Monday morning.";
        assert_eq!(
            chunks(two),
            [
                "I moved to Berlin last week with my sister, her dog and two cats.",
                "My new job at the corner bakery near the station starts next Monday morning."
            ]
        );
        assert!(chunks("Thanks!").is_empty());
        assert!(chunks("Oh, so it is.").is_empty());
        assert!(chunks("").is_empty());
    }

    #[test]
    fn the_users_words_are_kept_once_with_when_they_were_said() {
        let messages = [
            msg(Role::User, "I adopted a puppy named Rex last month.", 10),
            msg(Role::Assistant, "How lovely! Is he house-trained yet?", 11),
            msg(Role::User, "Yes, he learned very quickly.", 12),
            msg(Role::User, "I adopted a puppy named Rex last month.", 13),
            msg(Role::User, "Thanks!", 14),
        ];
        let (said_plain, too_long) = said(&messages, false);
        assert_eq!(too_long, 0);
        assert_eq!(
            said_plain,
            [
                Said {
                    text: "I adopted a puppy named Rex last month.".into(),
                    said_at: Some(13)
                },
                Said {
                    text: "Yes, he learned very quickly.".into(),
                    said_at: Some(12)
                },
            ]
        );
        let (with, _) = said(&messages, true);
        assert_eq!(
            with[1].text,
            "Yes, he learned very quickly. (replying to: \"How lovely! Is he house-trained yet?\")"
        );
    }

    #[test]
    fn a_long_reply_is_quoted_by_its_end() {
        let long = "word ".repeat(100);
        let t = tail(&long, 20);
        assert!(t.starts_with("...word") && t.chars().count() <= 24, "{t}");
    }
}
