//! Memory as plain text, for frameworks that take it as a string rather
//! than as messages: a session's conversation (`GET .../history?format=text`)
//! and a user's note and facts (`GET /v1/users/{user}/memory?format=text`).
//! Pure: what to show is the caller's.

use super::interruption;
use super::long_term::{self, Fact};
use super::message::{Message, Role};
use super::summary::{calls, text_of};

/// What follows a reply the user did not hear to its end.
pub const CUT_MARKER: &str = "[cut off]";

/// The conversation as `USER: ...` and `ASSISTANT: ...` blocks, oldest
/// first, a blank line between them: a reply as far as it was heard (and
/// marked when it was cut off), a tool call by name and arguments.
/// Superseded messages and failure records are left out.
pub fn transcript<M: AsRef<Message>>(messages: &[M]) -> String {
    messages
        .iter()
        .map(AsRef::as_ref)
        .filter(|m| !interruption::is_superseded(m) && !interruption::is_failure(m))
        .map(block)
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn block(m: &Message) -> String {
    let mut text = text_of(&m.content).trim().to_owned();
    if m.role == Role::Assistant {
        for call in calls(m) {
            push_word(&mut text, &format!("[called {call}]"));
        }
        if interruption::is_interrupted(m) {
            push_word(&mut text, CUT_MARKER);
        }
    }
    let role = match m.role {
        Role::Function => Role::Tool.as_str(),
        r => r.as_str(),
    };
    format!("{}: {text}", role.to_uppercase())
}

fn push_word(text: &mut String, word: &str) {
    if !text.is_empty() {
        text.push(' ');
    }
    text.push_str(word);
}

/// A user's memory as one block: the note as the carry-over template
/// frames it, then the facts as the long-term template does (a line
/// each, with its day as a turn shows it). `None` when there is neither.
pub fn user_memory(note: Option<(&str, &str)>, facts: Option<(&str, &[Fact])>) -> Option<String> {
    let note = note.map(|(template, text)| template.replace("{note}", text));
    let facts = facts
        .and_then(|(template, f)| long_term::facts_message(template, f))
        .map(|m| text_of(&m.content));
    let parts: Vec<String> = note.into_iter().chain(facts).collect();
    (!parts.is_empty()).then(|| parts.join("\n\n"))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::memory::interruption::{INTERRUPTED, SUPERSEDED};

    fn with(role: Role, text: &str, meta: &[(&str, serde_json::Value)]) -> Message {
        let mut m = Message::new(role, text);
        for (k, v) in meta {
            m.metadata_mut().insert((*k).to_owned(), v.clone());
        }
        m
    }

    #[test]
    fn a_conversation_reads_as_heard_oldest_first() {
        let mut call = Message::new(Role::Assistant, "");
        call.push_tool_call(json!({"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": "{\"city\":\"Hanoi\"}"}}));
        let messages = vec![
            with(Role::User, "My name is Ada.", &[]),
            with(
                Role::Assistant,
                "Nice to meet you, Ada! Let me tell",
                &[(INTERRUPTED, json!(true))],
            ),
            with(Role::User, "What is the weather?", &[]),
            with(
                Role::Assistant,
                "An answer regenerated away",
                &[(SUPERSEDED, json!(true))],
            ),
            call,
            with(Role::Tool, "31 C", &[]),
            with(Role::Assistant, "It is 31 C.", &[]),
        ];
        let messages: Vec<std::sync::Arc<Message>> =
            messages.into_iter().map(std::sync::Arc::new).collect();
        assert_eq!(
            transcript(&messages),
            "USER: My name is Ada.\n\n\
             ASSISTANT: Nice to meet you, Ada! Let me tell [cut off]\n\n\
             USER: What is the weather?\n\n\
             ASSISTANT: [called weather({\"city\":\"Hanoi\"})]\n\n\
             TOOL: 31 C\n\n\
             ASSISTANT: It is 31 C."
        );
        assert_eq!(transcript::<std::sync::Arc<Message>>(&[]), "");
    }

    #[test]
    fn a_users_memory_is_the_note_then_the_facts() {
        let fact = |text: &str, said_at| Fact {
            id: "mem_1".into(),
            text: text.into(),
            said_at,
            score: None,
        };
        // 8 May 2023, 13:56 UTC.
        let facts = [
            fact("I live in Hanoi", None),
            fact("I am allergic to peanuts", Some(1_683_554_160_000)),
        ];
        assert_eq!(
            user_memory(
                Some(("Previously: {note}", "Ada likes tea.")),
                Some(("Facts:\n{facts}", &facts[..]))
            )
            .as_deref(),
            Some("Previously: Ada likes tea.\n\nFacts:\n- I live in Hanoi\n- (8 May 2023) I am allergic to peanuts")
        );
        assert_eq!(
            user_memory(None, Some(("Facts:\n{facts}", &facts[..1]))).as_deref(),
            Some("Facts:\n- I live in Hanoi")
        );
        assert_eq!(user_memory(None, Some(("Facts:\n{facts}", &[]))), None);
        assert_eq!(user_memory(None, None), None);
    }
}
