use super::*;
use crate::memory::interruption::{failure_reply, interrupted_reply, supersede};
use serde_json::json;

fn u(t: &str) -> Arc<Message> {
    Arc::new(Message::new(Role::User, t))
}
fn a(t: &str) -> Arc<Message> {
    Arc::new(Message::new(Role::Assistant, t))
}
fn turns(n: usize) -> Vec<Arc<Message>> {
    (0..n)
        .flat_map(|i| [u(&format!("q{i}")), a(&format!("r{i}"))])
        .collect()
}
fn due(messages: usize) -> Option<Due> {
    Some(Due {
        messages,
        tokens: 0,
        encoding: Encoding::Approx,
    })
}
fn summary(until: u64, text: &str) -> Summary {
    Summary {
        text: text.into(),
        until,
        model: "m".into(),
        at_ms: 1,
        covered_tokens: 0,
    }
}

#[test]
fn a_fold_takes_what_lies_between_the_summary_and_the_window() {
    let h = turns(6); // 12 messages, numbered 100..112
    let r = Remembered {
        summary: Some(Box::new(summary(102, "so far"))),
        ..Remembered::default()
    };
    // The plain window begins at index 8 (seq 108).
    let f = fold(&h, 100, &r, 8, due(6)).unwrap();
    assert_eq!((f.from, f.until), (102, 108));
    assert_eq!(f.messages.len(), 6);
    assert_eq!(f.previous.as_ref().map(|s| s.text.as_str()), Some("so far"));
    // Fewer than asked for: not due yet, unless asked now.
    assert!(fold(&h, 100, &r, 8, due(7)).is_none());
    assert!(fold(&h, 100, &r, 8, None).is_some());
    // Nothing between them.
    assert!(fold(&h, 100, &r, 2, None).is_none());
    // Messages dropped from the history before the summary covered them:
    // the fold starts at the oldest one held.
    let f = fold(&h, 100, &Remembered::default(), 4, None).unwrap();
    assert_eq!((f.from, f.until), (100, 104));
}

#[test]
fn tokens_can_make_a_fold_due_and_unread_messages_do_not_count() {
    let mut h = vec![u(&"word ".repeat(40)), a("ok")];
    let mut gone = Message::new(Role::Assistant, "replaced");
    supersede(&mut gone, 1);
    h.push(Arc::new(gone));
    h.push(Arc::new(failure_reply("Sorry", "boom")));
    h.push(u("now"));
    let by_tokens = Some(Due {
        messages: 100,
        tokens: 40,
        encoding: Encoding::Approx,
    });
    assert!(fold(&h, 0, &Remembered::default(), 4, by_tokens).is_some());
    // Two messages are read; the superseded one and the failure are not.
    assert!(fold(&h, 0, &Remembered::default(), 4, due(3)).is_none());
    assert!(fold(&h, 0, &Remembered::default(), 4, due(2)).is_some());
    let only_unread = vec![h[2].clone(), h[3].clone(), u("x")];
    assert!(fold(&only_unread, 0, &Remembered::default(), 2, None).is_none());
}

#[test]
fn the_prompt_shows_what_was_heard_and_what_was_called() {
    let cut = interrupted_reply(
        Message::new(Role::Assistant, "The capital is"),
        &Message::new(Role::Assistant, "The capital is Lisbon."),
        true,
        5,
        None,
        "new_request",
    );
    let mut call = Message::new(Role::Assistant, Value::Null);
    call.set_tool_calls(Some(vec![json!({"id": "c1", "type": "function",
        "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}})]));
    let mut result = Message::new(Role::Tool, "rain\nand wind");
    result.set_tool_call_id(Some("c1".into()));
    let mut gone = Message::new(Role::Assistant, "never heard");
    supersede(&mut gone, 1);
    let f = Fold {
        from: 0,
        until: 5,
        epoch: 0,
        born: 0,
        previous: None,
        messages: vec![
            u("Hi"),
            Arc::new(cut),
            Arc::new(gone),
            Arc::new(call),
            Arc::new(result),
        ],
    };
    let p = prompt("Summarize.", &f);
    assert_eq!(p[0], json!({"role": "system", "content": "Summarize."}));
    assert_eq!(
        p[1]["content"],
        "Summary so far:\n(none)\n\nMessages to fold in:\n\
         user: Hi\n\
         assistant (cut off; the user heard only this): The capital is\n\
         assistant: [called weather({\"city\":\"Oslo\"})]\n\
         tool result: rain and wind\n"
    );
}

#[test]
fn only_a_summary_is_kept() {
    assert_eq!(
        accept("  Ada likes tea. \n", 20, false),
        Ok("Ada likes tea.".into())
    );
    assert_eq!(accept(" \n ", 20, false), Err(Rejected::Empty));
    assert_eq!(accept("abcdef", 5, false), Err(Rejected::TooLong(6, 5)));
    // Cut off at max_tokens: however short, not a whole summary.
    assert_eq!(accept("Ada likes", 20, true), Err(Rejected::CutOff));
    // Characters, not bytes.
    assert!(accept("ééééé", 5, false).is_ok());
}

#[test]
fn a_reset_forgets_the_summary_and_moves_the_epoch() {
    let mut r = Remembered {
        summary: Some(Box::new(summary(10, "s"))),
        carried: Some("note".into()),
        user: None,
        forgotten: false,
        epoch: 0,
    };
    assert_eq!(r.uncovered_from(4), 10);
    assert_eq!(r.uncovered_from(12), 12);
    r.reset();
    assert_eq!(r.summary, None);
    assert_eq!(r.epoch, 1);
    assert_eq!(r.carried.as_deref(), Some("note"));
    assert_eq!(r.uncovered_from(4), 4);
    // Stored compactly: nothing for what is not there.
    let empty = serde_json::to_string(&Remembered::default()).unwrap();
    assert_eq!(empty, "{}");
    assert!(Remembered::default().is_empty());
}

#[test]
fn templates_carry_the_text() {
    let m = message("Summary so far: {summary}", "{summary}", "Ada.");
    assert_eq!(m.role, Role::System);
    assert_eq!(m.content, "Summary so far: Ada.");
    assert_eq!(summary(8, "x").view().last_seq, Some(7));
    assert_eq!(summary(0, "x").view().last_seq, None);
}

/// The built-in mock (`mock://echo`) answers recall's own prompts.
#[test]
fn the_mock_summarizes_what_the_user_stated_when_asked_by_recall() {
    let fold = Fold {
        from: 0,
        until: 4,
        epoch: 0,
        born: 0,
        previous: None,
        messages: vec![
            Arc::new(Message::new(Role::User, "My name is Ada.")),
            Arc::new(Message::new(Role::User, "What is my name?")),
        ],
    };
    let first = crate::exchange::echo::reply(&prompt("Summarize.", &fold));
    assert_eq!(first, "The user said: My name is Ada.");
    let next = Fold {
        previous: Some(Summary {
            text: first.clone(),
            until: 4,
            model: "m".into(),
            at_ms: 0,
            covered_tokens: 0,
        }),
        messages: vec![Arc::new(Message::new(Role::User, "I live in Lisbon"))],
        ..fold
    };
    let second = crate::exchange::echo::reply(&prompt("Summarize.", &next));
    assert_eq!(second, "The user said: My name is Ada; I live in Lisbon.");
    let note = crate::exchange::echo::reply(&carry_prompt("Note.", Some(&first), &second, 100));
    assert_eq!(note, "The user said: My name is Ada; I live in Lisbon.");
    let nothing = crate::exchange::echo::reply(&carry_prompt("Note.", None, "Hello", 100));
    assert_eq!(nothing, "The user has said nothing to remember yet.");
    // The summary, sent as a second system message, is quoted.
    let messages = [
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "system", "content": "Summary: Ada."}),
        json!({"role": "user", "content": "Hi"}),
    ];
    assert!(crate::exchange::echo::reply(&messages).ends_with(" My notes say: Summary: Ada."));
}

#[test]
fn a_message_within_a_budget_is_cut_at_a_word() {
    let mut left = 100;
    let m = message_within("Note: {note}", "{note}", "Ada likes tea.", &mut left).unwrap();
    assert_eq!(m.content, "Note: Ada likes tea.");
    // "Note: " is 2 tokens, the text 4.
    assert_eq!(left, 94);

    let long = "word ".repeat(100);
    let mut left = 12;
    let m = message_within("Note: {note}", "{note}", &long, &mut left).unwrap();
    let text = m.content.as_str().unwrap();
    assert!(
        text.starts_with("Note: word word") && text.ends_with("word ..."),
        "{text}"
    );
    assert!(text.chars().count().div_ceil(4) <= 12, "{text}");
    assert!(left <= 1, "{left}");

    // No room even for the template: nothing.
    let mut left = 2;
    assert!(message_within("Note: {note}", "{note}", "Ada likes tea.", &mut left).is_none());
    assert_eq!(left, 2);
}
