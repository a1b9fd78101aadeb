//! The memory evaluation (README "Memory quality"): LoCoMo conversations
//! replayed through recall's chat API, then their questions asked in new
//! sessions of the same user, scoring what the upstream was sent.
//!
//!   cargo bench --bench memory -- [--data PATH] [--embedder DIR]
//!       [--only NAME[,NAME]] [--conversations N] [--questions N]
//!       [--out FILE] [--set 'KEY = VALUE']... [--dump N]
//!       [--answer-url URL --answer-model M [--judge-model M] [--answer-key-env VAR]]
//!
//! `--data`: a LoCoMo file (one conversation, or `locomo10.json`) or a
//! directory of them (default `../shared/locomo`, else tests/data/locomo).
//! `--embedder`: an all-MiniLM-L6-v2 folder for `local:` (default
//! `$RECALL_TEST_MINILM_DIR`, else `~/.cache/recall-ci/models/all-MiniLM-L6-v2`).
//! `--set` adds a line to `[long_term]` of the long-term configurations.
//! They search inline, as recall does by default, but wait for the search
//! however long it takes: the figures say what memory finds, not whether
//! a busy machine kept up with `inline_timeout_ms`, and stay the same
//! from run to run.
//!
//! Each configuration runs its own recall (memory storage): the user is
//! LoCoMo's `speaker_a` (`x-user-id`), `speaker_b`'s lines are a scripted
//! upstream's replies, each LoCoMo session is a recall session, ended
//! after its last turn (its extraction and note awaited). Each question of
//! categories 1-4 whose evidence the user said is then asked, alone, in a
//! new session. What recall sent upstream, less the question itself, is
//! the context scored (`score.rs`). The full conversation is scored the
//! same way, as a baseline, without recall.

mod locomo;
mod replay;
mod score;

use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use locomo::{Conversation, Question};
use recall::memory::tokens::Encoding;
use replay::Replay;
use score::Context;

const CATEGORIES: [(u8, &str); 4] = [
    (1, "single-hop"),
    (2, "temporal"),
    (3, "multi-hop"),
    (4, "open-domain"),
];

struct Args {
    data: PathBuf,
    embedder: PathBuf,
    only: Option<Vec<String>>,
    conversations: usize,
    questions: usize,
    out: PathBuf,
    set: Vec<String>,
    answer: Option<replay::Answerer>,
    /// Print what the first this many questions sent.
    dump: usize,
}

fn args() -> Result<Args, String> {
    let mut a = std::env::args().skip(1);
    let shared = PathBuf::from("../shared/locomo");
    let mut out = Args {
        data: if shared.is_dir() {
            shared
        } else {
            PathBuf::from("tests/data/locomo")
        },
        embedder: std::env::var_os("RECALL_TEST_MINILM_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let home = std::env::var_os("HOME").unwrap_or_default();
                Path::new(&home).join(".cache/recall-ci/models/all-MiniLM-L6-v2")
            }),
        only: None,
        conversations: usize::MAX,
        questions: usize::MAX,
        out: PathBuf::from("target/memory-eval.json"),
        set: Vec::new(),
        answer: None,
        dump: 0,
    };
    let (mut url, mut model, mut judge, mut key_env) = (None, None, None, None);
    while let Some(flag) = a.next() {
        let mut value = || a.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--data" => out.data = value()?.into(),
            "--embedder" => out.embedder = value()?.into(),
            "--only" => out.only = Some(value()?.split(',').map(str::to_owned).collect()),
            "--conversations" => {
                out.conversations = value()?.parse().map_err(|e| format!("{e}"))?
            }
            "--questions" => out.questions = value()?.parse().map_err(|e| format!("{e}"))?,
            "--out" => out.out = value()?.into(),
            "--dump" => out.dump = value()?.parse().map_err(|e| format!("{e}"))?,
            "--set" => out.set.push(value()?),
            "--answer-url" => url = Some(value()?),
            "--answer-model" => model = Some(value()?),
            "--judge-model" => judge = Some(value()?),
            "--answer-key-env" => key_env = Some(value()?),
            // cargo bench passes this to every bench binary.
            "--bench" => {}
            other => {
                return Err(format!(
                    "unknown argument {other:?} (see benches/memory/main.rs)"
                ))
            }
        }
    }
    if let (Some(url), Some(model)) = (url, model) {
        let key = key_env.and_then(|k| std::env::var(k).ok());
        out.answer = Some(replay::Answerer::new(url, model, judge, key));
    }
    Ok(out)
}

/// A configuration of recall, or the full conversation.
struct Setup {
    name: &'static str,
    /// Config sections; `None`: the full conversation, without recall.
    sections: Option<String>,
}

fn setups(a: &Args) -> Vec<Setup> {
    let memory = "[memory]\nsummarize = true\nsummary_model = \"summarizer\"\ncarry_over = true\n";
    let long_term = format!(
        "[long_term]\nenabled = true\nembedding_model = \"local:{}\"\n\
         inline_timeout_ms = 30000\n{}\n",
        a.embedder.display(),
        a.set.join("\n")
    );
    let all = vec![
        Setup {
            name: "window",
            sections: Some(String::new()),
        },
        Setup {
            name: "summaries + carry-over",
            sections: Some(memory.into()),
        },
        Setup {
            name: "long-term",
            sections: Some(long_term.clone()),
        },
        Setup {
            name: "all",
            sections: Some(format!("{memory}{long_term}")),
        },
        Setup {
            name: "full conversation",
            sections: None,
        },
    ];
    match &a.only {
        None => all,
        Some(names) => all
            .into_iter()
            .filter(|s| names.iter().any(|n| n == s.name))
            .collect(),
    }
}

/// One question's scores.
#[derive(Debug, Clone)]
struct Scored {
    conversation: String,
    category: u8,
    /// The share of its evidence lines in context.
    evidence: f64,
    answer_in_context: bool,
    tokens: usize,
    f1: Option<f64>,
    judged: Option<bool>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("memory eval: {e}");
            std::process::exit(2);
        }
    };
    let mut conversations = match locomo::load(&a.data) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("memory eval: {e}");
            std::process::exit(2);
        }
    };
    conversations.truncate(a.conversations);
    if conversations.is_empty() {
        eprintln!("memory eval: no conversation in {}", a.data.display());
        std::process::exit(2);
    }
    let setups = setups(&a);
    if setups
        .iter()
        .any(|s| s.sections.as_deref().is_some_and(|s| s.contains("local:")))
        && !a.embedder.join("tokenizer.json").is_file()
    {
        eprintln!(
            "memory eval: no all-MiniLM-L6-v2 in {} (--embedder, or RECALL_TEST_MINILM_DIR)",
            a.embedder.display()
        );
        std::process::exit(2);
    }
    let names: Vec<&str> = conversations.iter().map(|c| c.name.as_str()).collect();
    eprintln!(
        "memory eval: {} conversation(s) ({}) from {}",
        conversations.len(),
        names.join(", "),
        a.data.display()
    );
    let enc = Encoding::O200k;
    enc.load();
    let replay = Replay::start().await;
    let mut results: Vec<(&str, Vec<Scored>, Duration)> = Vec::new();
    for s in &setups {
        let started = Instant::now();
        let scored = match &s.sections {
            None => full_conversation(&conversations, &a, enc).await,
            Some(sections) => {
                let recall = Recall::start(replay.addr, sections).await;
                let mut scored = Vec::new();
                for c in &conversations {
                    scored.extend(run(&recall, &replay, c, s.name, &a, enc).await);
                }
                scored
            }
        };
        eprintln!(
            "[{}] done in {:.0} s",
            s.name,
            started.elapsed().as_secs_f64()
        );
        results.push((s.name, scored, started.elapsed()));
    }
    let table = table(&results, a.answer.is_some());
    println!("{table}");
    let json = report(&results, &names, &a);
    if let Some(dir) = a.out.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    match std::fs::write(
        &a.out,
        serde_json::to_string_pretty(&json).unwrap_or_default(),
    ) {
        Ok(()) => eprintln!("memory eval: results in {}", a.out.display()),
        Err(e) => eprintln!("memory eval: could not write {}: {e}", a.out.display()),
    }
}

/// Replays `c` through `recall`, then asks its questions.
async fn run(
    recall: &Recall,
    replay: &Replay,
    c: &Conversation,
    setup: &str,
    a: &Args,
    enc: Encoding,
) -> Vec<Scored> {
    let client = reqwest::Client::new();
    let user = format!("locomo-{}", c.name);
    let n = c.sessions.len();
    let tty = std::io::stderr().is_terminal();
    if !tty {
        eprintln!("[{setup}] {}: {n} sessions", c.name);
    }
    for (i, turns) in c.sessions.iter().enumerate() {
        if tty {
            eprint!("\r[{setup}] {}: session {}/{n}   ", c.name, i + 1);
        }
        let session = format!("{user}-s{}", i + 1);
        replay_session(recall, replay, &client, &user, &session, turns).await;
    }
    if tty {
        eprintln!();
    }
    let asked: Vec<&Question> = c.asked().into_iter().take(a.questions).collect();
    let mut out = Vec::with_capacity(asked.len());
    for (k, q) in asked.iter().enumerate() {
        if tty && k % 20 == 0 {
            eprint!(
                "\r[{setup}] {}: question {}/{}   ",
                c.name,
                k + 1,
                asked.len()
            );
        }
        let session = format!("{user}-q{k}");
        let body =
            json!({"model": "replay", "messages": [{"role": "user", "content": q.question}]});
        let sent = replay.capture(|| async {
            let r = client
                .post(format!("{}/v1/chat/completions", recall.base))
                .header("x-session-id", &session)
                .header("x-user-id", &user)
                .json(&body)
                .send()
                .await;
            check(r, "a question").await;
        });
        let sent = sent.await;
        let messages = sent["messages"].as_array().cloned().unwrap_or_default();
        if k < a.dump {
            let pretty = serde_json::to_string_pretty(&messages).unwrap_or_default();
            eprintln!(
                "\n[{setup}] {} (evidence {:?}):\n{pretty}",
                q.question, q.evidence
            );
        }
        out.push(score(c, q, &messages, a, enc).await);
    }
    if tty {
        eprintln!();
    } else {
        eprintln!("[{setup}] {}: {} questions asked", c.name, asked.len());
    }
    out
}

/// One LoCoMo session: each user line a chat turn whose reply is the
/// other speaker's next line; lines of the other speaker before the
/// user's first go with it, as the conversation so far; a user line
/// without a reply after it is appended through the session API.
async fn replay_session(
    recall: &Recall,
    replay: &Replay,
    client: &reqwest::Client,
    user: &str,
    session: &str,
    turns: &[locomo::Turn],
) {
    let msg = |t: &locomo::Turn| json!({"role": if t.user { "user" } else { "assistant" }, "content": t.text, "timestamp": t.at_ms});
    let mut pending: Vec<Value> = Vec::new();
    let mut started = false;
    let mut i = 0;
    while i < turns.len() {
        let t = &turns[i];
        if !t.user {
            pending.push(msg(t));
            i += 1;
            continue;
        }
        pending.push(msg(t));
        let reply: Vec<&str> = turns[i + 1..]
            .iter()
            .take_while(|r| !r.user)
            .map(|r| r.text.as_str())
            .collect();
        let after = i + 1 + reply.len();
        if reply.is_empty() && started {
            let r = client
                .post(format!("{}/v1/sessions/{session}/messages", recall.base))
                .header("x-user-id", user)
                .json(&json!({"messages": pending}))
                .send()
                .await;
            check(r, "appending a message").await;
        } else {
            let reply = if reply.is_empty() {
                "..."
            } else {
                &reply.join("\n")
            };
            replay.reply_next(reply);
            let r = client
                .post(format!("{}/v1/chat/completions", recall.base))
                .header("x-session-id", session)
                .header("x-user-id", user)
                .json(&json!({"model": "replay", "messages": pending}))
                .send()
                .await;
            check(r, "a turn").await;
            started = true;
        }
        pending.clear();
        i = after;
    }
    if recall.long_term {
        let r = client
            .post(format!(
                "{}/v1/sessions/{session}/memory/extract",
                recall.base
            ))
            .send()
            .await;
        check(r, "an extraction").await;
    }
    let notes = recall.note_jobs().await;
    let r = client
        .post(format!("{}/v1/sessions/{session}/end", recall.base))
        .send()
        .await;
    check(r, "ending a session").await;
    if recall.notes {
        recall.await_note_job(notes).await;
    }
}

async fn check(r: Result<reqwest::Response, reqwest::Error>, what: &str) {
    match r {
        Ok(r) if r.status().is_success() => {}
        Ok(r) => {
            let status = r.status();
            let body = r.text().await.unwrap_or_default();
            panic!("{what} failed: {status} {body}");
        }
        Err(e) => panic!("{what} failed: {e}"),
    }
}

/// The text of a message as sent.
fn content(m: &Value) -> String {
    match &m["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Tokens of a call's messages: their text, and OpenAI's framing of 4 a
/// message.
fn tokens(messages: &[Value], enc: Encoding) -> usize {
    messages.iter().map(|m| 4 + enc.count(&content(m))).sum()
}

async fn score(
    c: &Conversation,
    q: &Question,
    messages: &[Value],
    a: &Args,
    enc: Encoding,
) -> Scored {
    // The question is the last message: it is not memory.
    let memory = &messages[..messages.len().saturating_sub(1)];
    let text: Vec<String> = memory.iter().map(content).collect();
    let context = Context::new(&text.join("\n"));
    let lines: Vec<&str> = q
        .evidence
        .iter()
        .filter_map(|e| c.turn(e))
        .map(|t| t.line.as_str())
        .collect();
    let held = lines.iter().filter(|l| context.holds_evidence(l)).count();
    let (f1, judged) = match &a.answer {
        Some(answerer) => {
            let (answer, judged) = answerer.answer(messages, q).await;
            (Some(score::f1(&answer, &q.answer)), judged)
        }
        None => (None, None),
    };
    Scored {
        conversation: c.name.clone(),
        category: q.category,
        evidence: if lines.is_empty() {
            0.0
        } else {
            held as f64 / lines.len() as f64
        },
        answer_in_context: context.holds_answer(&q.answer),
        tokens: tokens(messages, enc),
        f1,
        judged,
    }
}

/// The baseline: every turn of the conversation, then the question.
async fn full_conversation(cs: &[Conversation], a: &Args, enc: Encoding) -> Vec<Scored> {
    let mut out = Vec::new();
    for c in cs {
        let mut messages: Vec<Value> = Vec::new();
        for (i, turns) in c.sessions.iter().enumerate() {
            messages.push(json!({"role": "system", "content": format!("Session {}", i + 1)}));
            for t in turns {
                let role = if t.user { "user" } else { "assistant" };
                messages.push(json!({"role": role, "content": t.text}));
            }
        }
        for q in c.asked().into_iter().take(a.questions) {
            let mut m = messages.clone();
            m.push(json!({"role": "user", "content": q.question}));
            out.push(score(c, q, &m, a, enc).await);
        }
    }
    out
}

// ------------------------------------------------------------ recall

struct Recall {
    base: String,
    long_term: bool,
    notes: bool,
    child: Child,
    dir: PathBuf,
}

impl Recall {
    async fn start(replay: std::net::SocketAddr, sections: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        let dir = std::env::temp_dir().join(format!("recall-memory-eval-{port}"));
        std::fs::create_dir_all(&dir).expect("a work directory");
        let config = format!(
            "[server]\nlisten = \"127.0.0.1:{port}\"\nmax_body_bytes = 67108864\n\
             [session]\nttl_secs = 0\n\
             [storage]\nbackend = \"memory\"\n[log]\nlevel = \"warn\"\n\
             [[upstreams]]\nname = \"replay\"\nbase_url = \"http://{replay}/v1\"\nmodels = [\"replay\"]\n\
             [[upstreams]]\nname = \"mock\"\nbase_url = \"mock://echo\"\nmodels = [\"summarizer\"]\n\
             {sections}\n"
        );
        let path = dir.join("recall.toml");
        std::fs::write(&path, config).expect("the config");
        let program = std::env::var("RECALL_BENCH_BIN")
            .unwrap_or_else(|_| env!("CARGO_BIN_EXE_recall").into());
        let child = Command::new(program)
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::null())
            .spawn()
            .expect("start recall");
        let base = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        for _ in 0..600 {
            if let Ok(r) = client.get(format!("{base}/readyz")).send().await {
                if r.status().is_success() {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self {
            base,
            long_term: sections.contains("[long_term]"),
            notes: sections.contains("carry_over = true"),
            child,
            dir,
        }
    }

    /// Note jobs ended so far, of any outcome.
    async fn note_jobs(&self) -> u64 {
        let Ok(r) = reqwest::get(format!("{}/metrics", self.base)).await else {
            return 0;
        };
        let text = r.text().await.unwrap_or_default();
        text.lines()
            .filter(|l| l.starts_with("recall_summary_jobs_total{") && l.contains("job=\"note\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Waits (a while) for a note job after the `before`th.
    async fn await_note_job(&self, before: u64) {
        for _ in 0..300 {
            if self.note_jobs().await > before {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        eprintln!("\nmemory eval: an ended session's note was not written within 6 s");
    }
}

impl Drop for Recall {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

// ------------------------------------------------------------ report

struct Figures {
    questions: usize,
    evidence: f64,
    answer: f64,
    tokens: f64,
    f1: Option<f64>,
    judged: Option<f64>,
}

fn figures<'a>(scored: impl Iterator<Item = &'a Scored>) -> Figures {
    let s: Vec<&Scored> = scored.collect();
    let n = s.len().max(1) as f64;
    let mean = |f: &dyn Fn(&Scored) -> f64| s.iter().map(|x| f(x)).sum::<f64>() / n;
    let f1s: Vec<f64> = s.iter().filter_map(|x| x.f1).collect();
    let judged: Vec<bool> = s.iter().filter_map(|x| x.judged).collect();
    Figures {
        questions: s.len(),
        evidence: mean(&|x| x.evidence),
        answer: mean(&|x| f64::from(u8::from(x.answer_in_context))),
        tokens: mean(&|x| x.tokens as f64),
        f1: (!f1s.is_empty()).then(|| f1s.iter().sum::<f64>() / f1s.len() as f64),
        judged: (!judged.is_empty())
            .then(|| judged.iter().filter(|&&j| j).count() as f64 / judged.len() as f64),
    }
}

fn full_tokens(results: &[(&str, Vec<Scored>, Duration)]) -> Option<f64> {
    results
        .iter()
        .find(|(n, ..)| *n == "full conversation")
        .map(|(_, s, _)| figures(s.iter()).tokens)
}

fn table(results: &[(&str, Vec<Scored>, Duration)], answered: bool) -> String {
    let full = full_tokens(results);
    let mut head = vec!["configuration", "evidence in context"];
    head.extend(CATEGORIES.iter().map(|(_, n)| *n));
    head.extend(["answer in context", "tokens per call", "share of full"]);
    if answered {
        head.extend(["F1", "judged"]);
    }
    let mut out = format!(
        "| {} |\n|{}\n",
        head.join(" | "),
        " --- |".repeat(head.len())
    );
    for (name, scored, _) in results {
        let all = figures(scored.iter());
        let mut row = vec![name.to_string(), format!("{:.3}", all.evidence)];
        for (cat, _) in CATEGORIES {
            let f = figures(scored.iter().filter(|s| s.category == cat));
            row.push(if f.questions == 0 {
                "-".into()
            } else {
                format!("{:.3} ({})", f.evidence, f.questions)
            });
        }
        row.push(format!("{:.3}", all.answer));
        row.push(format!("{:.0}", all.tokens));
        row.push(full.map_or("-".into(), |t| format!("{:.1} %", 100.0 * all.tokens / t)));
        if answered {
            row.push(all.f1.map_or("-".into(), |f| format!("{f:.3}")));
            row.push(all.judged.map_or("-".into(), |f| format!("{f:.3}")));
        }
        out.push_str(&format!("| {} |\n", row.join(" | ")));
    }
    out
}

fn report(results: &[(&str, Vec<Scored>, Duration)], names: &[&str], a: &Args) -> Value {
    let full = full_tokens(results);
    let configurations: Vec<Value> = results
        .iter()
        .map(|(name, scored, took)| {
            let all = figures(scored.iter());
            let mut by_category = BTreeMap::new();
            for (cat, cname) in CATEGORIES {
                let f = figures(scored.iter().filter(|s| s.category == cat));
                by_category.insert(
                    cname,
                    json!({"questions": f.questions, "evidence_in_context": f.evidence,
                           "answer_in_context": f.answer, "tokens_per_call": f.tokens,
                           "f1": f.f1, "judged": f.judged}),
                );
            }
            let per_conversation: BTreeMap<&str, f64> = names
                .iter()
                .map(|n| {
                    (
                        *n,
                        figures(scored.iter().filter(|s| s.conversation == *n)).evidence,
                    )
                })
                .collect();
            json!({
                "name": name, "questions": all.questions,
                "evidence_in_context": all.evidence, "answer_in_context": all.answer,
                "tokens_per_call": all.tokens,
                "share_of_full": full.map(|t| all.tokens / t),
                "f1": all.f1, "judged": all.judged,
                "categories": by_category, "conversations": per_conversation,
                "seconds": took.as_secs_f64(),
            })
        })
        .collect();
    json!({
        "data": a.data.display().to_string(), "conversations": names,
        "long_term_set": a.set, "evidence_share": score::EVIDENCE_SHARE,
        "configurations": configurations,
    })
}
