//! Real sessions driven through random sequences of what clients do: a
//! delta client, one that resends everything, one that resends a recent
//! part; new turns, barge-ins (with new words or the same ones), a client
//! that leaves mid-reply and retries (or not), an SDK retry of a reply it
//! got, a failed call, regenerate, editing the last or an earlier message,
//! tool calls answered or dropped, messages the session API adds, a
//! one-off developer note inside the conversation, and content sent back
//! as a string or as text parts.
//!
//! A model of the client keeps the conversation as the client knows it.
//! After every step the session must hold exactly that conversation
//! (setting aside what the client never had: cut replies, failure records,
//! messages recall added), so that no turn is stored twice and nothing the
//! client sent is lost; and every window the session's history gives any
//! upstream must be one the upstream accepts (`render::check`).

use std::sync::Arc;

use proptest::prelude::*;
use recall::clock::Clock;
use recall::config::{HistoryConfig, InterruptedRendering, OnNewRequest, Roles};
use recall::memory::interruption::{is_failure, is_interrupted, is_superseded};
use recall::memory::message::{leading_instructions, Message, Role};
use recall::memory::render::{check, outbound};
use recall::memory::session::{Joins, Policy, Reply, Session, Store, TurnRequest};
use recall::memory::tokens::Encoding;
use recall::memory::window::Limits;
use recall::metrics::Metrics;
use recall::proxy::protocol::{Vendor, VendorRules};
use recall::store::Storage;
use recall::webhook::LogOnly;
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Sends only what is new.
    Delta,
    /// Resends its whole conversation.
    Full,
    /// Resends its newest messages (at least this many).
    Window(usize),
}

#[derive(Debug, Clone, Copy)]
enum Act {
    Say,
    /// A new utterance while the reply streams; the same words or new ones.
    BargeIn {
        same_words: bool,
    },
    /// The client leaves mid-reply (or the call fails), then sends the
    /// same request again, saying so in a header or not, or moves on.
    Lost {
        failed: bool,
        retry: bool,
        header: bool,
    },
    /// The SDK retries a request whose reply it did not get, though recall
    /// delivered it.
    SdkRetry,
    Regenerate,
    EditLast,
    EditEarlier,
    Tools {
        answered: bool,
    },
    /// The session API adds an assistant message.
    Command,
    /// A one-off developer note after the conversation so far (as Pipecat
    /// adds when a barge-in yields no transcript), answered; kept in the
    /// client's context from then on.
    Note,
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        4 => Just(Act::Say),
        1 => any::<bool>().prop_map(|same_words| Act::BargeIn { same_words }),
        2 => (any::<bool>(), any::<bool>(), any::<bool>())
            .prop_map(|(failed, retry, header)| Act::Lost { failed, retry, header }),
        1 => Just(Act::SdkRetry),
        2 => Just(Act::Regenerate),
        1 => Just(Act::EditLast),
        1 => Just(Act::EditEarlier),
        1 => any::<bool>().prop_map(|answered| Act::Tools { answered }),
        1 => Just(Act::Command),
        1 => Just(Act::Note),
    ]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Delta),
        Just(Kind::Full),
        (2usize..8).prop_map(Kind::Window),
    ]
}

struct World {
    session: Arc<Session>,
    policy: Arc<Policy>,
    kind: Kind,
    /// The conversation as the client knows it.
    view: Vec<Message>,
    /// Sends user texts back as parts arrays.
    parts: bool,
    n: usize,
    now: i64,
}

fn user(text: &str) -> Message {
    Message::new(Role::User, text)
}

fn reply(text: &str) -> Message {
    Message::new(Role::Assistant, text)
}

impl World {
    fn new(kind: Kind, parts: bool) -> Self {
        let policy = Arc::new(Policy {
            history: HistoryConfig {
                failure_message: Some("Sorry, try again.".into()),
                ..HistoryConfig::default()
            },
            memory: Default::default(),
            long_term: Default::default(),
            on_new_request: OnNewRequest::Interrupt,
            barge_in_after_close_ms: 0,
            metrics: Arc::new(Metrics::default()),
            notifier: Arc::new(LogOnly),
            storage: Arc::new(Storage::Memory),
            clock: Clock::manual(1),
        });
        let (session, _) = Store::default().get_or_create("s", 0);
        Self {
            session,
            policy,
            kind,
            view: Vec::new(),
            parts,
            n: 0,
            now: 1,
        }
    }

    fn fresh(&mut self, what: &str) -> String {
        self.n += 1;
        format!("{what}-{}", self.n)
    }

    /// What the client sends, `new` being what it adds to its view.
    fn request(&self, new: &[Message]) -> Vec<Message> {
        let mut all = self.view.clone();
        all.extend_from_slice(new);
        let mut sent = match self.kind {
            Kind::Delta => new.to_vec(),
            Kind::Full => all,
            Kind::Window(k) => all[all.len().saturating_sub(k.max(new.len()))..].to_vec(),
        };
        if self.parts {
            for m in sent.iter_mut().filter(|m| m.role == Role::User) {
                if let Value::String(s) = &m.content {
                    m.content = json!([{"type": "text", "text": s}]);
                }
            }
        }
        sent
    }

    fn begin(&mut self, sent: &[Message], retrying: bool) -> Reply {
        // As the chat path does: the leading instructions go ahead, unstored.
        let sent = &sent[leading_instructions(sent)..];
        self.now += 1;
        self.policy.clock.advance(1);
        let rules = rules(InterruptedRendering::Truncated, Roles::Any, false);
        let turn = TurnRequest {
            incoming: sent,
            user: None,
            memory_user: None,
            encoding: Encoding::Approx,
            now_ms: self.now,
            retrying,
            idempotency_key: None,
            rules: &rules,
            fallback_rules: None,
            joins: Joins::Reconcile,
            place: None,
        };
        match self.session.begin(&self.policy, &turn) {
            Ok((_, flight)) => flight,
            Err(e) => panic!("the turn was refused: {e:?}"),
        }
    }

    fn answer(&mut self, flight: &Reply, m: Message) {
        flight.started();
        drop(flight.completed_whole(m, Some("stop".into())));
    }

    /// A new user message, answered whole.
    fn say(&mut self, text: String) {
        let u = user(&text);
        let sent = self.request(std::slice::from_ref(&u));
        let flight = self.begin(&sent, false);
        let r = reply(&self.fresh("reply"));
        self.answer(&flight, r.clone());
        self.view.extend([u, r]);
    }

    /// Whether `sent` holds a user message with its reply right after it
    /// (what a regenerate or an edit needs to be told from new messages).
    fn evidence(sent: &[Message]) -> bool {
        sent.windows(2)
            .any(|w| w[0].role == Role::User && w[1].role == Role::Assistant)
    }

    fn ends_with_a_reply(&self) -> bool {
        let n = self.view.len();
        n >= 2
            && self.view[n - 1].role == Role::Assistant
            && !self.view[n - 1].has_tool_calls()
            && self.view[n - 2].role == Role::User
    }

    fn run(&mut self, act: Act) {
        match act {
            Act::Say => {
                let t = self.fresh("say");
                self.say(t);
            }
            Act::BargeIn { same_words } => {
                let first = self.fresh("cut-off");
                let u1 = user(&first);
                let sent = self.request(std::slice::from_ref(&u1));
                let _open = self.begin(&sent, false);
                // The reply was not heard: the client keeps only its message.
                self.view.push(u1);
                let again = if same_words {
                    first
                } else {
                    self.fresh("barge")
                };
                self.say(again);
            }
            Act::Lost {
                failed,
                retry,
                header,
            } => {
                let u = user(&self.fresh("lost"));
                let sent = self.request(std::slice::from_ref(&u));
                let flight = self.begin(&sent, false);
                if failed {
                    flight.failed("upstream answered 503");
                } else {
                    flight.client_gone();
                }
                self.view.push(u);
                if retry {
                    let flight = self.begin(&sent, header);
                    let r = reply(&self.fresh("retried"));
                    self.answer(&flight, r.clone());
                    self.view.push(r);
                }
            }
            Act::SdkRetry if self.ends_with_a_reply() => {
                self.view.pop();
                let last = self.view.pop().expect("a user message");
                let sent = self.request(std::slice::from_ref(&last));
                let flight = self.begin(&sent, true);
                let r = reply(&self.fresh("again"));
                self.answer(&flight, r.clone());
                self.view.extend([last, r]);
            }
            Act::Regenerate if self.ends_with_a_reply() && !matches!(self.kind, Kind::Delta) => {
                let gone = self.view.pop().expect("a reply");
                let sent = self.request(&[]);
                if !Self::evidence(&sent) {
                    self.view.push(gone);
                    return;
                }
                let flight = self.begin(&sent, false);
                let r = reply(&self.fresh("regenerated"));
                self.answer(&flight, r.clone());
                self.view.push(r);
            }
            Act::EditLast if self.ends_with_a_reply() && !matches!(self.kind, Kind::Delta) => {
                let kept = self.view.len() - 2;
                let old = self.view.split_off(kept);
                let edited = user(&self.fresh("edited"));
                let sent = self.request(std::slice::from_ref(&edited));
                if !Self::evidence(&sent) {
                    self.view.extend(old);
                    return;
                }
                let flight = self.begin(&sent, false);
                let r = reply(&self.fresh("reply"));
                self.answer(&flight, r.clone());
                self.view.extend([edited, r]);
            }
            Act::EditEarlier if !matches!(self.kind, Kind::Delta) => {
                let new = user(&self.fresh("next"));
                let sent = self.request(std::slice::from_ref(&new));
                let from = self.view.len() + 1 - sent.len();
                // The first user message the request holds, with a pair of a
                // user message and its reply after it, left as it was.
                let Some(i) = (from..self.view.len()).find(|&i| {
                    self.view[i].role == Role::User && Self::evidence(&self.view[i + 1..])
                }) else {
                    return;
                };
                let text = self.fresh("redacted");
                self.view[i].content = Value::String(text);
                let sent = self.request(std::slice::from_ref(&new));
                let flight = self.begin(&sent, false);
                let r = reply(&self.fresh("reply"));
                self.answer(&flight, r.clone());
                self.view.extend([new, r]);
            }
            Act::Tools { answered } => {
                let u = user(&self.fresh("tool-q"));
                let sent = self.request(std::slice::from_ref(&u));
                let flight = self.begin(&sent, false);
                let id = self.fresh("call");
                let mut call = Message::new(Role::Assistant, Value::Null);
                call.set_tool_calls(Some(vec![json!({"id": id, "type": "function",
                    "function": {"name": "lookup", "arguments": "{\"q\": 1}"}})]));
                self.answer(&flight, call.clone());
                self.view.extend([u, call]);
                if answered {
                    let mut result = Message::new(Role::Tool, "42");
                    result.set_tool_call_id(Some(id));
                    let sent = self.request(std::slice::from_ref(&result));
                    let flight = self.begin(&sent, false);
                    let r = reply(&self.fresh("answer"));
                    self.answer(&flight, r.clone());
                    self.view.extend([result, r]);
                }
            }
            Act::Command => {
                let text = self.fresh("command");
                let added =
                    self.session
                        .append_messages(&self.policy, vec![reply(&text)], self.now);
                assert!(added.is_ok());
            }
            Act::Note if !self.view.is_empty() => {
                let note = Message::new(Role::Developer, self.fresh("note"));
                let sent = self.request(std::slice::from_ref(&note));
                let flight = self.begin(&sent, false);
                let r = reply(&self.fresh("noted"));
                self.answer(&flight, r.clone());
                // Sent alone, it leads the request: an instruction for it.
                if matches!(self.kind, Kind::Delta) {
                    self.view.push(r);
                } else {
                    self.view.extend([note, r]);
                }
            }
            // Not something this client can do now.
            _ => {}
        }
    }
}

fn rules(interrupted: InterruptedRendering, roles: Roles, custom: bool) -> VendorRules {
    VendorRules {
        mode: if custom {
            Vendor::Custom
        } else {
            Vendor::Openai
        },
        interruptable: true,
        strip_fields: Vec::new(),
        interrupted,
        interrupted_marker: " [cut]".into(),
        roles,
    }
}

/// A message as the comparison sees it: role, text, and tool-call ids.
fn key(m: &Message) -> String {
    let text = match &m.content {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        other => other.to_string(),
    };
    let calls: Vec<&str> = m.tool_call_ids().flatten().collect();
    format!("{}:{text}{calls:?}{:?}", m.role, m.tool_call_id())
}

/// What the client may not have: cut replies, failure records, messages
/// the session API added.
fn the_clients(m: &Message) -> bool {
    !(is_superseded(m)
        || is_failure(m)
        || (m.role == Role::Assistant && is_interrupted(m))
        || m.source() == Some("command"))
}

fn config() -> ProptestConfig {
    ProptestConfig {
        // PROPTEST_CASES runs more locally; CI runs these.
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(300),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn the_session_holds_what_the_client_saw_and_every_window_is_accepted(
        kind in kind(),
        parts in any::<bool>(),
        acts in prop::collection::vec(act(), 1..24),
    ) {
        let mut world = World::new(kind, parts);
        for (step, act) in acts.iter().enumerate() {
            world.run(*act);
            let stored = world.session.snapshot().messages;
            let held: Vec<String> = stored.iter().filter(|m| the_clients(m)).map(|m| key(m)).collect();
            let seen: Vec<String> = world.view.iter().map(key).collect();
            prop_assert_eq!(
                &held, &seen,
                "after step {} ({:?}) of {:?}: the session holds something else than the client saw",
                step, act, acts
            );
            for (interrupted, roles, custom) in [
                (InterruptedRendering::Truncated, Roles::Any, false),
                (InterruptedRendering::Annotated, Roles::Alternate, false),
                (InterruptedRendering::Original, Roles::Any, true),
            ] {
                let rules = rules(interrupted, roles, custom);
                for limits in [
                    Limits::default(),
                    Limits { messages: 6, ..Limits::default() },
                    Limits { chars: 40, ..Limits::default() },
                ] {
                    let sent = outbound(&stored, &rules, limits);
                    let whole = outbound(&stored, &rules, Limits::default()).messages == sent.messages;
                    if let Err(e) = check(&sent.messages, roles, whole) {
                        prop_assert!(false, "after step {} of {:?}: {} in {:?}", step, acts, e, sent.messages);
                    }
                }
            }
        }
    }
}
