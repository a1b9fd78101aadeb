use super::*;
use crate::config::{InterruptedRendering, Vendor};
use crate::memory::interruption;
use crate::memory::tokens::Encoding;
use serde_json::json;

fn u(t: &str) -> Message {
    Message::new(Role::User, t)
}
fn a(t: &str) -> Message {
    Message::new(Role::Assistant, t)
}
fn call(text: Value, ids: &[&str]) -> Message {
    let mut m = Message::new(Role::Assistant, text);
    m.set_tool_calls(Some(
        ids.iter()
            .map(|id| {
                json!({"id": id, "type": "function",
                "function": {"name": "f", "arguments": "{}"}})
            })
            .collect(),
    ));
    m
}
fn result(id: &str) -> Message {
    let mut m = Message::new(Role::Tool, "ok");
    m.set_tool_call_id(Some(id.into()));
    m
}
fn rules() -> VendorRules {
    VendorRules {
        mode: Vendor::Openai,
        interruptable: true,
        strip_fields: Vec::new(),
        interrupted: InterruptedRendering::Truncated,
        interrupted_marker: " [cut]".into(),
        roles: Roles::Any,
    }
}
fn count(n: usize) -> Limits {
    Limits {
        messages: n,
        ..Limits::default()
    }
}
fn chars(n: usize) -> Limits {
    Limits {
        chars: n,
        ..Limits::default()
    }
}
/// `role:content` of what is sent, calls as `[ids]`.
fn shown(h: &[Message], rules: &VendorRules, limits: Limits) -> Vec<String> {
    let sent = outbound(h, rules, limits);
    check(&sent.messages, rules.roles, sent.reason.is_none()).unwrap();
    sent.messages
        .iter()
        .map(|m| {
            let calls: Vec<&str> = m.tool_call_ids().flatten().collect();
            let text = match &m.content {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            if calls.is_empty() {
                format!("{}:{text}", m.role)
            } else {
                format!("{}:{text}{calls:?}", m.role)
            }
        })
        .collect()
}

#[test]
fn no_limits_send_everything_visible() {
    let mut old = a("old");
    interruption::supersede(&mut old, 1);
    let h = [
        u("1"),
        old,
        a("2"),
        u("3"),
        interruption::failure_reply("Sorry.", "503"),
    ];
    assert_eq!(
        shown(&h, &rules(), Limits::default()),
        ["user:1", "assistant:2", "user:3"]
    );
    assert!(outbound::<Message>(&[], &rules(), count(3))
        .messages
        .is_empty());
}

#[test]
fn a_window_starts_with_a_user_message() {
    let h = [u("1"), a("2"), u("3"), a("4"), u("5"), a("6"), u("7")];
    // Six would start with a("2"): the window is five.
    let sent = outbound(&h, &rules(), count(6));
    assert_eq!(sent.start, 2);
    assert_eq!(sent.reason, Some(TrimReason::MaxMessages));
    assert_eq!(shown(&h, &rules(), count(6))[0], "user:3");
    // A greeting that opened the conversation is sent when nothing is
    // cut, unless the upstream needs a user message first.
    let h = [a("hello"), u("1"), a("2")];
    assert_eq!(
        shown(&h, &rules(), Limits::default()),
        ["assistant:hello", "user:1", "assistant:2"]
    );
    assert_eq!(shown(&h, &rules(), count(2)), ["user:1", "assistant:2"]);
    let mut r = rules();
    r.roles = Roles::Alternate;
    assert_eq!(shown(&h, &r, Limits::default()), ["user:1", "assistant:2"]);
    // With no user message at all, the newest is sent whatever the limits.
    let h = [a("hello"), a("still there?")];
    assert_eq!(shown(&h, &rules(), chars(1)), ["assistant:still there?"]);
}

#[test]
fn the_newest_user_message_and_what_follows_are_always_sent() {
    let h = [
        u("a"),
        a("b"),
        u("a very long message"),
        call(Value::Null, &["c"]),
        result("c"),
    ];
    assert_eq!(
        shown(&h, &rules(), chars(3)),
        ["user:a very long message", "assistant:[\"c\"]", "tool:ok"]
    );
}

#[test]
fn unanswered_tool_calls_are_dropped_from_what_is_sent() {
    let h = [
        u("weather?"),
        call(json!("Let me look."), &["c1"]),
        u("never mind"),
        call(Value::Null, &["c2"]),
        u("ok"),
    ];
    assert_eq!(
        shown(&h, &rules(), Limits::default()),
        [
            "user:weather?",
            "assistant:Let me look.",
            "user:never mind",
            "user:ok"
        ]
    );
    // The stored messages keep their calls.
    assert!(h[1].has_tool_calls());
    // Partly answered: only the answered call stays.
    let h = [
        u("q"),
        call(Value::Null, &["c1", "c2"]),
        result("c2"),
        a("done"),
    ];
    assert_eq!(
        shown(&h, &rules(), Limits::default()),
        ["user:q", "assistant:[\"c2\"]", "tool:ok", "assistant:done"]
    );
}

#[test]
fn orphan_tool_results_are_dropped() {
    let h = [
        u("q"),
        result("gone"),
        a("x"),
        call(Value::Null, &["c1"]),
        result("c9"),
        u("n"),
    ];
    assert_eq!(
        shown(&h, &rules(), Limits::default()),
        ["user:q", "assistant:x", "user:n"]
    );
    // A result after a superseded call is an orphan too.
    let mut old = call(Value::Null, &["c1"]);
    interruption::supersede(&mut old, 1);
    let h = [u("q"), old, result("c1"), u("n")];
    assert_eq!(shown(&h, &rules(), Limits::default()), ["user:q", "user:n"]);
}

#[test]
fn a_tool_group_is_sent_whole_or_not_at_all() {
    let h = [
        u("q"),
        call(Value::Null, &["c1"]),
        result("c1"),
        a("done"),
        u("next"),
    ];
    assert_eq!(shown(&h, &rules(), count(4)), ["user:next"]);
    assert_eq!(shown(&h, &rules(), count(5)).len(), 5);
}

#[test]
fn interrupted_replies_are_rendered_and_counted_as_sent() {
    let cut = interruption::interrupted_reply(a("Why"), &a("Why not"), true, 3, None, "endpoint");
    let h = [u("q"), cut.clone(), u("n")];
    let mut r = rules();
    r.interrupted = InterruptedRendering::Annotated;
    assert_eq!(shown(&h, &r, Limits::default())[1], "assistant:Why [cut]");
    r.interrupted = InterruptedRendering::Original;
    assert_eq!(shown(&h, &r, Limits::default())[1], "assistant:Why not");
    // "q" + "Why not" + "n" is 9 characters; stored, it is 5.
    assert_eq!(shown(&h, &r, chars(8)), ["user:n"]);
    assert_eq!(shown(&h, &r, chars(9)).len(), 3);
    let empty = interruption::interrupted_reply(a(""), &a("long"), true, 3, None, "endpoint");
    assert_eq!(
        shown(&[u("q"), empty, u("n")], &rules(), Limits::default()),
        ["user:q", "user:n"]
    );
}

#[test]
fn vendor_custom_counts_the_extension_fields() {
    let mut m = u("hi");
    m.metadata_mut().insert("source", json!("asr"));
    let h = [m, a("yo"), u("n")];
    let mut r = rules();
    assert_eq!(shown(&h, &r, chars(5)).len(), 3);
    r.mode = Vendor::Custom;
    assert_eq!(shown(&h, &r, chars(5)), ["user:n"]);
    let limits = Limits {
        tokens: 20,
        encoding: Encoding::Approx,
        ..Limits::default()
    };
    assert!(
        outbound(&h, &r, limits).messages.len() < outbound(&h, &rules(), limits).messages.len()
    );
}

#[test]
fn alternate_roles_merge_messages_of_one_role_in_a_row() {
    let cut = interruption::interrupted_reply(a(""), &a("long"), true, 3, None, "new_request");
    let h = [u("u1"), cut, u("u2"), a("a2"), a("are you there?"), u("u3")];
    let mut r = rules();
    r.roles = Roles::Alternate;
    assert_eq!(
        shown(&h, &r, Limits::default()),
        ["user:u1\n\nu2", "assistant:a2\n\nare you there?", "user:u3"]
    );
    assert_eq!(shown(&h, &rules(), Limits::default()).len(), 5);
    // A merge that would not fit is not made: the window starts later.
    assert_eq!(
        shown(&h, &r, chars(23)),
        ["user:u2", "assistant:a2\n\nare you there?", "user:u3"]
    );
    // Parts and text merge as parts.
    let parts = Message::new(Role::User, json!([{"type": "text", "text": "p"}]));
    let m = outbound(&[u("t"), parts], &r, Limits::default()).messages;
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].content.as_array().map(Vec::len), Some(3));
}

#[test]
fn legacy_function_calls_stay_with_their_result() {
    let mut caller = a("");
    caller.content = Value::Null;
    caller.set_extra("function_call", json!({"name": "f", "arguments": "{}"}));
    let mut res = Message::new(Role::Function, "42");
    res.set_name(Some("f".into()));
    let h = [u("q"), caller, res.clone(), a("42 it is"), res, u("n")];
    let sent = outbound(&h, &rules(), Limits::default()).messages;
    assert_eq!(sent.len(), 5, "{sent:?}");
    check(&sent, Roles::Any, true).unwrap();
}

#[test]
fn check_names_what_an_upstream_refuses() {
    assert!(check(&[a("x"), u("y")], Roles::Any, false).is_err());
    assert!(check(&[a("x"), u("y")], Roles::Any, true).is_ok());
    assert!(check(&[a("x"), u("y")], Roles::Alternate, true).is_err());
    assert!(check(&[u("y"), call(Value::Null, &["c"])], Roles::Any, true).is_err());
    assert!(check(&[u("y"), result("c")], Roles::Any, true).is_err());
    assert!(check(&[u("y"), u("z")], Roles::Alternate, true).is_err());
    assert!(check(&[u("y"), u("z")], Roles::Any, true).is_ok());
}

/// A legacy `function_call` is a call, not text: with alternating roles it
/// may follow a reply, as a `tool_calls` message may, and is never merged
/// into one (found by the request_reconcile fuzz target).
#[test]
fn a_legacy_call_after_a_reply_is_neither_merged_nor_refused() {
    let mut caller = Message::new(Role::Assistant, Value::Null);
    caller.set_extra("function_call", json!({"name": "f", "arguments": "{}"}));
    let mut answer = Message::new(Role::Function, "42");
    answer.set_extra("name", json!("f"));
    let alternate = VendorRules {
        roles: Roles::Alternate,
        ..rules()
    };
    // Answered, and left unanswered (then sent alone, after the reply).
    for h in [
        vec![u("q"), a("thinking"), caller.clone(), answer],
        vec![u("q"), a("thinking"), caller.clone()],
    ] {
        let sent = outbound(&h, &alternate, Limits::default());
        check(&sent.messages, alternate.roles, true).unwrap();
        assert_eq!(sent.messages.len(), h.len());
        assert_eq!(sent.messages[1].content, "thinking");
        assert!(legacy_call(&sent.messages[2]));
    }
}

/// `outbound_reaching` over `h` with a window of `n` messages.
fn reaching(h: &[Message], n: usize, from: usize, max: usize) -> Sent {
    outbound_reaching(h, &rules(), count(n), Some(Reach { from, max }))
}

#[test]
fn the_window_reaches_back_to_the_summary_and_says_where_it_would_have_begun() {
    let h = [u("1"), a("2"), u("3"), a("4"), u("5"), a("6"), u("7")];
    let plain = outbound(&h, &rules(), count(3));
    assert_eq!((plain.start, plain.plain_start), (4, 4));
    let sent = reaching(&h, 3, 2, 10);
    assert_eq!(sent.messages.len(), 5);
    assert_eq!((sent.start, sent.plain_start, sent.gap), (2, 4, false));
    assert_eq!(sent.reason, Some(TrimReason::MaxMessages));
    check(&sent.messages, Roles::Any, false).unwrap();
    // The summary covers more than the window leaves out: the plain window.
    let sent = reaching(&h, 3, 5, 10);
    assert_eq!((sent.start, sent.plain_start), (4, 4));
    // Everything is reached: nothing left out.
    let sent = reaching(&h, 3, 0, 10);
    assert_eq!((sent.start, sent.messages.len()), (0, 7));
}

#[test]
fn a_reach_past_its_limit_is_given_up_for_the_plain_window() {
    let h = [u("1"), a("2"), u("3"), a("4"), u("5"), a("6"), u("7")];
    let sent = reaching(&h, 3, 0, 3);
    assert!(sent.gap);
    assert_eq!((sent.start, sent.plain_start), (4, 4));
    assert_eq!(sent.messages.len(), 3);
    // Exactly at the limit, it reaches.
    let sent = reaching(&h, 3, 0, 4);
    assert!(!sent.gap);
    assert_eq!(sent.start, 0);
}

#[test]
fn a_reach_takes_a_tool_group_whole() {
    let h = [
        u("q"),
        call(Value::Null, &["c1", "c2"]),
        result("c1"),
        result("c2"),
        a("done"),
        u("next"),
        a("ok"),
        u("last"),
    ];
    // A window of 3 begins at "next" (index 5); the summary ends at the
    // call (index 1): the group goes whole, and the question before it
    // too (summarized already), so that the window starts with a user.
    let sent = reaching(&h, 3, 1, 10);
    assert_eq!((sent.start, sent.plain_start), (0, 5));
    assert_eq!(sent.messages.len(), 8);
    check(&sent.messages, Roles::Any, false).unwrap();
}

#[test]
fn a_reach_starts_with_a_user_message_where_roles_alternate() {
    let alternate = VendorRules {
        roles: Roles::Alternate,
        ..rules()
    };
    // A greeting opened the conversation; nothing is summarized yet.
    let h = [
        a("Hello!"),
        u("1"),
        a("2"),
        u("3"),
        a("4"),
        u("5"),
        a("6"),
        u("7"),
    ];
    let sent = outbound_reaching(&h, &alternate, count(3), Some(Reach { from: 0, max: 10 }));
    assert!(!sent.gap);
    assert_eq!(sent.start, 1);
    check(&sent.messages, Roles::Alternate, false).unwrap();
    // Two user messages in a row where the reach meets the window: merged.
    let h = [u("1"), a("2"), u("3"), u("4"), a("5"), u("6")];
    let sent = outbound_reaching(&h, &alternate, chars(2), Some(Reach { from: 0, max: 10 }));
    check(&sent.messages, Roles::Alternate, false).unwrap();
    assert_eq!(sent.start, 0);
    assert_eq!(sent.messages.len(), 5);
}

#[test]
fn a_gap_sends_exactly_the_plain_window() {
    let alternate = VendorRules {
        roles: Roles::Alternate,
        ..rules()
    };
    let h = [u("aaaa"), a("bbbb"), u("cc"), u("dd"), a("ee"), u("ff")];
    for r in [rules(), alternate] {
        let plain = outbound(&h, &r, chars(12));
        let sent = outbound_reaching(&h, &r, chars(12), Some(Reach { from: 0, max: 1 }));
        assert!(sent.gap);
        assert_eq!(sent.messages, plain.messages);
        assert_eq!((sent.start, sent.plain_start), (plain.start, plain.start));
    }
}

fn dev(t: &str) -> Message {
    Message::new(Role::Developer, t)
}

#[test]
fn a_note_inside_the_conversation_is_sent_where_it_stands() {
    let cut =
        interruption::interrupted_reply(a("Why"), &a("Why did"), true, 3, None, "new_request");
    let h = [
        u("joke?"),
        cut,
        dev("ask again"),
        a("Say again?"),
        u("a story"),
    ];
    let all = [
        "user:joke?",
        "assistant:Why",
        "developer:ask again",
        "assistant:Say again?",
        "user:a story",
    ];
    assert_eq!(shown(&h, &rules(), Limits::default()), all);
    assert_eq!(shown(&h, &rules(), count(5)), all);
    // It leaves the window with the messages around it: a window never
    // starts with it.
    assert_eq!(shown(&h, &rules(), count(4)), ["user:a story"]);
    let h = [u("1"), a("a"), dev("be brief"), u("2"), a("b")];
    assert_eq!(shown(&h, &rules(), count(4)), ["user:2", "assistant:b"]);
}

#[test]
fn with_alternating_roles_a_note_goes_as_the_users() {
    let mut r = rules();
    r.roles = Roles::Alternate;
    let h = [
        u("joke?"),
        a("Why"),
        dev("ask again"),
        a("Say again?"),
        u("a story"),
    ];
    assert_eq!(
        shown(&h, &r, Limits::default()),
        [
            "user:joke?",
            "assistant:Why",
            "user:ask again",
            "assistant:Say again?",
            "user:a story"
        ]
    );
    // Beside a user message, the two are one.
    let h = [u("1"), a("a"), u("2"), dev("be brief")];
    assert_eq!(
        shown(&h, &r, Limits::default()),
        ["user:1", "assistant:a", "user:2\n\nbe brief"]
    );
    assert!(check(&[u("1"), a("a"), dev("x")], Roles::Alternate, true).is_err());
    assert!(check(&[u("1"), a("a"), dev("x")], Roles::Any, true).is_ok());
}
