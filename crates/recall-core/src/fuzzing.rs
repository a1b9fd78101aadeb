//! Entry points for the fuzz targets in `fuzz/` (which build this crate
//! alone) and, through the server's `recall::fuzzing`, for
//! `tests/suite/fuzz_corpus.rs`, which replays their seed corpora and every
//! crasher found so far. Each takes raw bytes, drives the same code a
//! request or a config file goes through, and panics only when an
//! invariant of that code is broken.
//!
//! Not an API: hidden from the docs, and it changes with the code it drives.

use std::path::Path;

use serde_json::{Map, Value};

use crate::config::{Config, InterruptedRendering, Roles};
use crate::exchange::accumulate::{self, Event, ReplyAccumulator};
use crate::exchange::protocol::{Protocol, TurnInfo, Vendor, VendorRules};
use crate::memory::interruption::{self, Spoken};
use crate::memory::message::Message;
use crate::memory::reconcile;
use crate::memory::render;
use crate::memory::turns;
use crate::memory::window::{self, Limits};

/// An upstream's SSE stream, cut into reads the way the network may cut it:
/// the first byte sets the read size (1 to 64 bytes), the rest is the
/// stream. What the relay remembers must not depend on where reads end, and
/// whatever arrives must give a message that serialises.
pub fn sse_accumulator(data: &[u8]) {
    let Some((&first, stream)) = data.split_first() else {
        return;
    };
    let read = usize::from(first % 64) + 1;
    let mut pieces = ReplyAccumulator::default();
    let mut parser = sse_parse::SseParser::new();
    for chunk in stream.chunks(read) {
        parser.feed(chunk);
        while let Some(event) = parser.next_event() {
            let event = Event::parse(&event.data);
            let _ = event.carries_content();
            pieces.push(&event);
        }
    }
    let mut whole = ReplyAccumulator::default();
    let mut parser = sse_parse::SseParser::new();
    parser.feed(stream);
    while let Some(event) = parser.next_event() {
        whole.push_data(&event.data);
    }
    assert_eq!(pieces.content(), whole.content(), "reads changed the text");
    assert_eq!(pieces.to_message(), whole.to_message());
    assert_eq!(pieces.is_complete(), whole.is_complete());
    let message = pieces.to_message();
    assert!(serde_json::to_vec(&message).is_ok());
    let _ = message.to_openai();

    // The same bytes as a non-streaming completion body.
    if let Some(read) = accumulate::completion_read(stream, true) {
        assert!(serde_json::to_vec(&read.reply).is_ok());
        // The parts found are slices of the body, where a reader of the
        // same bytes looks them up.
        let parts = [read.parts.model, read.parts.usage, read.parts.message];
        for at in parts
            .into_iter()
            .chain([read.parts.finish_reason])
            .flatten()
        {
            assert!(stream
                .get(at)
                .is_some_and(|p| std::str::from_utf8(p).is_ok()));
        }
    }
}

/// A chat request body, through the checks of `POST /v1/chat/completions`
/// and then through what a turn does with it: the request's conversation
/// is split into a stored history and the messages sent now (the split
/// points come from the input's length, so the fuzzer controls them),
/// reconciled, stamped, appended, trimmed, windowed and rewritten for the
/// upstream, as `Session::append` and `Protocol::turn_body` do. Before that,
/// the body's one-pass reading is held equal to its general one.
pub fn request_reconcile(data: &[u8]) {
    // The one-pass reading takes only bodies the general reading takes,
    // and reads them alike.
    if let Some((body, messages)) = crate::chat::one_pass::read(data, 2048) {
        let one_pass = crate::chat::ChatRequest { body, messages };
        let general = crate::chat::request::parse_body(data)
            .and_then(|body| crate::chat::request::request_of(body, 2048));
        match general {
            Ok(general) => assert_eq!(one_pass, general, "the two readings differ"),
            Err(e) => panic!("the one-pass reading took a body the general one refuses: {e}"),
        }
    }
    let request = match crate::chat::parse_request(data, 2048) {
        Ok(r) => r,
        Err(e) => {
            // A refusal says what is wrong (the server's answer to it is
            // built by the server's own entry point, `recall::fuzzing`).
            assert!(!e.to_string().is_empty(), "a refusal that says nothing");
            return;
        }
    };
    let mut instructions = request.messages;
    let conversation =
        instructions.split_off(crate::memory::message::leading_instructions(&instructions));
    let n = conversation.len();
    let split = data.len() % (n + 1);
    let resent_from = (data.len() / 7) % (split + 1);
    let front_dropped = data.len() % 2 == 1;
    let mut history: Vec<Message> = conversation[..split].to_vec();
    let incoming = &conversation[resent_from..];

    let hints = reconcile::Hints {
        front_dropped,
        retry: data.len() % 5 == 0,
    };
    let found = reconcile::reconcile(&history, incoming, hints);
    let from = found.new_from(incoming.len());
    assert!(from <= incoming.len(), "new messages past the request");
    let superseded_from = found.superseded_from().unwrap_or(history.len());
    assert!(
        superseded_from <= history.len(),
        "superseded past the history"
    );
    for (i, heard) in &found.shortened {
        let stored = history.get_mut(*i).expect("shortened index in the history");
        assert_eq!(stored.role, "assistant", "only replies are shortened");
        interruption::mark_stored(stored, Some(&Spoken::Text(heard.clone())), 1, "new_request");
    }
    if found.rewrite(&history, incoming.len()).is_some() {
        for m in &mut history[superseded_from..] {
            interruption::supersede(m, 2);
        }
    }
    let mut new = incoming[from..].to_vec();
    let turn_before = history.iter().filter_map(|m| m.turn_id).max().unwrap_or(0);
    let turn = turns::stamp_client_messages(&mut new, turn_before, history.last(), 2);
    assert!(turn >= turn_before, "the turn went backwards");
    history.extend(new);

    let max = usize::from(data.first().copied().unwrap_or(0) % 8);
    let drop = window::keep_start(&history, max);
    assert!(drop <= history.len());
    history.drain(..drop);
    let total: usize = history.iter().map(Message::byte_cost).sum();
    let drop = window::keep_start_bytes(&history, total, data.len() % 512);
    assert!(drop <= history.len());
    history.drain(..drop);
    let limits = Limits {
        messages: usize::from(data.last().copied().unwrap_or(0) % 6),
        chars: data.len() % 97,
        ..Limits::default()
    };

    for custom in [false, true] {
        let rules = VendorRules {
            mode: if custom {
                Vendor::Custom
            } else {
                Vendor::Openai
            },
            interruptable: true,
            strip_fields: vec!["user".into()],
            interrupted: [
                InterruptedRendering::Truncated,
                InterruptedRendering::Original,
                InterruptedRendering::Annotated,
            ][data.len() % 3],
            interrupted_marker: " [cut]".into(),
            roles: [Roles::Any, Roles::Alternate][data.len() / 3 % 2],
        };
        let window = render::outbound(&history, &rules, limits);
        assert!(window.start <= history.len());
        let whole =
            render::outbound(&history, &rules, Limits::default()).messages == window.messages;
        if let Err(e) = render::check(&window.messages, rules.roles, whole) {
            panic!("a window the upstream would refuse: {e}");
        }
        let body: Map<String, Value> = request.body.clone();
        let sent = Protocol::ChatCompletions
            .turn_body(
                &rules,
                &body,
                &instructions,
                &window.messages,
                Some(TurnInfo {
                    turn_id: turn,
                    summary: None,
                }),
                3,
            )
            .expect("the upstream body serialises");
        // What goes upstream is JSON that an OpenAI-compatible server (or
        // recall itself) can parse back.
        serde_json::from_slice::<Value>(&sent).expect("the upstream body parses back");
    }
    // Storage writes each message as JSON and reads it back.
    for m in &history {
        let text = serde_json::to_string(m).expect("a message serialises");
        let back: Message = serde_json::from_str(&text).expect("a stored message reads back");
        assert_eq!(back.role, m.role);
        assert_eq!(back.turn_id, m.turn_id);
        assert_eq!(back.tool_call_id(), m.tool_call_id());
    }
}

/// A config file: parsed and validated as at start-up; a config that loads
/// must print (`recall check`) as TOML that loads again.
pub fn config_load(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("fuzz.toml");
    let Ok(config) = Config::parse(text, path) else {
        return;
    };
    let printed = config.masked_toml();
    if let Err(e) = Config::parse(&printed, path) {
        panic!("`recall check` printed a config that does not load: {e}\n{printed}");
    }
}

/// The Responses API's two translations. The first byte picks one:
/// - even: the rest is a `POST /v1/responses` body. What `translate`
///   accepts must be a chat request chat accepts (`request_of`), and
///   what it refuses, a 400 that names a field.
/// - odd: the rest is a chat SSE stream, read in pieces of the size the
///   first byte sets. The Responses stream made of it must be SSE whose
///   every event is JSON of its `event:` type, numbered from 0 without a
///   gap, with a single terminal event at the end.
pub fn responses(data: &[u8]) {
    use crate::responses::{events::Events, request, response::Echo};
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    if first % 2 == 0 {
        let Ok(Value::Object(body)) = serde_json::from_slice::<Value>(rest) else {
            return;
        };
        match request::translate(body) {
            Ok(t) => {
                // The messages are what chat's own reading makes of them.
                let mut chat = t.chat.clone();
                let written = serde_json::to_value(&t.messages).expect("messages write");
                chat.insert("messages".into(), written);
                match crate::chat::request::request_of(chat, usize::MAX) {
                    Ok(read) => assert_eq!(read.messages, t.messages, "chat reads them otherwise"),
                    // An empty input is refused later, by the handler.
                    Err(e) => {
                        let empty = format!("{e:?}").contains("empty");
                        assert!(empty, "translated to a request chat refuses: {e:?}");
                    }
                }
                let built = crate::chat::request::request_with(t.chat, t.messages, usize::MAX);
                if let Err(e) = built {
                    let empty = format!("{e:?}").contains("empty");
                    assert!(empty, "translated to a request chat refuses: {e:?}");
                }
            }
            Err(crate::error::RequestError::Invalid { param, .. }) => {
                assert!(param.is_some(), "a refusal names no field");
            }
            Err(e) => panic!("an unexpected refusal: {e:?}"),
        }
        return;
    }
    let read = usize::from(first / 2 % 64) + 1;
    let mut events = Events::new(Echo::default(), "m");
    let mut out = Vec::new();
    events.start(&mut out);
    let mut parser = sse_parse::SseParser::new();
    let mut ended = false;
    for chunk in rest.chunks(read) {
        parser.feed(chunk);
        while let Some(e) = parser.next_event() {
            if ended {
                continue;
            }
            match Event::parse(&e.data) {
                Event::Done => {
                    ended = true;
                    events.finish(&mut out);
                }
                Event::Chunk(d) => events.chunk(&d, &mut out),
                Event::Malformed => {}
            }
        }
    }
    if !ended {
        events.incomplete("interrupted", &mut out);
    }
    let text = std::str::from_utf8(&out).expect("the stream is not UTF-8");
    let frames: Vec<&str> = text.split("\n\n").filter(|f| !f.is_empty()).collect();
    for (n, frame) in frames.iter().enumerate() {
        let (kind, data) = frame.split_once('\n').expect("an event without data");
        let kind = kind.strip_prefix("event: ").expect("no event line");
        let data = data.strip_prefix("data: ").expect("no data line");
        assert!(!data.contains('\n'), "a data line broken in two");
        let v: Value = serde_json::from_str(data).expect("an event that is not JSON");
        assert_eq!(v["type"], kind);
        assert_eq!(v["sequence_number"], n as u64, "sequence numbers skip");
        let terminal = matches!(kind, "response.completed" | "response.incomplete");
        assert_eq!(terminal, n + 1 == frames.len(), "a terminal event not last");
    }
}
