//! Micro-benchmarks of the pure pieces on the request path:
//! `cargo bench --bench pure`.

use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion};
use recall::config::Roles;
use recall::memory::message::{Message, Role};
use recall::memory::reconcile::{reconcile, Hints};
use recall::memory::render::outbound;
use recall::memory::tokens::Encoding;
use recall::memory::window::Limits;
use recall::proxy::accumulate::ReplyAccumulator;
use recall::proxy::protocol::{Protocol, TurnInfo, Vendor, VendorRules};
use serde_json::{json, Map, Value};

fn history(n: usize) -> Vec<Message> {
    (0..n)
        .map(|i| {
            let role = if i % 2 == 0 {
                Role::User
            } else {
                Role::Assistant
            };
            let mut m = Message::new(role, format!("message number {i} ").repeat(10));
            m.turn_id = Some(i as u64 / 2 + 1);
            m.timestamp = Some(1_700_000_000_000 + i as i64);
            m.metadata_mut().insert("source", json!("message"));
            m
        })
        .collect()
}

fn bench_reconcile(c: &mut Criterion) {
    let mut g = c.benchmark_group("reconcile");
    for n in [10usize, 1000, 10_000] {
        let h = history(n);
        let delta = vec![Message::new(Role::User, "a new question")];
        let mut resend: Vec<Message> = h[n.saturating_sub(20)..]
            .iter()
            .map(|m| Message::new(m.role, m.content.clone()))
            .collect();
        resend.push(Message::new(Role::User, "a new question"));
        g.bench_with_input(BenchmarkId::new("delta", n), &n, |b, _| {
            b.iter(|| reconcile(&h, &delta, Hints::default()))
        });
        g.bench_with_input(BenchmarkId::new("resend_last_20", n), &n, |b, _| {
            b.iter(|| reconcile(&h, &resend, Hints::default()))
        });
    }
    g.finish();
}

/// Where the window starts, over a history as a session holds it.
fn window_start(h: &[Arc<Message>], limits: Limits) -> usize {
    let rules = VendorRules {
        mode: Vendor::Openai,
        interruptable: true,
        strip_fields: Vec::new(),
        interrupted: Default::default(),
        interrupted_marker: String::new(),
        roles: Roles::Any,
    };
    outbound(h, &rules, limits).start
}

fn shared(h: Vec<Message>) -> Vec<Arc<Message>> {
    h.into_iter().map(Arc::new).collect()
}

fn bench_window(c: &mut Criterion) {
    let mut g = c.benchmark_group("window");
    for n in [10usize, 1000, 10_000] {
        let h = shared(history(n));
        let count = Limits {
            messages: 20,
            ..Limits::default()
        };
        let both = Limits {
            messages: 20,
            chars: 4000,
            ..Limits::default()
        };
        g.bench_with_input(BenchmarkId::new("count_20", n), &n, |b, _| {
            b.iter(|| window_start(&h, count))
        });
        g.bench_with_input(BenchmarkId::new("count_20_chars_4000", n), &n, |b, _| {
            b.iter(|| window_start(&h, both))
        });
    }
    g.finish();
}

/// `[history] window_tokens`: a window bound by tokens (about 20 of these
/// messages) over a long history. `cached` is every turn after the first:
/// the counts are in the messages. `first_count` tokenises the window's
/// messages, as for messages new to a window (a clone of the history has
/// no counts; only the messages the walk visits are counted).
fn bench_window_tokens(c: &mut Criterion) {
    let mut g = c.benchmark_group("window_tokens");
    let limits = |encoding| Limits {
        messages: 0,
        tokens: 1000,
        encoding,
        ..Limits::default()
    };
    for encoding in [Encoding::O200k, Encoding::Cl100k, Encoding::Approx] {
        encoding.load();
        let name = format!("{encoding:?}").to_lowercase();
        for n in [1000usize, 10_000] {
            let h = shared(history(n));
            let start = window_start(&h, limits(encoding));
            assert!((15..=25).contains(&(n - start)), "{}", n - start);
            g.bench_with_input(BenchmarkId::new(format!("cached_{name}"), n), &n, |b, _| {
                b.iter(|| window_start(&h, limits(encoding)))
            });
        }
        g.bench_function(
            BenchmarkId::new(format!("first_count_{name}"), 10_000),
            |b| {
                // By reference: dropping the copy is no part of the cost.
                b.iter_batched_ref(
                    || shared(history(10_000)),
                    |h| window_start(h, limits(encoding)),
                    BatchSize::LargeInput,
                )
            },
        );
    }
    g.finish();
}

fn bench_rewrite(c: &mut Criterion) {
    let window = history(20);
    let instructions = vec![Message::new(Role::System, "You are a helpful assistant.")];
    let body: Map<String, Value> =
        json!({"model": "gpt-4o-mini", "temperature": 0.3, "stream": true,
        "session_id": "s", "messages": []})
        .as_object()
        .cloned()
        .unwrap_or_default();
    for custom in [false, true] {
        let rules = VendorRules {
            mode: if custom {
                Vendor::Custom
            } else {
                Vendor::Openai
            },
            interruptable: true,
            strip_fields: Vec::new(),
            interrupted: Default::default(),
            interrupted_marker: String::new(),
            roles: Roles::Any,
        };
        let name = if custom {
            "rewrite_custom_20"
        } else {
            "rewrite_openai_20"
        };
        c.bench_function(name, |b| {
            b.iter(|| {
                Protocol::ChatCompletions.turn_body(
                    &rules,
                    &body,
                    &instructions,
                    &window,
                    Some(TurnInfo {
                        turn_id: 9,
                        summary: None,
                    }),
                    1,
                )
            })
        });
    }
}

/// 50 `chat.completion.chunk` events of one token each.
fn chat_chunks() -> Vec<String> {
    (0..50)
        .map(|i| {
            json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}, "finish_reason": null}]})
            .to_string()
        })
        .collect()
}

fn bench_accumulate(c: &mut Criterion) {
    let chunks = chat_chunks();
    c.bench_function("accumulate_50_chunks", |b| {
        b.iter(|| {
            let mut acc = ReplyAccumulator::default();
            for chunk in &chunks {
                acc.push_data(chunk);
            }
            acc.push_data("[DONE]");
            acc.to_message()
        })
    });
}

/// The Responses API's stream: 50 chat chunks parsed and given out as
/// Responses events, as `api::responses` does for each streamed response.
fn bench_responses_events(c: &mut Criterion) {
    use recall::api::responses::events::Events;
    use recall::api::responses::response::Echo;
    use recall::proxy::accumulate::Event;
    let chunks = chat_chunks();
    let echo = Echo {
        id: "resp_Y2hhaW5fMTMzZDkzYmRhZTUzOTBmZmYwYjNmYjMz_1aba238cfdbc76ff".into(),
        items: "Y2hhaW5fMTMzZDkzYmRhZTUzOTBmZmYwYjNmYjMz_1".into(),
        ..Echo::default()
    };
    c.bench_function("responses_events_50_chunks", |b| {
        b.iter(|| {
            let mut events = Events::new(echo.clone(), "m");
            let mut out = Vec::new();
            events.start(&mut out);
            for chunk in &chunks {
                if let Event::Chunk(delta) = Event::parse(chunk) {
                    events.chunk(&delta, &mut out);
                }
            }
            events.finish(&mut out);
            out
        })
    });
}

/// The `i`th of a user's records, created and updated at `i`.
fn record(i: usize, text: String, embedding: Vec<f32>) -> recall::memory::long_term::Record {
    recall::memory::long_term::Record {
        id: format!("mem_{i}"),
        text,
        strategy: "semantic".into(),
        namespace: "facts".into(),
        user: "u".into(),
        session: "s".into(),
        created_at: i as i64,
        updated_at: i as i64,
        recalled_at: 0,
        said_at: None,
        superseded_by: None,
        valid_to: None,
        embedding: embedding.into(),
        terms: Default::default(),
    }
}

/// A long-term search: every record of a user scored against the query
/// (OpenAI's small embedding model has 1,536 dimensions).
fn bench_long_term_rank(c: &mut Criterion) {
    use recall::memory::long_term::{hybrid, rank, Record};
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut vector = |dims: usize| -> Vec<f32> {
        (0..dims)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                (seed % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    };
    let mut g = c.benchmark_group("long_term_rank_1536");
    for n in [100usize, 1000] {
        let records: Vec<Record> = (0..n)
            .map(|i| record(i, format!("fact {i}"), vector(1536)))
            .collect();
        let query = vector(1536);
        g.bench_with_input(BenchmarkId::from_parameter(n), &records, |b, records| {
            b.iter(|| rank(records, &query, 5, 0.0).len())
        });
    }
    g.finish();
    // Hybrid: the same, and BM25 over the records' words (sentences of a
    // dozen words, as the verbatim strategy stores; 384 dimensions, as the
    // built-in embedder's).
    let words = [
        "went",
        "support",
        "group",
        "yesterday",
        "painting",
        "sunrise",
        "kids",
        "camping",
        "adoption",
        "agency",
        "counseling",
        "career",
        "violin",
        "pottery",
        "beach",
        "friends",
    ];
    let mut g = c.benchmark_group("long_term_rank_hybrid_384");
    for n in [100usize, 1000] {
        let records: Vec<Record> = (0..n)
            .map(|i| {
                let text: Vec<&str> = (0..12)
                    .map(|k| words[(i * 7 + k * 3) % words.len()])
                    .collect();
                record(i, text.join(" "), vector(384))
            })
            .collect();
        let query = vector(384);
        let text = "When did Caroline go to the support group with her friends?";
        g.bench_with_input(BenchmarkId::new("cosine", n), &records, |b, records| {
            b.iter(|| rank(records, &query, 100, 0.2).len())
        });
        g.bench_with_input(BenchmarkId::new("hybrid", n), &records, |b, records| {
            b.iter(|| hybrid::rank(records, &query, text, 100, 0.2).len())
        });
    }
    g.finish();
}

/// A non-streaming answer read for its record, as the relay does for
/// every completion.
fn bench_completion_reply(c: &mut Criterion) {
    use recall::proxy::accumulate::completion_reply;
    let body = serde_json::json!({"id": "c", "object": "chat.completion", "created": 1,
        "model": "mock", "choices": [{"index": 0, "finish_reason": "stop", "logprobs": null,
        "message": {"role": "assistant", "content": "Sure, here is the answer.",
                    "refusal": null, "annotations": []}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}})
    .to_string();
    c.bench_function("completion_reply", |b| {
        b.iter(|| completion_reply(body.as_bytes()).expect("reply"))
    });
    // For a Responses turn: where the parts lie too.
    c.bench_function("completion_read_parts", |b| {
        b.iter(|| recall::proxy::accumulate::completion_read(body.as_bytes(), true).expect("read"))
    });
}

/// A non-streaming Response: the chat completion read and the Response
/// written, as `api::responses` does for each non-streamed response.
fn bench_responses_answer(c: &mut Criterion) {
    use recall::api::responses::completion::Completion;
    use recall::api::responses::response::{of_completion, Echo};
    let body = serde_json::json!({"id": "c", "object": "chat.completion", "created": 1,
        "model": "mock", "choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": "Sure, here is the answer."}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16,
                  "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0}}})
    .to_string();
    let echo = Echo {
        id: "resp_Y2hhaW5fMTMzZDkzYmRhZTUzOTBmZmYwYjNmYjMz_1aba238cfdbc76ff".into(),
        items: "Y2hhaW5fMTMzZDkzYmRhZTUzOTBmZmYwYjNmYjMz_1".into(),
        conversation: Some("conv_bench".into()),
        store: true,
        ..Echo::default()
    };
    let written = |completion: &Completion| {
        let mut out = Vec::with_capacity(1024 + body.len());
        of_completion(completion, &echo)
            .write(&mut out)
            .expect("written");
        out
    };
    c.bench_function("responses_answer", |b| {
        b.iter(|| {
            let mut spare = Vec::new();
            written(&Completion::read(body.as_bytes(), &mut spare).expect("completion"))
        })
    });
    // As it is done since item 43: from the parts the relay's reading
    // found, which the relay did anyway.
    let parts = recall::proxy::accumulate::completion_read(body.as_bytes(), true)
        .expect("read")
        .parts;
    c.bench_function("responses_answer_of_parts", |b| {
        b.iter(|| {
            let mut spares = Default::default();
            written(
                &Completion::of_parts(body.as_bytes(), &parts, &mut spares).expect("completion"),
            )
        })
    });
}

/// A Responses request body as the chat request it runs as.
fn bench_responses_request(c: &mut Criterion) {
    use recall::api::responses::request::translate;
    let body = serde_json::json!({"model": "mock", "stream": false,
        "input": "Tell me about message 7, and what it said.", "conversation": "bench-7"})
    .to_string();
    // As the Agents SDK sends a conversation it keeps itself: every item
    // again, each turn.
    let items: Vec<serde_json::Value> = (0..40)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            serde_json::json!({"type": "message", "role": role,
                "content": format!("Message {i}, a sentence or two long.")})
        })
        .collect();
    let long = serde_json::json!({"model": "mock", "input": items, "store": false}).to_string();
    for (name, body) in [
        ("responses_request", &body),
        ("responses_request_40_items", &long),
    ] {
        c.bench_function(name, |b| {
            b.iter(|| {
                let serde_json::Value::Object(map) =
                    serde_json::from_str::<serde_json::Value>(body).expect("json")
                else {
                    unreachable!()
                };
                translate(map).expect("translated")
            })
        });
    }
}

/// A chat request body parsed and its messages checked, as every chat
/// turn is: one new message (a client that sends only what is new), and
/// a conversation of 20 sent again (one that resends it each turn).
fn bench_chat_request(c: &mut Criterion) {
    use recall::api::parse_request;
    let message = |i: usize| {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        json!({"role": role, "content": format!("Message {i}, a sentence or two long.")})
    };
    let one = json!({"model": "mock", "messages": [message(0)], "stream": false}).to_string();
    let twenty = json!({"model": "mock", "stream": false,
        "messages": (0..20).map(message).collect::<Vec<_>>()})
    .to_string();
    for (name, body) in [
        ("chat_request", &one),
        ("chat_request_20_messages", &twenty),
    ] {
        c.bench_function(name, |b| {
            b.iter(|| parse_request(body.as_bytes(), 1000).expect("parsed"))
        });
    }
}

criterion_group!(
    benches,
    bench_chat_request,
    bench_reconcile,
    bench_window,
    bench_window_tokens,
    bench_rewrite,
    bench_accumulate,
    bench_completion_reply,
    bench_responses_events,
    bench_responses_answer,
    bench_responses_request,
    bench_long_term_rank
);
criterion_main!(benches);
