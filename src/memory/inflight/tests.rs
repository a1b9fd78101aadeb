//! The reply's transitions, without a session or a server.

use super::*;

const CTX: Ctx = Ctx {
    next_seq: 7,
    now_ms: 1_000,
};

fn chunk(text: &str) -> Event {
    Event::parse(&format!(
        r#"{{"choices":[{{"index":0,"delta":{{"content":"{text}"}}}}]}}"#
    ))
}

fn stop() -> Event {
    Event::parse(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#)
}

fn settled(r: Record) -> Settle {
    match r {
        Record::Settle(s) => s,
        _ => panic!("expected the reply to be settled"),
    }
}

fn cut(cause: Cause) -> Happened<'static> {
    Happened::Cut {
        spoken: None,
        cause,
    }
}

#[test]
fn a_cut_records_what_went_out_and_the_drain_updates_it_by_sequence_number() {
    let f = InFlight::new(3);
    f.started(500);
    f.on_passed(&[chunk("Why did ")]);
    f.on_received(&[chunk("the chicken")]);
    let s = settled(f.settle(cut(Cause::NewRequest), CTX));
    assert_eq!(s.kind, Settled::Interrupted(Cause::NewRequest));
    assert!(!s.end_waits);
    let record = s.reply.expect("a record");
    assert_eq!(record.content_str(), Some("Why did "));
    assert_eq!(record.turn_id, Some(3));
    assert!(interruption::is_interrupted(&record));
    assert!(f.is_cut() && f.is_settled());
    // Whoever comes second changes nothing of the turn.
    assert!(matches!(
        f.settle(cut(Cause::ClientGone), CTX),
        Record::Nothing
    ));
    assert!(matches!(
        f.settle(Happened::Delivered, CTX),
        Record::Nothing
    ));

    f.on_received(&[chunk(" cross?"), stop()]);
    let later = Ctx {
        next_seq: 12,
        ..CTX
    };
    match f.settle(
        Happened::Drained {
            complete: false,
            yielded: false,
        },
        later,
    ) {
        Record::Update {
            seq,
            change: Change::Original { full, complete, .. },
            drained,
        } => {
            assert_eq!(seq, 7, "the record's own number, not the next one");
            assert_eq!(full.content_str(), Some("Why did the chicken cross?"));
            assert!(complete);
            assert_eq!(drained, Some((true, false)));
        }
        _ => panic!("expected an update of the record"),
    }
}

#[test]
fn a_reply_whose_end_went_out_is_complete_whoever_settles_it() {
    let f = InFlight::new(1);
    f.on_passed(&[chunk("Hi"), stop(), Event::Done]);
    let s = settled(f.settle(cut(Cause::NewRequest), CTX));
    assert_eq!(s.kind, Settled::Complete);
    assert!(s.end_waits, "the body's end waits for this record");
    assert!(!f.is_cut());
    f.end_waits_for(Ticket::ready());
    assert!(matches!(
        f.settle(Happened::Delivered, CTX),
        Record::Wait(_)
    ));
    assert!(matches!(
        f.settle(Happened::Delivered, CTX),
        Record::Nothing
    ));
}

#[test]
fn the_reject_policy_settles_only_a_delivered_reply() {
    let f = InFlight::new(1);
    f.on_passed(&[chunk("Hi")]);
    assert!(matches!(
        f.settle(Happened::Rejecting, CTX),
        Record::Nothing
    ));
    assert!(!f.is_settled());
    f.on_passed(&[stop(), Event::Done]);
    assert_eq!(
        settled(f.settle(Happened::Rejecting, CTX)).kind,
        Settled::Complete
    );
}

#[test]
fn a_failed_call_records_the_configured_message_or_nothing() {
    let f = InFlight::new(2);
    let failed = Happened::Failed {
        error: "upstream answered 503",
        failure_message: Some("Sorry."),
    };
    let s = settled(f.settle(failed, CTX));
    assert_eq!(s.kind, Settled::Failed);
    let reply = s.reply.expect("the failure message");
    assert!(interruption::is_failure(&reply));
    assert_eq!(
        reply.timestamp,
        Some(1_000),
        "no answer began: the time of the failure"
    );

    let quiet = InFlight::new(2);
    let failed = Happened::Failed {
        error: "timeout",
        failure_message: None,
    };
    assert!(settled(quiet.settle(failed, CTX)).reply.is_none());
}

#[test]
fn a_stream_that_breaks_midway_is_recorded_as_cut_by_the_upstream() {
    let f = InFlight::new(1);
    f.on_passed(&[chunk("Half")]);
    let s = settled(f.settle(Happened::Broke("connection reset"), CTX));
    assert_eq!(s.kind, Settled::Broken);
    assert!(interruption::is_interrupted(&s.reply.expect("a record")));
    // A break before anything came is a failed call.
    let empty = InFlight::new(1);
    let s = settled(empty.settle(Happened::Broke("connection reset"), CTX));
    assert_eq!(s.kind, Settled::Failed);
    assert!(s.reply.is_none());
}

#[test]
fn the_answer_cache_hears_only_of_complete_replies() {
    let f = InFlight::new(1);
    f.on_complete(Box::new(|_, _| {}));
    f.on_passed(&[chunk("Half")]);
    assert!(settled(f.settle(cut(Cause::Endpoint), CTX))
        .on_complete
        .is_none());
    let g = InFlight::new(1);
    g.on_complete(Box::new(|_, _| {}));
    let whole = Happened::Whole {
        reply: Message::new(crate::memory::message::Role::Assistant, "Hello"),
        finish_reason: Some("stop".into()),
    };
    let (_, reason) = settled(g.settle(whole, CTX))
        .on_complete
        .expect("the cache's hook");
    assert_eq!(reason.as_deref(), Some("stop"));
}
