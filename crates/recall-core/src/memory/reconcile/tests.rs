use super::*;
use crate::memory::message::Role;
use serde_json::{json, Value};

fn u(text: &str) -> Message {
    Message::new(Role::User, text)
}
fn a(text: &str) -> Message {
    Message::new(Role::Assistant, text)
}
fn contents(ms: &[Message]) -> Vec<&str> {
    ms.iter().map(|m| m.content_str().unwrap_or("")).collect()
}

#[test]
fn delta_client_appends_the_new_message() {
    let h = [u("u1"), a("a1")];
    assert_eq!(contents(to_append(&h, &[u("u2")])), ["u2"]);
}

#[test]
fn full_resend_appends_only_the_tail() {
    let h = [u("u1"), a("a1")];
    assert_eq!(
        contents(to_append(&h, &[u("u1"), a("a1"), u("u2")])),
        ["u2"]
    );
}

#[test]
fn recent_window_resend_appends_only_the_tail() {
    let h = [u("u1"), a("a1"), u("u2"), a("a2")];
    assert_eq!(
        contents(to_append(&h, &[u("u2"), a("a2"), u("u3")])),
        ["u3"]
    );
}

#[test]
fn unmatched_messages_are_never_dropped() {
    let h = [u("u1"), a("a1")];
    let m = [u("x"), a("y"), u("u2")];
    assert_eq!(contents(to_append(&h, &m)), ["x", "y", "u2"]);
}

#[test]
fn a_repeated_utterance_is_a_new_message() {
    let h = [u("yes"), a("a1")];
    assert_eq!(contents(to_append(&h, &[u("yes")])), ["yes"]);
}

#[test]
fn a_retry_after_a_failed_call_is_not_a_duplicate() {
    let h = [u("u1")];
    assert!(to_append(&h, &[u("u1")]).is_empty());
}

#[test]
fn empty_sides() {
    assert_eq!(contents(to_append::<Message>(&[], &[u("u1")])), ["u1"]);
    assert!(to_append(&[u("u1")], &[]).is_empty());
}

#[test]
fn shortened_assistant_text_lines_up() {
    let h = [u("joke?"), a("Why did the scarecrow win an award?")];
    let m = [u("joke?"), a("Why did the"), u("story instead")];
    assert_eq!(contents(to_append(&h, &m)), ["story instead"]);
    // But a user message is never matched by prefix.
    let h = [u("tell me a joke")];
    assert_eq!(contents(to_append(&h, &[u("tell me")])), ["tell me"]);
}

#[test]
fn tool_call_ids_must_agree() {
    let call = |id: &str| {
        let mut m = Message::new(Role::Assistant, Value::Null);
        m.set_tool_calls(Some(vec![json!({"id": id, "type": "function",
            "function": {"name": "f", "arguments": "{}"}})]));
        m
    };
    let result = |id: &str| {
        let mut m = Message::new(Role::Tool, "42");
        m.set_tool_call_id(Some(id.into()));
        m
    };
    let h = [u("q"), call("c1"), result("c1")];
    assert!(to_append(&h, &[u("q"), call("c1"), result("c1")]).is_empty());
    assert_eq!(to_append(&h, &[call("c2"), result("c2")]).len(), 2);
    assert_eq!(to_append(&h, &[result("c2")]).len(), 1);
}

fn cut(text: &str, original: &str) -> Message {
    crate::memory::interruption::interrupted_reply(
        a(text),
        &a(original),
        true,
        1,
        None,
        "new_request",
    )
}

fn dropped() -> Hints {
    Hints {
        front_dropped: true,
        ..Hints::default()
    }
}

#[test]
fn a_shortened_reply_is_reported() {
    let h = [u("joke?"), a("Why did the scarecrow win?")];
    let r = reconcile(
        &h,
        &[u("joke?"), a("Why did"), u("story")],
        Hints::default(),
    );
    assert_eq!(r.new_from(99), 2);
    assert_eq!(r.shortened, vec![(1, "Why did".to_owned())]);
    // The same text is no correction.
    let r = reconcile(
        &h,
        &[u("joke?"), a("Why did the scarecrow win?"), u("x")],
        Hints::default(),
    );
    assert!(r.shortened.is_empty());
}

#[test]
fn a_client_may_leave_out_an_interrupted_reply() {
    let h = [u("joke?"), cut("Why", "Why did the scarecrow")];
    assert_eq!(
        contents(to_append(&h, &[u("joke?"), u("story")])),
        ["story"]
    );
    // A delta client's new message is still new.
    assert_eq!(contents(to_append(&h, &[u("story")])), ["story"]);
    // Saying the same thing again after a cut reply is a new utterance.
    assert_eq!(contents(to_append(&h, &[u("joke?")])), ["joke?"]);
    // In the middle of a resent conversation too.
    let h = [u("1"), cut("", "x"), u("2"), a("b")];
    assert_eq!(
        contents(to_append(&h, &[u("1"), u("2"), a("b"), u("3")])),
        ["3"]
    );
}

#[test]
fn resending_up_to_a_cut_reply_adds_only_the_repeated_utterance() {
    let h = [u("1"), a("b"), u("q"), cut("Why", "Why did")];
    assert_eq!(contents(to_append(&h, &[u("1"), a("b"), u("q")])), ["q"]);
}

#[test]
fn a_full_resend_after_trimming_appends_only_the_new_tail() {
    let h = [u("u2"), a("a2"), u("u3"), a("a3")];
    let m = [
        u("u1"),
        a("a1"),
        u("u2"),
        a("a2"),
        u("u3"),
        a("a3"),
        u("u4"),
    ];
    let r = reconcile(&h, &m, dropped());
    assert_eq!(contents(&m[r.new_from(99)..]), ["u4"]);
    // Without trimming, unknown leading messages are never dropped.
    // Without trimming, the request has messages recall never held
    // before its start: it wins whole, and nothing it sent is dropped.
    assert_eq!(
        reconcile(&h, &m, Hints::default()).decision,
        Decision::Diverge { at: 0, from: 0 }
    );
    let h = [u("hi")];
    assert_eq!(
        reconcile(&h, &[u("other"), u("hi")], Hints::default()).new_from(2),
        0
    );
}

#[test]
fn whitespace_or_blanked_tool_text_is_no_cut() {
    let h = [u("q"), a("Sure. ")];
    let r = reconcile(&h, &[u("q"), a("Sure."), u("n")], Hints::default());
    assert_eq!((r.new_from(99), r.shortened.len()), (2, 0));
    let mut call = a("Let me check.");
    call.set_tool_calls(Some(vec![json!({"id": "c1"})]));
    let mut sent = a("");
    sent.set_tool_calls(Some(vec![json!({"id": "c1"})]));
    let r = reconcile(&[u("q"), call], &[u("q"), sent], Hints::default());
    assert_eq!((r.new_from(2), r.shortened.len()), (2, 0));
}

#[test]
fn a_recorded_failure_does_not_turn_a_retry_into_a_duplicate() {
    let fail = crate::memory::interruption::failure_reply("Sorry.", "503");
    let h = [u("a"), a("b"), u("q"), fail];
    assert!(to_append(&h, &[u("q")]).is_empty());
    assert_eq!(contents(to_append(&h, &[u("q"), u("next")])), ["next"]);
}

#[test]
fn text_beyond_what_went_out_still_lines_up() {
    let h = [u("q"), cut("Why", "Why did it")];
    let r = reconcile(&h, &[u("q"), a("Why did"), u("n")], Hints::default());
    assert_eq!((r.new_from(99), r.shortened.len()), (2, 0));
}

#[test]
fn stored_extension_fields_do_not_prevent_a_match() {
    let mut stored = u("u1");
    stored.turn_id = Some(1);
    stored.timestamp = Some(5);
    stored.metadata_mut().insert("source", json!("message"));
    assert!(to_append(&[stored, a("a1")], &[u("u1"), a("a1"), u("u2")]).len() == 1);
}

/// Stored replies, as the session records them.
fn llm(text: &str) -> Message {
    let mut m = a(text);
    m.metadata_mut().insert("source", json!("llm"));
    m
}

fn decide(h: &[Message], m: &[Message]) -> Decision {
    reconcile(h, m, Hints::default()).decision
}

#[test]
fn regenerate_supersedes_the_reply_and_appends_nothing() {
    let h = [u("u1"), llm("a1"), u("u2"), llm("a2")];
    let r = reconcile(&h, &[u("u1"), a("a1"), u("u2")], Hints::default());
    assert_eq!(r.decision, Decision::Diverge { at: 3, from: 3 });
    assert_eq!(r.rewrite(&h, 3), Some(Rewrite::Regenerate));
}

#[test]
fn a_window_resend_regenerates_too() {
    let h = [u("u1"), llm("a1"), u("u2"), llm("a2"), u("u3"), llm("a3")];
    assert_eq!(
        decide(&h, &[u("u2"), a("a2"), u("u3")]),
        Decision::Diverge { at: 5, from: 3 }
    );
}

#[test]
fn editing_the_last_message_supersedes_it_and_its_reply() {
    let h = [u("u1"), llm("a1"), u("u2"), llm("a2")];
    let m = [u("u1"), a("a1"), u("u2 edited")];
    let r = reconcile(&h, &m, Hints::default());
    assert_eq!(r.decision, Decision::Diverge { at: 2, from: 2 });
    assert_eq!(r.rewrite(&h, 3), Some(Rewrite::Edit));
}

#[test]
fn an_earlier_edit_makes_the_request_win_from_there() {
    let h = [u("u1"), llm("a1"), u("u2"), llm("a2")];
    let m = [u("u1 redacted"), a("a1"), u("u2"), a("a2"), u("u3")];
    assert_eq!(decide(&h, &m), Decision::Diverge { at: 0, from: 0 });
    // A pair taken out in the middle: what comes before it stays.
    let h = [u("u1"), llm("a1"), u("u2"), llm("a2"), u("u3"), llm("a3")];
    let m = [u("u1"), a("a1"), u("u3"), a("a3"), u("u4")];
    assert_eq!(decide(&h, &m), Decision::Diverge { at: 2, from: 2 });
}

#[test]
fn no_evidence_no_divergence() {
    // The same words again from a delta client: a new utterance.
    let h = [u("yes"), llm("a1")];
    assert_eq!(decide(&h, &[u("yes")]), Decision::Append { from: 0 });
    // Nothing in common: a delta client's own lines, all new.
    let h = [u("u1"), llm("a1")];
    assert_eq!(
        decide(&h, &[a("x"), u("y"), u("u2")]),
        Decision::Append { from: 0 }
    );
    // A user message alone is no evidence: its reply must follow it.
    let h = [u("u1"), llm("a1"), u("u2"), llm("a2")];
    assert_eq!(
        decide(&h, &[u("u1"), a("other"), u("u3")]),
        Decision::Append { from: 0 }
    );
}

#[test]
fn content_compares_canonically() {
    let parts = Message::new(Role::User, json!([{"type": "text", "text": "hello there"}]));
    let h = [u("hello there"), llm("hi")];
    assert_eq!(
        contents(to_append(&h, &[parts.clone(), a("hi"), u("next")])),
        ["next"]
    );
    // And the other way round, with the parts stored.
    let h = [parts, llm("hi")];
    assert_eq!(
        contents(to_append(&h, &[u("hello there"), a("hi"), u("next")])),
        ["next"]
    );
    let image = Message::new(
        Role::User,
        json!([{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "x"}}]),
    );
    assert!(matches!(lines_up(&image, &u("hi")), Match::No));
}

#[test]
fn tool_calls_compare_by_id_name_and_arguments() {
    let call = |args: &str, extra: Value| {
        let mut m = Message::new(Role::Assistant, Value::Null);
        let mut c = json!({"id": "c1", "type": "function",
            "function": {"name": "f", "arguments": args}});
        if let (Some(c), Some(extra)) = (c.as_object_mut(), extra.as_object()) {
            c.extend(extra.clone());
        }
        m.set_tool_calls(Some(vec![c]));
        m
    };
    let stored = call(r#"{"a": 1, "b": [2]}"#, json!({}));
    assert!(matches!(
        lines_up(&stored, &call(r#"{"b":[2],"a":1}"#, json!({"index": 0}))),
        Match::Same
    ));
    assert!(matches!(
        lines_up(&stored, &call(r#"{"a": 2}"#, json!({}))),
        Match::No
    ));
}

fn gone(text: &str) -> Message {
    let mut m = crate::memory::interruption::interrupted_reply(
        a(text),
        &a("the whole reply"),
        false,
        1,
        None,
        "client_gone",
    );
    m.metadata_mut().insert("source", json!("llm"));
    m
}

#[test]
fn a_client_that_left_and_sends_again_retries() {
    let h = [u("u1"), llm("a1"), u("u2"), gone("the wh")];
    // Delta and full resend alike.
    assert_eq!(decide(&h, &[u("u2")]), Decision::Retry { supersede: 3 });
    assert_eq!(
        decide(&h, &[u("u1"), a("a1"), u("u2")]),
        Decision::Retry { supersede: 3 }
    );
    let r = reconcile(&h, &[u("u2")], Hints::default());
    assert_eq!(r.rewrite(&h, 1), Some(Rewrite::Retry));
    // Something new after it is a new turn, not a retry.
    assert_eq!(
        decide(&h, &[u("u2"), u("more")]).clone(),
        Decision::Append { from: 1 }
    );
    // A failed call too.
    let fail = crate::memory::interruption::failure_reply("Sorry.", "503");
    let h = [u("u1"), fail];
    assert_eq!(decide(&h, &[u("u1")]), Decision::Retry { supersede: 1 });
}

#[test]
fn a_barge_in_with_the_same_words_is_a_new_utterance() {
    let mut cut = cut("Why", "Why did");
    cut.metadata_mut().insert("source", json!("llm"));
    let h = [u("joke?"), cut];
    assert_eq!(decide(&h, &[u("joke?")]), Decision::Append { from: 0 });
}

#[test]
fn the_client_saying_retry_reruns_a_delivered_reply() {
    let h = [u("u1"), llm("a1")];
    let retry = Hints {
        retry: true,
        ..Hints::default()
    };
    assert_eq!(
        reconcile(&h, &[u("u1")], retry).decision,
        Decision::Retry { supersede: 1 }
    );
    // But not when the request holds something new.
    assert_eq!(
        reconcile(&h, &[u("u2")], retry).decision,
        Decision::Append { from: 0 }
    );
}

#[test]
fn superseded_messages_are_invisible() {
    let mut old = llm("a2");
    crate::memory::interruption::supersede(&mut old, 1);
    let h = [u("u1"), llm("a1"), u("u2"), old, llm("a2 again")];
    assert_eq!(
        contents(to_append(
            &h,
            &[u("u1"), a("a1"), u("u2"), a("a2 again"), u("u3")]
        )),
        ["u3"]
    );
    assert_eq!(contents(to_append(&h, &[u("u3")])), ["u3"]);
}

#[test]
fn messages_recall_added_may_be_missing_from_a_resend() {
    let mut greeting = a("Hi, I am Ava.");
    greeting.metadata_mut().insert("source", json!("greeting"));
    let mut reminder = a("Are you still there?");
    reminder.metadata_mut().insert("source", json!("silence"));
    let h = [greeting, u("u1"), llm("a1"), reminder, u("u2"), llm("a2")];
    let m = [u("u1"), a("a1"), u("u2"), a("a2"), u("u3")];
    assert_eq!(contents(to_append(&h, &m)), ["u3"]);
    // And a regenerate past them is still a regenerate.
    assert_eq!(
        decide(&h, &[u("u1"), a("a1"), u("u2")]),
        Decision::Diverge { at: 5, from: 3 }
    );
}

/// `overlap` as it was before it stopped early: every start that could
/// line up tried.
fn overlap_trying_every_start(h: &[Message], sent: &[Message], front_dropped: bool) -> Overlap {
    let mut best = Overlap::default();
    let (earliest, _) = earliest_start(h, sent.len());
    for start in earliest..h.len() {
        if best.overlap == sent.len() {
            return best;
        }
        if let Some(found) = align(h, start, sent) {
            if found.overlap > best.overlap {
                best = found;
            }
        }
    }
    if front_dropped && earliest == 0 && !h.is_empty() {
        for skip in 1..sent.len() {
            if let Some(mut found) = align(h, 0, &sent[skip..]) {
                found.overlap += skip;
                if found.overlap > best.overlap {
                    best = found;
                }
            }
        }
    }
    best
}

/// A stored message of a kind `overlap` treats apart, from a tiny
/// alphabet so that messages collide.
fn stored_kind() -> impl proptest::strategy::Strategy<Value = Message> {
    use proptest::prelude::*;
    (0u8..7, 0u8..3).prop_map(|(kind, word)| {
        let text = ["x", "y", "x y"][word as usize];
        match kind {
            0 | 1 => u(text),
            2 => llm(text),
            3 => cut(text, "x y z"),
            4 => {
                let mut m = llm(text);
                crate::memory::interruption::supersede(&mut m, 1);
                m
            }
            5 => {
                let mut m = a(text);
                m.metadata_mut().insert("source", json!("greeting"));
                m
            }
            _ => crate::memory::interruption::failure_reply(text, "503"),
        }
    })
}

fn sent_message() -> impl proptest::strategy::Strategy<Value = Message> {
    use proptest::prelude::*;
    (any::<bool>(), 0u8..4).prop_map(|(user, word)| {
        let text = ["x", "y", "x y", "x "][word as usize];
        if user {
            u(text)
        } else {
            a(text)
        }
    })
}

#[test]
fn overlap_stops_after_a_shortened_run_as_every_start_would() {
    // The first start lines up two of three (the reply heard shortened);
    // the one start left holds a single visible message.
    let h = [u("x"), llm("x y")];
    let sent = [u("x"), a("x"), u("y")];
    let fast = overlap(&h, &sent, false);
    let slow = overlap_trying_every_start(&h, &sent, false);
    assert_eq!(
        (fast.overlap, &fast.shortened),
        (2, &vec![(1, "x".to_owned())])
    );
    assert_eq!((slow.overlap, &slow.shortened), (2, &fast.shortened));
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]

    /// Stopping once no later start can line up more gives what trying
    /// every start gives.
    #[test]
    fn overlap_stops_early_without_changing_its_answer(
        h in proptest::collection::vec(stored_kind(), 0..14),
        sent in proptest::collection::vec(sent_message(), 0..10),
        front_dropped in proptest::prelude::any::<bool>(),
    ) {
        let fast = overlap(&h, &sent, front_dropped);
        let slow = overlap_trying_every_start(&h, &sent, front_dropped);
        proptest::prop_assert_eq!(fast.overlap, slow.overlap);
        proptest::prop_assert_eq!(fast.shortened, slow.shortened);
    }
}

fn dev(text: &str) -> Message {
    Message::new(Role::Developer, text)
}

const REPEAT: &str = "Your reply was cut off: ask the user to repeat.";

#[test]
fn a_note_inside_the_conversation_is_new_once_then_lines_up() {
    // A framework's one-off note after a cut reply, sent with the heard text.
    let h = [u("joke?"), cut("Why did", "Why did the scarecrow win?")];
    let r = reconcile(&h, &[u("joke?"), a("Why"), dev(REPEAT)], Hints::default());
    assert_eq!(r.decision, Decision::Append { from: 2 });
    assert_eq!(r.shortened, vec![(1, "Why".to_owned())]);
    // Stored in its place, it lines up with every resend that carries it.
    let h = [
        u("joke?"),
        cut("Why", "Why did"),
        dev(REPEAT),
        a("Say again?"),
    ];
    let m = [
        u("joke?"),
        a("Why"),
        dev(REPEAT),
        a("Say again?"),
        u("a story"),
    ];
    assert_eq!(contents(to_append(&h, &m)), ["a story"]);
    let h = [
        u("joke?"),
        cut("Why", "Why did"),
        dev(REPEAT),
        a("Say again?"),
        u("a story"),
        a("Once"),
    ];
    let mut m = m.to_vec();
    m.extend([a("Once"), u("the end?")]);
    assert_eq!(contents(to_append(&h, &m)), ["the end?"]);
}

#[test]
fn the_same_note_again_later_is_a_new_note() {
    let h = [u("1"), a("b"), dev(REPEAT), a("Say again?")];
    let m = [u("1"), a("b"), dev(REPEAT), a("Say again?"), dev(REPEAT)];
    assert_eq!(contents(to_append(&h, &m)), [REPEAT]);
}

#[test]
fn a_resend_may_leave_out_a_note_it_sent_for_one_request() {
    let h = [u("q"), dev("answer in JSON"), a("{}")];
    let m = [u("q"), a("{}"), u("next")];
    let r = reconcile(&h, &m, Hints::default());
    assert_eq!(r.decision, Decision::Append { from: 2 });
    // Left out at the end, it makes no repeated utterance of the message
    // before it: that was answered.
    let h = [u("q"), a("{}"), u("next"), dev("be brief")];
    let r = reconcile(&h, &[u("q"), a("{}"), u("next")], Hints::default());
    assert_eq!(r.decision, Decision::Append { from: 3 });
}

#[test]
fn a_changed_note_is_an_edit() {
    let h = [u("1"), a("b"), dev("be brief"), a("ok"), u("2"), a("c")];
    let m = [u("1"), a("b"), dev("be long"), a("ok"), u("2")];
    let r = reconcile(&h, &m, Hints::default());
    assert_eq!(r.decision, Decision::Diverge { at: 2, from: 2 });
}
