//! The load benchmark: `cargo bench --bench load` (see BENCHMARKS.md).
//!
//! One run on one machine drives an instant mock upstream directly, through
//! a plain nginx `proxy_pass` hop (if nginx is installed), through the naive
//! hop (benches/naive_hop.rs: axum and reqwest like recall, parsing the
//! request and adding one system message, nothing else; recall's figures
//! are also given as ratios to its), through the same hop with a client
//! that resends the conversation (20 prior messages a request, about the
//! window recall sends upstream from its store, as a client without
//! memory in the proxy must), through recall with the memory and the
//! sqlite backend, through recall (memory) sending upstream what the hop
//! sends (its system message and a window of one: recall's own machinery
//! against the hop's, without the window's bytes), through recall (memory)
//! with a client that resends its conversation as the resending hop's
//! does (highest-rate table), and through LiteLLM's proxy (if `litellm` is
//! installed).
//! Load is open-loop at a fixed rate; latency is measured from each
//! request's intended send time, so queueing shows. Every scenario also
//! gives recall's and the hop's CPU time per request (from `/proc`), which
//! unlike a rate or a latency does not depend on how the 2 cores are
//! shared with the generator and the mock; the streaming headline
//! scenario's added TTFB and chunk gaps are also given as ratios to the
//! hop's.
//! Options: `--quick` (shorter runs, one round), `--only NAME` (scenario filter),
//! `--repeat N` (rounds of the headline scenarios, median reported; 3 by
//! default), `--rate N` (requests a second of the open-loop scenarios;
//! 2,000 by default), `--pin` (generator and mock on CPU 0, the path under
//! test on CPU 1), `--no-cluster` (the Redis rows without the cluster's,
//! for an A/B against a build that predates their `[storage]` keys).
//! `--only million` runs the one scenario a full run leaves
//! out: a million sessions held (minutes of seeding, gigabytes of RSS).

use std::collections::{BTreeMap, HashMap};
use std::io::Write as _;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::response::Response;
use futures_util::StreamExt;
use recall::memory::long_term::headings::EXTRACT_HEADING;
use recall::proxy::mock::embed;

#[path = "load_redis.rs"]
mod redis_servers;
use serde_json::{json, Value};

const CHUNKS: usize = 50;
/// Prior messages sent by the client of the naive hop that resends the
/// conversation (`resending`): recall's `window_messages` here, so that
/// the hop forwards about what recall sends upstream from its store.
const RESENT: usize = 20;
/// The mock's whole answer to a non-streaming chat request.
const MOCK_ANSWER: &str = "Sure, here is the answer.";

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1).cloned());
    let repeat = args
        .iter()
        .position(|a| a == "--repeat")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(if quick { 1 } else { 3 })
        .max(1);
    let rate = args
        .iter()
        .position(|a| a == "--rate")
        .and_then(|i| args.get(i + 1)?.parse::<f64>().ok())
        .filter(|r| *r > 0.0)
        .unwrap_or(2000.0);
    if args.iter().any(|a| a == "--pin") {
        pin();
    }
    let mock = start_mock();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(mock, quick, only, repeat, rate));
    let failures = FAILURES.lock().map(|f| f.clone()).unwrap_or_default();
    if !failures.is_empty() {
        println!("\nFailed requests, by kind:");
        for line in failures {
            println!("- {line}");
        }
    }
    let notes = NOTES.lock().map(|n| n.clone()).unwrap_or_default();
    if !notes.is_empty() {
        println!("\nNotes:");
        for line in notes {
            println!("- {line}");
        }
    }
    // The sqlite files of a full run take gigabytes.
    let _ = std::fs::remove_dir_all(work_dir());
}

/// With `--pin`: the load generator and the mock share CPU 0, and each path
/// under test gets CPU 1 to itself (see `under_test`). That isolates the
/// paths from the generator, but leaves each proxy one core: on this
/// 2-core machine recall then cannot relay 2,000 streams of 50 chunks a
/// second (100,000 chunks/s on one core), so the default leaves the
/// scheduler free and repeats runs instead. Skipped with fewer than 2 CPUs.
static PINNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn pin() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 || which("taskset").is_none()
    {
        eprintln!("not pinning: needs 2 CPUs and taskset");
        return;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes
    // within it; sched_setaffinity only reads it. Threads started later
    // (the mock's, tokio's) inherit the mask.
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    };
    if ok {
        PINNED.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// A process under test: on CPU 1 when the run is pinned.
fn under_test(program: &str) -> Command {
    if PINNED.load(std::sync::atomic::Ordering::Relaxed) {
        let mut c = Command::new("taskset");
        c.args(["-c", "1", program]);
        c
    } else {
        Command::new(program)
    }
}

// ---------------------------------------------------------------- the mock

/// An instant OpenAI-style upstream on a thread and runtime of its own.
fn start_mock() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("mock runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send");
            let app = axum::Router::new().fallback(mock_reply);
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(listener, app).await.expect("mock serve");
        });
    });
    rx.recv().expect("mock address")
}

/// What the mock was sent: chat calls and their bytes, and calls of the
/// summary model (`SUMMARY_MODEL`), for the long-session scenario.
static CHAT_CALLS: AtomicU64 = AtomicU64::new(0);
static CHAT_BYTES: AtomicU64 = AtomicU64::new(0);
static SUMMARY_CALLS: AtomicU64 = AtomicU64::new(0);
const SUMMARY_MODEL: &str = "bench-summarizer";
/// Calls of `/v1/embeddings` and extraction requests, for the long-term
/// memory scenario (not counted as chat calls).
static EMBED_CALLS: AtomicU64 = AtomicU64::new(0);
static EXTRACT_CALLS: AtomicU64 = AtomicU64::new(0);

async fn mock_reply(uri: axum::http::Uri, body: Bytes) -> Response {
    if uri.path().ends_with("/embeddings") {
        return mock_embeddings(&body);
    }
    if memchr_contains(&body, EXTRACT_HEADING.as_bytes()) {
        return mock_extraction(&body);
    }
    if memchr_contains(&body, SUMMARY_MODEL.as_bytes()) {
        SUMMARY_CALLS.fetch_add(1, Ordering::Relaxed);
    } else {
        CHAT_CALLS.fetch_add(1, Ordering::Relaxed);
        CHAT_BYTES.fetch_add(body.len() as u64, Ordering::Relaxed);
    }
    let stream =
        memchr_contains(&body, br#""stream":true"#) || memchr_contains(&body, br#""stream": true"#);
    if !stream {
        let reply = json!({"id": "c", "object": "chat.completion", "created": 1, "model": "mock",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": MOCK_ANSWER}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}});
        return Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(reply.to_string()))
            .expect("response");
    }
    let chunks = (0..CHUNKS).map(|i| {
        let c = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "mock",
            "choices": [{"index": 0, "delta": {"content": format!("tok{i} ")}, "finish_reason": null}]});
        Ok::<_, std::io::Error>(Bytes::from(format!("data: {c}\n\n")))
    });
    let end = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "mock",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]});
    let tail = Bytes::from(format!("data: {end}\n\ndata: [DONE]\n\n"));
    let all = futures_util::stream::iter(chunks.chain(std::iter::once(Ok(tail))));
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from_stream(all))
        .expect("response")
}

/// How many SSE events a read ends (each ends with a blank line), given
/// the byte before it.
fn events_ended(before: Option<u8>, read: &[u8]) -> usize {
    let straddles = before == Some(b'\n') && read.first() == Some(&b'\n');
    usize::from(straddles) + read.windows(2).filter(|w| w == b"\n\n").count()
}

fn memchr_contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

// ------------------------------------------------------------- the targets

struct Target {
    name: String,
    /// Base URL up to and including `/v1`.
    base: String,
    /// Whether it keeps memory (sessions are seeded and named).
    recall: bool,
    /// Prior messages each chat request carries before its new user
    /// message (`request_body`): 0 but for the naive hop's "client
    /// resends" path (`resending`). recall is sent only the new message
    /// and adds the stored window itself; a pass-through keeps nothing,
    /// so a client of one sends the conversation every time. For recall,
    /// a client that resends its conversation all the same, as most do
    /// (`resending`; highest-rate table only), which recall
    /// reconciles with what it stored. In the highest-rate table both
    /// resending clients send the conversation they hold (`Held`).
    resend: usize,
    /// The process whose CPU time is this path's own (`cpu_ns`):
    /// recall's and the naive hop's, a resending client's path sharing
    /// its plain path's. None for direct, and for nginx and LiteLLM, whose
    /// work is done by worker processes that the one started forks.
    cpu_pid: Option<u32>,
    /// The process started for this path, stopped on drop (None for
    /// direct, and for the resending clients' paths, whose process their
    /// plain path owns).
    child: Option<Child>,
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            // SIGTERM lets nginx stop its workers and LiteLLM its children;
            // SIGKILL would orphan them.
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            for _ in 0..50 {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

fn work_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("recall-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("work dir");
    dir
}

async fn wait_ready(url: &str) {
    let client = reqwest::Client::new();
    for _ in 0..600 {
        if client.get(url).send().await.is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{url} did not come up");
}

/// recall's `worker_threads` (0 = one per CPU), and the naive hop's beside
/// it: RECALL_BENCH_THREADS sets it for every scenario but the highest-rate
/// one, which runs 1 besides anyway.
fn bench_threads() -> usize {
    std::env::var("RECALL_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A number from the environment, or `default`: the model-call rates of
/// the long-session and long-term scenarios, to measure what a call costs
/// (RECALL_BENCH_SUMMARY_EVERY, RECALL_BENCH_EXTRACT_EVERY).
fn env_number(name: &str, default: usize) -> usize {
    let v = match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => return default,
        Ok(v) => v,
        Err(e) => panic!("{name}: {e}"),
    };
    // A typo would otherwise measure the default rate under the name of
    // another, and 0 makes recall refuse its config mid-run.
    match v.parse() {
        Ok(n) if n > 0 => n,
        _ => panic!("{name}={v:?}: must be a whole number of at least 1"),
    }
}

async fn start_recall(mock: SocketAddr, backend: &str, max_messages: usize) -> Target {
    start_recall_with(mock, backend, max_messages, bench_threads()).await
}

/// `workers`: `[server] worker_threads` (0 = one per CPU).
async fn start_recall_with(
    mock: SocketAddr,
    backend: &str,
    max_messages: usize,
    workers: usize,
) -> Target {
    let history = format!("[history]\nwindow_messages = 20\nmax_messages = {max_messages}\n");
    launch(mock, backend, workers, &history).await
}

/// The naive hop's system message (`benches/naive_hop.rs`).
const HOP_SYSTEM: &str = "You are a helpful assistant.";

/// recall (memory) configured to send upstream what the naive hop sends:
/// the hop's system message and the new message (a window of one). It
/// still keeps, reconciles, stores and records every turn; only the
/// conversation it sends is the hop's. Its rows split recall's cost
/// against the hop into its own machinery and the window it sends.
async fn start_recall_as_hop(mock: SocketAddr) -> Target {
    let sections = format!(
        "[history]\nwindow_messages = 1\nmax_messages = 20000\n\
         [[system_messages]]\ncontent = \"{HOP_SYSTEM}\"\n"
    );
    let mut target = launch(mock, "memory", bench_threads(), &sections).await;
    target.name = format!(
        "{}, sending what the hop sends)",
        target.name.trim_end_matches(')')
    );
    target
}

/// recall with `sections` (`[history]` at least, any others) and the rest
/// of the benchmark's config.
async fn launch(mock: SocketAddr, backend: &str, workers: usize, sections: &str) -> Target {
    let db = work_dir().join(format!("bench-{}.db", free_port()));
    let storage = format!("backend = \"{backend}\"\npath = \"{}\"\n", db.display());
    launch_on(mock, backend, &storage, workers, sections).await
}

/// The same on the `[storage]` section `storage`, its row named `label`.
async fn launch_on(
    mock: SocketAddr,
    label: &str,
    storage: &str,
    workers: usize,
    sections: &str,
) -> Target {
    let port = free_port();
    let dir = work_dir();
    let backend = label;
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:{port}\"\nmax_body_bytes = 67108864\n\
         worker_threads = {workers}\n\
         {sections}\n\
         [session]\nttl_secs = 0\nmax_sessions = 1000000\n\
         [storage]\n{storage}[log]\nlevel = \"warn\"\n\
         [[upstreams]]\nname = \"mock\"\nbase_url = \"http://{mock}/v1\"\n"
    );
    let path = dir.join(format!("recall-{port}.toml"));
    std::fs::write(&path, config).expect("config");
    // RECALL_BENCH_BIN runs another build (say, the last commit's) in the
    // same harness, for an A/B comparison on the same machine and day.
    let program =
        std::env::var("RECALL_BENCH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_recall").into());
    let child = under_test(&program)
        .arg("--config")
        .arg(&path)
        .stdout(Stdio::null())
        .spawn()
        .expect("start recall");
    let base = format!("http://127.0.0.1:{port}/v1");
    wait_ready(&format!("http://127.0.0.1:{port}/healthz")).await;
    let threads = if workers == 0 {
        String::new()
    } else {
        format!(
            ", {workers} worker thread{}",
            if workers == 1 { "" } else { "s" }
        )
    };
    Target {
        name: format!("recall ({backend}{threads})"),
        base,
        recall: true,
        resend: 0,
        // `taskset` (with `--pin`) execs the program: the pid is its.
        cpu_pid: Some(child.id()),
        child: Some(child),
    }
}

/// The scale goal: the cost of a turn with 1,000,000 sessions held
/// against 1,000, in one process (memory backend), alternating rounds;
/// and the RSS per session. Each session holds 2 messages of 200
/// characters, so that a million fit this machine.
async fn million_sessions(mock: SocketAddr, rate: f64, secs: f64, repeat: usize) {
    const MILLION: usize = 1_000_000;
    let target = start_recall(mock, "memory", 20_000).await;
    let (before, _) = rss_kib(&target.child).unwrap_or((0, 0));
    let seeding = Instant::now();
    seed(&target, MILLION, 2).await;
    let seeded_in = seeding.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss, hwm) = rss_kib(&target.child).unwrap_or((0, 0));
    let text_bytes = (MILLION * 2 * 200) as f64;
    println!();
    println!("| a million sessions (memory) | figure |");
    println!("|---|---|");
    println!("| seeded 1,000,000 sessions × 2 messages in | {seeded_in:.0} s |");
    println!("| RSS before seeding | {before} KiB |");
    println!("| RSS with them | {rss} KiB (peak {hwm}) |");
    println!(
        "| RSS per session beyond its text | {:.0} bytes |",
        ((rss.saturating_sub(before)) as f64 * 1024.0 - text_bytes) / MILLION as f64
    );
    let scenario = |sessions: usize| Scenario {
        responses: false,
        name: format!("non-stream · {sessions} sessions held · 2 stored"),
        stream: false,
        sessions,
        history: 2,
        rate,
        secs,
    };
    let (few, many) = (scenario(1_000), scenario(MILLION));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for _ in 0..repeat {
        for (s, runs) in [(&few, &mut a), (&many, &mut b)] {
            warm_up(&target, s).await;
            let mut st = open_loop(&target, s).await;
            runs.push(figures(&target.name, &s.name, &mut st));
        }
    }
    let (a, b) = (median(&a), median(&b));
    println!();
    println!("| sessions taken in turn | req/s | errors | p50 ms | p99 ms |");
    println!("|---|---|---|---|---|");
    for (s, f) in [(&few, &a), (&many, &b)] {
        println!(
            "| {} | {:.0} | {} | {:.3} | {:.3} |",
            s.sessions, f.rate, f.errors, f.p50, f.p99
        );
    }
    println!(
        "| 1,000,000 ÷ 1,000 | | | {:.2} | {:.2} |",
        b.p50 / a.p50,
        b.p99 / a.p99
    );
}

/// The naive hop's executable. It is an example of this package
/// (benches/naive_hop.rs), and `cargo bench --bench load` builds no
/// examples, so it is built here, once per run, by the cargo running this
/// benchmark (`CARGO`) with the profile this benchmark was built with (the
/// bench profile; the test profile under `cargo test --bench load`, as
/// CI's smoke run does): the dependencies are the ones just built for the
/// benchmark, so a fresh build only compiles and links the hop, and an
/// unchanged one is a no-op. Its path is what cargo reports, wherever the
/// target directory is.
///
/// Without the variables cargo sets for the benchmark it runs
/// (`CARGO_MANIFEST_DIR`, `CARGO_PKG_*`): some build scripts (ring's) rerun
/// when one of them changes, so that with them the build here and the next
/// `cargo bench` would each rebuild ring and everything above it in turn
/// (minutes each).
fn naive_hop_exe() -> &'static str {
    static EXE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(&cargo);
        for (name, _) in std::env::vars_os() {
            let set_by_cargo = name.to_str().is_some_and(|n| {
                n.starts_with("CARGO_PKG_")
                    || n.starts_with("CARGO_MANIFEST_")
                    || [
                        "CARGO_CRATE_NAME",
                        "CARGO_BIN_NAME",
                        "CARGO_PRIMARY_PACKAGE",
                        "OUT_DIR",
                    ]
                    .contains(&n)
            });
            if set_by_cargo {
                build.env_remove(name);
            }
        }
        // This benchmark's own profile, by the folder cargo built it in
        // (`target/debug/deps/load-...` for the test profile).
        let exe = std::env::current_exe().unwrap_or_default();
        let debug = exe.components().any(|c| c.as_os_str() == "debug");
        let profile = if debug { "dev" } else { "bench" };
        let out = build
            .args(["build", "--locked", "--quiet", "--profile", profile])
            .args(["--example", "naive_hop", "--message-format", "json"])
            .arg("--manifest-path")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {cargo} to build the naive hop: {e}"));
        assert!(
            out.status.success(),
            "`cargo build --profile {profile} --example naive_hop` failed"
        );
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "naive_hop")
            .find_map(|m| m["executable"].as_str().map(str::to_owned))
            .expect("cargo named no naive_hop executable")
    })
}

/// The naive hop on `workers` tokio worker threads (0 = one per CPU), the
/// count recall runs with in the same scenario.
async fn start_hop(mock: SocketAddr, workers: usize) -> Target {
    let port = free_port();
    let child = under_test(naive_hop_exe())
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--upstream")
        .arg(format!("http://{mock}/v1"))
        .arg("--threads")
        .arg(workers.to_string())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the naive hop");
    // Any answer will do (it has no route but chat's: a 404).
    wait_ready(&format!("http://127.0.0.1:{port}/")).await;
    let threads = match workers {
        0 => String::new(),
        1 => ", 1 worker thread".into(),
        n => format!(", {n} worker threads"),
    };
    Target {
        name: format!("naive hop (axum + reqwest{threads})"),
        base: format!("http://127.0.0.1:{port}/v1"),
        recall: false,
        resend: 0,
        cpu_pid: Some(child.id()),
        child: Some(child),
    }
}

/// `hop` (a naive hop) as the path of a client that resends the
/// conversation: each request carries `messages` prior messages of 200
/// characters, alternating user and assistant, before its new user
/// message (in the highest-rate table, the last `messages` it sent and
/// was answered: `Held`). recall, sent only the new message, sends
/// upstream a window of up to 20 stored messages; the hop, with no
/// memory, forwards what it is sent, so this is the pass-through doing the
/// same job, and recall is compared with both. The same process as `hop`
/// (its CPU time is read between the two paths' runs, which never
/// overlap); not stopped on drop, `hop` owns it.
///
/// Given recall (`memory`), the path of a client that resends its
/// conversation all the same, as a client written for a pass-through
/// does (highest-rate table only): recall reconciles what it is sent with
/// what it stored and sends upstream its window, what the resending hop
/// forwards from the same client; on sessions of its own.
fn resending(hop: &Target, messages: usize) -> Target {
    let name = hop.name.strip_suffix(')').unwrap_or(&hop.name);
    let its_last = if hop.recall { "its last " } else { "" };
    Target {
        name: format!("{name}, client resends {its_last}{messages} messages)"),
        base: hop.base.clone(),
        recall: hop.recall,
        resend: messages,
        cpu_pid: hop.cpu_pid,
        child: None,
    }
}

async fn start_nginx(mock: SocketAddr) -> Option<Target> {
    let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())?;
    let port = free_port();
    let dir = work_dir().join(format!("nginx-{port}"));
    std::fs::create_dir_all(&dir).ok()?;
    let conf = format!(
        "worker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
         events {{ worker_connections 4096; }}\n\
         http {{ access_log off; client_body_temp_path {d}; proxy_temp_path {d};\n\
           upstream mock {{ server {mock}; keepalive 64; }}\n\
           server {{ listen 127.0.0.1:{port};\n\
             location / {{ proxy_pass http://mock; proxy_http_version 1.1;\n\
               proxy_set_header Connection \"\"; proxy_buffering off; }} }} }}\n",
        d = dir.display()
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf).ok()?;
    let child = under_test(nginx)
        .arg("-c")
        .arg(&path)
        .arg("-p")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let base = format!("http://127.0.0.1:{port}/v1");
    wait_ready(&format!("http://127.0.0.1:{port}/")).await;
    Some(Target {
        name: "nginx proxy_pass".into(),
        base,
        recall: false,
        resend: 0,
        // The master's CPU time is not the workers'.
        cpu_pid: None,
        child: Some(child),
    })
}

async fn start_litellm(mock: SocketAddr) -> Option<Target> {
    let litellm = which("litellm")?;
    let port = free_port();
    let dir = work_dir();
    let conf = format!(
        "model_list:\n  - model_name: mock\n    litellm_params:\n      model: openai/mock\n\
         \x20     api_base: http://{mock}/v1\n      api_key: sk-mock\n\
         general_settings:\n  master_key: sk-bench\n"
    );
    let path = dir.join("litellm.yaml");
    std::fs::write(&path, conf).ok()?;
    let child = under_test(&litellm)
        .args([
            "--config",
            path.to_str()?,
            "--port",
            &port.to_string(),
            "--num_workers",
            "2",
        ])
        .env("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        .env("LITELLM_LOG", "ERROR")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let base = format!("http://127.0.0.1:{port}/v1");
    wait_ready(&format!("http://127.0.0.1:{port}/health/liveliness")).await;
    Some(Target {
        name: "LiteLLM proxy (2 workers)".into(),
        base,
        recall: false,
        resend: 0,
        // Its workers are processes of their own.
        cpu_pid: None,
        child: Some(child),
    })
}

fn which(name: &str) -> Option<String> {
    let out = Command::new("which").arg(name).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

// ------------------------------------------------------------- the load

#[derive(Clone)]
struct Scenario {
    name: String,
    /// Through `POST /v1/responses` (the session as its conversation)
    /// rather than chat.
    responses: bool,
    stream: bool,
    sessions: usize,
    history: usize,
    rate: f64,
    secs: f64,
}

#[derive(Default)]
struct Stats {
    sent: usize,
    errors: usize,
    /// What failed, by kind ("HTTP 503", "connection: ..."), for the report.
    failures: BTreeMap<String, usize>,
    elapsed: f64,
    latency: Vec<f64>,
    ttfb: Vec<f64>,
    gaps: Vec<f64>,
    /// The path's CPU µs per request sent over the run (`Cpu`).
    cpu_us: Option<f64>,
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v[i.min(v.len() - 1)]
}

fn message(role: &str, i: usize) -> Value {
    let text: String = format!("message {i} ").chars().cycle().take(200).collect();
    json!({"role": role, "content": text})
}

/// The conversation a client that resends it holds for one session: the
/// JSON of its last `keep` messages, user and assistant, as it sent them
/// and was answered. It starts as the 20 prior messages of
/// `prior_messages`, which the session's first request carries (recall
/// stores them as the session's start).
struct Held {
    messages: std::collections::VecDeque<Arc<str>>,
    keep: usize,
}

impl Held {
    fn new(keep: usize) -> Self {
        let messages = (0..keep)
            .map(|k| {
                let role = if k % 2 == 0 { "user" } else { "assistant" };
                Arc::from(message(role, k).to_string())
            })
            .collect();
        Self { messages, keep }
    }

    /// A request: what it holds, then `new` (a user message's JSON).
    fn body(&self, new: &str) -> String {
        let held: usize = self.messages.iter().map(|m| m.len() + 1).sum();
        let mut body = String::with_capacity(held + new.len() + 64);
        body.push_str(r#"{"model":"mock","stream":false,"messages":["#);
        for m in &self.messages {
            body.push_str(m);
            body.push(',');
        }
        body.push_str(new);
        body.push_str("]}");
        body
    }

    /// The request with `new` was answered: the client keeps its message
    /// and the mock's answer.
    fn answered(&mut self, new: Arc<str>) {
        static ANSWER: std::sync::OnceLock<Arc<str>> = std::sync::OnceLock::new();
        let answer = ANSWER.get_or_init(|| {
            Arc::from(json!({"role": "assistant", "content": MOCK_ANSWER}).to_string())
        });
        self.messages.push_back(new);
        self.messages.push_back(Arc::clone(answer));
        while self.messages.len() > self.keep {
            self.messages.pop_front();
        }
    }
}

/// Gives every session `history` stored messages (recall targets only).
async fn seed(target: &Target, sessions: usize, history: usize) {
    if !target.recall || history == 0 {
        return;
    }
    let client = reqwest::Client::new();
    let contents: Vec<Value> = (0..history)
        .map(|i| message(if i % 2 == 0 { "user" } else { "assistant" }, i))
        .collect();
    let body = Arc::new(json!({"contents": contents}).to_string());
    let mut pending = futures_util::stream::iter(0..sessions)
        .map(|s| {
            let (client, body) = (client.clone(), Arc::clone(&body));
            let url = format!("{}/sessions/bench-{s}/history", target.base);
            async move {
                let r = client
                    .put(url)
                    .header("content-type", "application/json")
                    .body(body.as_str().to_owned())
                    .send()
                    .await;
                assert!(r.is_ok_and(|r| r.status().is_success()), "seeding failed");
            }
        })
        .buffer_unordered(32);
    while pending.next().await.is_some() {}
}

/// What recall's `/metrics` say it holds and has replaced: the messages
/// its sessions hold, and the stored messages superseded so far (None
/// where it cannot say).
struct RecallCounts {
    stored: Option<u64>,
    superseded: Option<u64>,
}

impl RecallCounts {
    async fn read(target: &Target) -> Self {
        let text = match target.base.strip_suffix("/v1") {
            Some(root) => async {
                let r = client().get(format!("{root}/metrics")).send().await.ok()?;
                r.text().await.ok()
            }
            .await
            .unwrap_or_default(),
            None => String::new(),
        };
        // A metric's samples: its own lines, labelled or not.
        let sum = |metric: &str| {
            let counts: Vec<u64> = text
                .lines()
                .filter(|l| {
                    l.strip_prefix(metric)
                        .is_some_and(|rest| rest.starts_with([' ', '{']))
                })
                .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
                .collect();
            (!counts.is_empty()).then(|| counts.iter().sum())
        };
        Self {
            stored: sum("recall_stored_messages"),
            superseded: sum("recall_superseded_messages_total"),
        }
    }
}

/// A Responses request continuing the seeded session as its conversation.
fn responses_body(stream: bool, i: usize, session: &str) -> String {
    let text = message("user", i)["content"].clone();
    json!({"model": "mock", "stream": stream, "input": text, "conversation": session}).to_string()
}

/// Chat request `i`: its new user message, after `resend` prior messages
/// (`Target::resend`: 0 but for a client resending the conversation).
fn request_body(stream: bool, i: usize, resend: usize) -> String {
    let new = message("user", i);
    if resend == 0 {
        return json!({"model": "mock", "stream": stream, "messages": [new]}).to_string();
    }
    format!(
        r#"{{"model":"mock","stream":{stream},"messages":[{},{new}]}}"#,
        prior_messages(resend)
    )
}

/// The JSON of `n` prior messages (`message`, alternating user and
/// assistant), comma-separated, built once per count: the generator shares
/// the machine with the paths under test, and building and serialising 20
/// messages for every request would cost it as much as sending one, which
/// would lower the resending path's rates for a reason not the path's.
fn prior_messages(n: usize) -> Arc<str> {
    static BUILT: std::sync::Mutex<BTreeMap<usize, Arc<str>>> =
        std::sync::Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    Arc::clone(built.entry(n).or_insert_with(|| {
        let held = Held::new(n).messages;
        held.iter()
            .map(|m| &**m)
            .collect::<Vec<_>>()
            .join(",")
            .into()
    }))
}

/// One client for the whole run, so that warm-up connections are reused.
fn client() -> reqwest::Client {
    static CLIENT: std::sync::OnceLock<reqwest::Client> = std::sync::OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .pool_max_idle_per_host(1024)
                .build()
                .expect("client")
        })
        .clone()
}

/// Open loop: request `i` is due at `start + i / rate`, whatever happened
/// to the earlier ones; its latency counts from then. Chat requests carry
/// the target's `resend` prior messages (`request_body`).
async fn open_loop(target: &Target, s: &Scenario) -> Stats {
    let client = client();
    let total = (s.rate * s.secs) as usize;
    let cpu = Cpu::start(target);
    let start = tokio::time::Instant::now() + Duration::from_millis(20);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / s.rate);
        tokio::time::sleep_until(due).await;
        let (client, tx) = (client.clone(), tx.clone());
        let session = format!("bench-{}", i % s.sessions);
        let (url, body) = if s.responses {
            let url = format!("{}/responses", target.base);
            (url, responses_body(s.stream, i, &session))
        } else {
            let url = format!("{}/chat/completions", target.base);
            (url, request_body(s.stream, i, target.resend))
        };
        let (recall, stream) = (target.recall, s.stream);
        tokio::spawn(async move {
            let _ = tx.send(one(&client, &url, recall.then_some(session), body, stream, due).await);
        });
    }
    drop(tx);
    let mut stats = Stats {
        sent: total,
        ..Stats::default()
    };
    while let Some(r) = rx.recv().await {
        match r {
            Ok((latency, ttfb, gaps)) => {
                stats.latency.push(latency);
                if let Some(t) = ttfb {
                    stats.ttfb.push(t);
                }
                stats.gaps.extend(gaps);
            }
            Err(kind) => stats.failed(kind),
        }
    }
    stats.elapsed = (tokio::time::Instant::now() - start).as_secs_f64();
    // Per request sent: in a collapse, the failed ones took work too.
    stats.cpu_us = cpu.per_request(total);
    stats
}

/// A failed request's kind, kept so that the report says what failed.
type Outcome = Result<(f64, Option<f64>, Vec<f64>), String>;

impl Stats {
    fn failed(&mut self, kind: String) {
        self.errors += 1;
        *self.failures.entry(kind).or_default() += 1;
    }

    /// Adds another worker's failures to these.
    fn absorb_failures(&mut self, other: Stats) {
        self.errors += other.errors;
        for (kind, n) in other.failures {
            *self.failures.entry(kind).or_default() += n;
        }
    }
}

/// Every failure of the run, by path, scenario and kind, printed at the end.
static FAILURES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
/// What a run found wrong besides failed requests, said at its end.
static NOTES: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn note(line: &str) {
    eprintln!("note: {line}");
    if let Ok(mut all) = NOTES.lock() {
        all.push(line.to_owned());
    }
}

fn note_failures(path: &str, scenario: &str, failures: &BTreeMap<String, usize>) {
    if failures.is_empty() {
        return;
    }
    let kinds: Vec<String> = failures.iter().map(|(k, n)| format!("{k} ×{n}")).collect();
    let line = format!("{path} · {scenario}: {}", kinds.join(", "));
    eprintln!("failed requests: {line}");
    if let Ok(mut all) = FAILURES.lock() {
        all.push(line);
    }
}

/// A failed send, by what reqwest says went wrong.
fn send_failure(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "send"
    };
    format!("{what} error")
}

async fn one(
    client: &reqwest::Client,
    url: &str,
    session: Option<String>,
    body: String,
    stream: bool,
    due: tokio::time::Instant,
) -> Outcome {
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-bench")
        .body(body);
    if let Some(s) = session {
        req = req.header("x-session-id", s);
    }
    let resp = req.send().await.map_err(|e| send_failure(&e))?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status().as_u16()));
    }
    if !stream {
        resp.bytes()
            .await
            .map_err(|_| "body broke off".to_owned())?;
        return Ok((ms(due.elapsed()), None, Vec::new()));
    }
    let mut body = resp.bytes_stream();
    let mut ttfb = None;
    let mut last = Instant::now();
    let mut gaps = Vec::with_capacity(CHUNKS + 2);
    let mut done = false;
    // The end may straddle two reads: the last bytes of the one before
    // are searched with the next.
    let mut tail: Vec<u8> = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|_| "stream broke off".to_owned())?;
        let now = Instant::now();
        // Gaps are between events as the client has them: the first event
        // a read completes came `now - last` after the one before, the
        // others of the same read with it (a proxy that writes events
        // ready together in one go has a gap of 0 between them).
        let ended = events_ended(tail.last().copied(), &chunk);
        if ttfb.is_none() {
            ttfb = Some(ms(due.elapsed()));
            gaps.extend(std::iter::repeat_n(0.0, ended.saturating_sub(1)));
            last = now;
        } else if ended > 0 {
            gaps.push(ms(now - last));
            gaps.extend(std::iter::repeat_n(0.0, ended - 1));
            last = now;
        }
        // Chat's end, or the Responses stream's.
        tail.extend_from_slice(&chunk);
        done |= memchr_contains(&tail, b"[DONE]") || memchr_contains(&tail, b"response.completed");
        let keep = tail.len().saturating_sub(24);
        tail.drain(..keep);
    }
    if !done {
        return Err("stream ended without its end event".into());
    }
    Ok((ms(due.elapsed()), ttfb, gaps))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// What a `max_rate` run sustained.
struct Sustained {
    /// Completed requests a second (failed ones not counted).
    rate: f64,
    /// The path's own process's CPU time (user + system, all its threads)
    /// over the run, in µs per completed request; None for a path
    /// without one (`Target::cpu_pid`). Unlike the rate, which on this
    /// 2-core machine depends on how the cores are shared with the
    /// generator and the mock, this is the path's own cost.
    cpu_us: Option<f64>,
}

/// Closed loop with `conns` connections, each sending its next request as
/// soon as the last one is answered: the highest sustained rate, and the
/// path's CPU time per request over the run (`Cpu`, read just before
/// the first request and after the last answer). Each connection has
/// sessions of its own, so that no two requests are ever turns of one
/// session at once (which recall would answer as a barge-in). A client
/// that resends the conversation (`Target::resend`) holds each session's
/// (`Held`), for recall and the hop alike, so that both are sent the same
/// bodies; its sessions' first requests, which carry the 20 prior
/// messages recall then stores, are sent before the run.
async fn max_rate(target: &Target, conns: usize, secs: f64) -> Sustained {
    /// Each run of a client resending its conversation starts new
    /// sessions, as its conversations start from what it holds.
    static RUNS: AtomicU64 = AtomicU64::new(0);
    const SESSIONS: usize = 64;
    let client = client();
    let url = format!("{}/chat/completions", target.base);
    let (recall, resend) = (target.recall, target.resend);
    let run = RUNS.fetch_add(1, Ordering::Relaxed);
    let name = move |c: usize, k: usize| match resend {
        0 => format!("max-{c}-{k}"),
        _ => format!("max-{c}-{k}-resent-{run}"),
    };
    let send = {
        let (client, url) = (client.clone(), url.clone());
        move |c: usize, k: usize, body: String| {
            let (client, url) = (client.clone(), url.clone());
            let session = recall.then(|| name(c, k));
            async move {
                one(
                    &client,
                    &url,
                    session,
                    body,
                    false,
                    tokio::time::Instant::now(),
                )
                .await
            }
        }
    };
    let counts_before = match recall && resend > 0 {
        true => Some(RecallCounts::read(target).await),
        false => None,
    };
    // Each connection's sessions, started (untimed) when it resends.
    let mut held: Vec<Vec<Held>> = Vec::new();
    if resend > 0 {
        let starts = (0..conns).map(|c| {
            let send = send.clone();
            async move {
                let mut own = Vec::with_capacity(SESSIONS);
                for k in 0..SESSIONS {
                    let mut h = Held::new(resend);
                    let new: Arc<str> = message("user", k).to_string().into();
                    if send(c, k, h.body(&new)).await.is_ok() {
                        h.answered(new);
                    }
                    own.push(h);
                }
                own
            }
        });
        held = futures_util::future::join_all(starts).await;
    }
    let first = if resend > 0 { SESSIONS } else { 0 };
    let cpu = Cpu::start(target);
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let workers: Vec<_> = (0..conns)
        .map(|c| {
            let send = send.clone();
            let mut held = held.get_mut(c).map(std::mem::take).unwrap_or_default();
            tokio::spawn(async move {
                let mut n = first;
                let mut failures = Stats::default();
                while Instant::now() < until {
                    let k = n % SESSIONS;
                    let (body, new) = match held.get(k) {
                        Some(h) => {
                            let new: Arc<str> = message("user", n).to_string().into();
                            (h.body(&new), Some(new))
                        }
                        None => (request_body(false, n, 0), None),
                    };
                    match send(c, k, body).await {
                        Ok(_) => {
                            if let (Some(h), Some(new)) = (held.get_mut(k), new) {
                                h.answered(new);
                            }
                            n += 1;
                        }
                        Err(kind) => failures.failed(kind),
                    }
                }
                (n - first, failures)
            })
        })
        .collect();
    let mut total = 0;
    let mut all = Stats::default();
    for w in workers {
        if let Ok((n, failures)) = w.await {
            total += n;
            all.absorb_failures(failures);
        }
    }
    let cpu_us = cpu.per_request(total);
    note_failures(&target.name, "highest rate", &all.failures);
    if let Some(before) = counts_before {
        // Every resend a continuation: recall replaced nothing it stored
        // (an edit or a regenerate would have) and stored two messages a
        // turn (a resend taken as a new conversation would store them all
        // again), besides each session's first 22.
        let after = RecallCounts::read(target).await;
        let expected = (conns * SESSIONS * (resend + 2) + 2 * total) as u64;
        let stored = after
            .stored
            .zip(before.stored)
            .map(|(a, b)| a.saturating_sub(b));
        let superseded = after
            .superseded
            .zip(before.superseded)
            .map(|(a, b)| a.saturating_sub(b));
        if stored != Some(expected) || superseded != Some(0) {
            note(&format!(
                "{}: {stored:?} messages stored for {expected} expected, {superseded:?} superseded: \
                 not every resend was taken as a continuation",
                target.name
            ));
        }
    }
    Sustained {
        rate: total as f64 / secs,
        cpu_us,
    }
}

/// A path's CPU time over a run, read at its start and at its end
/// (`cpu_ns`): its own cost, which unlike a rate or a latency does not
/// depend on how the 2 cores are shared with the generator and the mock.
/// Everything the process does counts (drains, the storage writer, summary
/// and memory calls).
struct Cpu {
    pid: Option<u32>,
    before: Option<u64>,
}

impl Cpu {
    fn start(target: &Target) -> Self {
        Cpu {
            pid: target.cpu_pid,
            before: target.cpu_pid.and_then(cpu_ns),
        }
    }

    /// µs per request over `requests`; None without a process to read.
    fn per_request(&self, requests: usize) -> Option<f64> {
        let (before, after) = (self.before?, cpu_ns(self.pid?)?);
        (requests > 0).then(|| after.saturating_sub(before) as f64 / 1e3 / requests as f64)
    }
}

/// The CPU time process `pid`'s threads have used, in ns: the sum of each
/// live thread's `/proc/<pid>/task/<tid>/schedstat` (its first field). The
/// process's own `utime` and `stime` count in clock ticks of 10 ms, too
/// coarse for the few thousand turns of a quick run; a thread that exits
/// during a run takes its time with it (recall's and the hop's threads
/// live as long as the process). None off Linux or once it has exited.
fn cpu_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0u64;
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        total += stat
            .split_whitespace()
            .next()
            .and_then(|ns| ns.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(total)
}

fn median_of(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(0.0)
}

fn rss_kib(child: &Option<Child>) -> Option<(u64, u64)> {
    let pid = child.as_ref()?.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<u64> {
        status
            .lines()
            .find(|l| l.starts_with(name))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

// ------------------------------------------------------------- the run

/// One run's figures for one path and scenario (latencies in ms; the
/// TTFB and chunk-gap ones NaN for a run that did not stream). The TTFB
/// and chunk-gap p50s are not in the results table, only in the streaming
/// table's comparison with the naive hop.
#[derive(Clone, Copy)]
struct Figures {
    rate: f64,
    errors: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
    ttfb50: f64,
    ttfb99: f64,
    gap50: f64,
    gap99: f64,
    /// CPU µs per request sent (NaN where the path has no process of
    /// its own to read: direct, nginx, LiteLLM).
    cpu: f64,
}

/// The run's figures; its failures, if any, go to the report under
/// `path` and `scenario`.
fn figures(path: &str, scenario: &str, st: &mut Stats) -> Figures {
    note_failures(path, scenario, &st.failures);
    let ok = st.latency.len();
    Figures {
        rate: ok as f64 / st.elapsed.max(1e-9),
        errors: st.errors + (st.sent - ok - st.errors),
        p50: pct(&mut st.latency, 0.50),
        p90: pct(&mut st.latency, 0.90),
        p99: pct(&mut st.latency, 0.99),
        max: pct(&mut st.latency, 1.0),
        ttfb50: pct(&mut st.ttfb, 0.50),
        ttfb99: pct(&mut st.ttfb, 0.99),
        gap50: pct(&mut st.gaps, 0.50),
        gap99: pct(&mut st.gaps, 0.99),
        cpu: st.cpu_us.unwrap_or(f64::NAN),
    }
}

/// Each figure's median over repeated runs (errors: their sum), so that
/// one noisy run on a shared machine does not decide a row.
fn median(runs: &[Figures]) -> Figures {
    let mid = |f: fn(&Figures) -> f64| {
        let mut v: Vec<f64> = runs.iter().map(f).collect();
        pct(&mut v, 0.5)
    };
    Figures {
        rate: mid(|f| f.rate),
        errors: runs.iter().map(|f| f.errors).sum(),
        p50: mid(|f| f.p50),
        p90: mid(|f| f.p90),
        p99: mid(|f| f.p99),
        max: mid(|f| f.max),
        ttfb50: mid(|f| f.ttfb50),
        ttfb99: mid(|f| f.ttfb99),
        gap50: mid(|f| f.gap50),
        gap99: mid(|f| f.gap99),
        cpu: mid(|f| f.cpu),
    }
}

fn row(target: &str, s: &Scenario, f: &Figures) -> Vec<String> {
    let opt = |v: f64, digits: usize| {
        if v.is_nan() {
            "-".into()
        } else {
            format!("{v:.digits$}")
        }
    };
    vec![
        target.to_owned(),
        s.name.clone(),
        format!("{:.0}", f.rate),
        format!("{}", f.errors),
        format!("{:.2}", f.p50),
        format!("{:.2}", f.p90),
        format!("{:.2}", f.p99),
        format!("{:.2}", f.max),
        opt(f.ttfb99, 2),
        opt(f.gap99, 3),
        opt(f.cpu, 0),
    ]
}

fn print_table(rows: &[Vec<String>]) {
    println!("| path | scenario | achieved req/s | errors | p50 ms | p90 ms | p99 ms | max ms | TTFB p99 ms | chunk gap p99 ms | CPU µs per request |");
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!("| {} |", r.join(" | "));
    }
    let _ = std::io::stdout().flush();
}

async fn run(mock: SocketAddr, quick: bool, only: Option<String>, repeat: usize, rate: f64) {
    let secs = if quick { 3.0 } else { 8.0 };
    let wanted = |name: &str| only.as_deref().is_none_or(|o| name.contains(o));
    let direct = Target {
        name: "direct to mock".into(),
        base: format!("http://{mock}/v1"),
        recall: false,
        resend: 0,
        cpu_pid: None,
        child: None,
    };
    let memory = start_recall(mock, "memory", 20_000).await;
    let memory_as_hop = start_recall_as_hop(mock).await;
    let sqlite = start_recall(mock, "sqlite", 20_000).await;
    let hop = start_hop(mock, bench_threads()).await;
    // The same hop, its client resending the conversation, as a client
    // without recall's memory must (`resending`).
    let hop_resends = resending(&hop, RESENT);
    let nginx = start_nginx(mock).await;
    let litellm = if wanted("litellm") || only.is_none() {
        start_litellm(mock).await
    } else {
        None
    };

    let mut rows = Vec::new();
    // Every row's figures by path and scenario, for the overhead tables.
    let mut summary: HashMap<(String, String), Figures> = HashMap::new();
    let mut record = |target: &Target, s: &Scenario, f: Figures, rows: &mut Vec<Vec<String>>| {
        rows.push(row(&target.name, s, &f));
        summary.insert((target.name.clone(), s.name.clone()), f);
    };
    // The streaming headline scenario's name and paths, in the order run,
    // for the streaming table at the end.
    let mut streamed: Option<(String, Vec<String>)> = None;

    // 1. Overhead, non-streaming and streaming, 1,000 sessions of 10 messages.
    for stream in [false, true] {
        let s = Scenario {
            responses: false,
            name: format!(
                "{} · 1,000 sessions · 10 stored",
                if stream {
                    "stream (50 chunks)"
                } else {
                    "non-stream"
                }
            ),
            stream,
            sessions: 1000,
            history: 10,
            rate,
            secs,
        };
        if !wanted(&s.name) {
            continue;
        }
        // The paths take turns, `repeat` rounds, so that a slow spell of
        // the machine hits them alike; each row is the median round. The
        // naive hop runs twice: sent what recall is sent (one message),
        // and sent the conversation by a client that resends it; recall
        // (memory) too: with its window, and sending what the hop sends.
        let targets: Vec<&Target> = [
            Some(&direct),
            nginx.as_ref(),
            Some(&hop),
            Some(&hop_resends),
            Some(&memory),
            Some(&memory_as_hop),
            Some(&sqlite),
        ]
        .into_iter()
        .flatten()
        .collect();
        for target in &targets {
            seed(target, s.sessions, s.history).await;
        }
        let mut runs: Vec<Vec<Figures>> = vec![Vec::new(); targets.len()];
        for _ in 0..repeat {
            for (i, target) in targets.iter().enumerate() {
                warm_up(target, &s).await;
                let mut st = open_loop(target, &s).await;
                runs[i].push(figures(&target.name, &s.name, &mut st));
            }
        }
        for (target, runs) in targets.iter().zip(&runs) {
            record(target, &s, median(runs), &mut rows);
        }
        if stream {
            let paths = targets.iter().map(|t| t.name.clone()).collect();
            streamed = Some((s.name.clone(), paths));
        }
        if let Some(l) = &litellm {
            let slow = Scenario {
                rate: 200.0,
                name: format!("{} (at 200 req/s)", s.name),
                ..s.clone()
            };
            warm_up(l, &slow).await;
            let mut st = open_loop(l, &slow).await;
            record(l, &slow, figures(&l.name, &slow.name, &mut st), &mut rows);
        }
    }
    // 1b. The Responses API beside chat, on recall with memory: the same
    // 1,000 sessions, continued as conversations; in rounds.
    for stream in [false, true] {
        let kind = if stream {
            "stream (50 chunks)"
        } else {
            "non-stream"
        };
        let chat = Scenario {
            responses: false,
            name: format!("chat API · {kind} · 1,000 sessions · 10 stored"),
            stream,
            sessions: 1000,
            history: 10,
            rate,
            secs,
        };
        let resp = Scenario {
            responses: true,
            name: format!("Responses API · {kind} · 1,000 sessions · 10 stored"),
            ..chat.clone()
        };
        if !wanted(&resp.name) {
            continue;
        }
        let mut runs: [Vec<Figures>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..repeat {
            for (i, s) in [&chat, &resp].into_iter().enumerate() {
                // Each run starts from the same 10 stored messages: the
                // runs before it grow the sessions, and a later run would
                // send a fuller window (20) than an earlier one.
                seed(&memory, s.sessions, s.history).await;
                warm_up(&memory, s).await;
                let mut st = open_loop(&memory, s).await;
                runs[i].push(figures(&memory.name, &s.name, &mut st));
            }
        }
        for (s, runs) in [&chat, &resp].into_iter().zip(&runs) {
            record(&memory, s, median(runs), &mut rows);
        }
    }
    // 1c. Redis: one server, and a 6-node cluster (3 masters with a
    // replica each) with `min_replicas` 0 and 1, beside SQLite, at a rate
    // each sustains: what storage costs a turn, and what waiting for a
    // replica (`WAIT`) adds.
    let redis_rows = Scenario {
        responses: false,
        name: "non-stream · 1,000 sessions · 10 stored · on Redis (at 500 req/s)".into(),
        stream: false,
        sessions: 1000,
        history: 10,
        rate: 500.0,
        secs,
    };
    if wanted(&redis_rows.name) {
        match redis_servers::Deployments::start() {
            Some(redis) => {
                let history = "[history]\nwindow_messages = 20\nmax_messages = 20000\n";
                let workers = bench_threads();
                let mut targets = vec![
                    launch_on(mock, "redis", &redis.single_storage("b1"), workers, history).await,
                ];
                let cluster: &[u32] = match std::env::args().any(|a| a == "--no-cluster") {
                    true => &[],
                    false => &[0, 1],
                };
                for &n in cluster {
                    let label = format!("redis cluster, min_replicas {n}");
                    let storage = redis.cluster_storage(&format!("b2{n}"), n);
                    targets.push(launch_on(mock, &label, &storage, workers, history).await);
                }
                let targets: Vec<&Target> = std::iter::once(&sqlite).chain(&targets).collect();
                let mut runs: Vec<Vec<Figures>> = vec![Vec::new(); targets.len()];
                for _ in 0..repeat {
                    for (i, target) in targets.iter().enumerate() {
                        // Each round from the same 10 stored messages.
                        seed(target, redis_rows.sessions, redis_rows.history).await;
                        warm_up(target, &redis_rows).await;
                        let mut st = open_loop(target, &redis_rows).await;
                        runs[i].push(figures(&target.name, &redis_rows.name, &mut st));
                    }
                }
                for (target, runs) in targets.iter().zip(&runs) {
                    record(target, &redis_rows, median(runs), &mut rows);
                }
            }
            None => note("Redis rows skipped: redis-server or redis-cli is not on PATH"),
        }
    }
    // 2. Sessions: 1 (one conversation, turns in sequence), 100,000.
    for (sessions, r) in [(100_000usize, rate)] {
        let s = Scenario {
            responses: false,
            name: format!("non-stream · {sessions} sessions · 10 stored"),
            stream: false,
            sessions,
            history: 10,
            rate: r,
            secs,
        };
        if !wanted(&s.name) {
            continue;
        }
        for target in [&memory, &sqlite] {
            seed(target, sessions, 10).await;
            warm_up(target, &s).await;
            let mut st = open_loop(target, &s).await;
            record(
                target,
                &s,
                figures(&target.name, &s.name, &mut st),
                &mut rows,
            );
        }
    }
    // 3. History length: 10 sessions with 10, 1,000 and 10,000 stored
    // messages, in rounds like the headline scenarios (a sub-millisecond
    // p50 moves by 10% between two runs of the same case here).
    let cases: Vec<(Scenario, Target)> = {
        let mut cases = Vec::new();
        for history in [10usize, 1000, 10_000] {
            let s = Scenario {
                responses: false,
                name: format!("non-stream · 10 sessions · {history} stored"),
                stream: false,
                sessions: 10,
                history,
                rate: 500.0,
                secs,
            };
            if wanted(&s.name) {
                cases.push((s, start_recall(mock, "memory", 20_000).await));
            }
        }
        cases
    };
    let mut runs: Vec<Vec<Figures>> = vec![Vec::new(); cases.len()];
    for _ in 0..repeat {
        for (i, (s, target)) in cases.iter().enumerate() {
            // Seeded again each round (a PUT replaces the history), so
            // that every round starts from exactly this length.
            seed(target, s.sessions, s.history).await;
            let mut st = sequential(target, s).await;
            runs[i].push(figures(&target.name, &s.name, &mut st));
        }
    }
    for ((s, target), runs) in cases.iter().zip(&runs) {
        record(target, s, median(runs), &mut rows);
    }
    print_table(&rows);

    // 4. Highest sustained rate, closed loop with 16 connections, and
    // each path's CPU time per request over its run.
    if wanted("max") {
        println!();
        println!(
            "| path | highest sustained req/s (16 connections, non-stream) | share of direct | \
             ÷ naive hop (same threads) | CPU µs per request | ÷ naive hop's (same threads) |"
        );
        println!("|---|---|---|---|---|---|");
        // recall as nginx is run here: one thread serving, which on 2
        // cores shared with the generator and the mock costs less CPU per
        // request than one thread per core. The naive hop runs with each
        // thread count recall runs with, and each path is also given as a
        // ratio to the hop of its thread count (nginx: to the hop on one
        // thread, as nginx runs one worker). Beside each hop, the same hop
        // sent the conversation by a client that resends it, as a row of
        // its own (its ratios to the plain hop's): recall's ratios stay to
        // the plain hop's, and the reader compares with either.
        let single = start_recall_with(mock, "memory", 20_000, 1).await;
        let memory_resends = resending(&memory, RESENT);
        let hop_single = start_hop(mock, 1).await;
        let hop_single_resends = resending(&hop_single, RESENT);
        let targets: Vec<(&Target, Option<&Target>)> = [
            (Some(&direct), None),
            (nginx.as_ref(), Some(&hop_single)),
            (Some(&hop), Some(&hop)),
            (Some(&hop_resends), Some(&hop)),
            (Some(&hop_single), Some(&hop_single)),
            (Some(&hop_single_resends), Some(&hop_single)),
            (Some(&memory), Some(&hop)),
            (Some(&memory_resends), Some(&hop)),
            (Some(&memory_as_hop), Some(&hop)),
            (Some(&single), Some(&hop_single)),
            (Some(&sqlite), Some(&hop)),
        ]
        .into_iter()
        .filter_map(|(t, reference)| Some((t?, reference)))
        .collect();
        let position = |t: &Target| targets.iter().position(|(u, _)| std::ptr::eq(*u, t));
        // Rounds, like the headline scenarios: each path's rate, its share
        // of the direct rate, its ratio to the hop's, its CPU per request
        // and that ratio to the hop's, measured in the same round, as
        // medians. The rates on this 2-core machine depend on how the
        // cores are shared with the generator and the mock; the CPU per
        // request is the path's own (direct and nginx have none: "-").
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
        let mut shares: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
        let mut to_hop: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
        let mut cpu: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
        let mut cpu_to_hop: Vec<Vec<f64>> = vec![Vec::new(); targets.len()];
        for _ in 0..repeat {
            let mut round = Vec::with_capacity(targets.len());
            for (target, _) in &targets {
                round.push(max_rate(target, 16, secs.min(5.0)).await);
            }
            let direct_max = round[0].rate;
            for (i, (_, reference)) in targets.iter().enumerate() {
                rates[i].push(round[i].rate);
                shares[i].push(round[i].rate / direct_max);
                cpu[i].extend(round[i].cpu_us);
                if let Some(r) = reference.and_then(position) {
                    to_hop[i].push(round[i].rate / round[r].rate);
                    if let (Some(own), Some(its)) = (round[i].cpu_us, round[r].cpu_us) {
                        cpu_to_hop[i].push(own / its);
                    }
                }
            }
        }
        let median_or_dash = |v: &mut Vec<f64>, digits: usize| {
            if v.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.digits$}", median_of(v))
            }
        };
        for (i, (target, _)) in targets.iter().enumerate() {
            println!(
                "| {} | {:.0} | {:.2} | {} | {} | {} |",
                target.name,
                median_of(&mut rates[i]),
                median_of(&mut shares[i]),
                median_or_dash(&mut to_hop[i], 2),
                median_or_dash(&mut cpu[i], 1),
                median_or_dash(&mut cpu_to_hop[i], 2),
            );
        }
    }

    // 5. Memory: 100,000 sessions of 20 messages of 200 characters.
    if wanted("memory") {
        let fresh = start_recall(mock, "memory", 20_000).await;
        let (before, _) = rss_kib(&fresh.child).unwrap_or((0, 0));
        seed(&fresh, 100_000, 20).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (rss, hwm) = rss_kib(&fresh.child).unwrap_or((0, 0));
        let text_kib = 100_000 * 20 * 200 / 1024;
        println!();
        println!("| memory | KiB |");
        println!("|---|---|");
        println!("| RSS before seeding | {before} |");
        println!("| RSS with 100,000 sessions × 20 messages × 200 chars | {rss} (peak {hwm}) |");
        println!("| message text held | {text_kib} |");
        println!(
            "| budget: 1.5 × text + 2 KiB × sessions | {} |",
            text_kib * 3 / 2 + 2 * 100_000
        );
        println!(
            "| added per session beyond the text | {:.0} bytes |",
            ((rss.saturating_sub(before)) as f64 * 1024.0 - (text_kib as f64 * 1024.0)) / 100_000.0
        );
    }

    // 5b. A million sessions (memory), only when asked for by name
    // (`--only million`): seeding them takes minutes and gigabytes.
    if only
        .as_deref()
        .is_some_and(|o| "a million sessions".contains(o))
    {
        million_sessions(mock, rate, secs, repeat).await;
    }

    // 6. Long sessions: memory beyond the window.
    if wanted("long session") {
        long_sessions(mock, quick, repeat).await;
    }

    // 7. Long-term memory: search cost by records held; turns with it on
    // and off.
    if wanted("long-term search") {
        long_term_search(mock, quick).await;
    }
    if wanted("long-term turns") {
        long_term_turns(mock, quick, repeat).await;
    }

    // The overhead: proxy minus direct, and each path's added p50 as a
    // ratio to the naive hop's in the same scenario (of the medians shown;
    // "-" where the hop added nothing at p50).
    println!();
    println!(
        "| path | scenario | added p50 ms | added p99 ms | added TTFB p99 ms | \
         added p50 ÷ naive hop's | CPU per request ÷ naive hop's |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut keys: Vec<_> = summary.keys().cloned().collect();
    keys.sort();
    for (target, scenario) in keys {
        let Some(base) = summary
            .get(&("direct to mock".to_owned(), scenario.clone()))
            .copied()
        else {
            continue;
        };
        if target == "direct to mock" {
            continue;
        }
        let f = summary[&(target.clone(), scenario.clone())];
        let ratio = summary
            .get(&(hop.name.clone(), scenario.clone()))
            .map(|h| h.p50 - base.p50)
            .filter(|added| *added > 0.0)
            .map_or_else(
                || "-".to_owned(),
                |added| format!("{:.2}", (f.p50 - base.p50) / added),
            );
        let cpu = summary
            .get(&(hop.name.clone(), scenario.clone()))
            .map(|h| f.cpu / h.cpu)
            .filter(|r| r.is_finite())
            .map_or_else(|| "-".to_owned(), |r| format!("{r:.2}"));
        println!(
            "| {target} | {scenario} | {:.3} | {:.3} | {} | {ratio} | {cpu} |",
            f.p50 - base.p50,
            f.p99 - base.p99,
            if f.ttfb99.is_nan() {
                "-".into()
            } else {
                format!("{:.3}", f.ttfb99 - base.ttfb99)
            }
        );
    }

    if let Some((scenario, paths)) = &streamed {
        streaming_against_hop(&summary, scenario, paths, &hop.name);
    }
}

/// The streaming headline scenario's TTFB and chunk gaps, p50 and p99,
/// each path's added over direct's, and each as a ratio to the plain
/// naive hop's added figure (`hop`: the hop sent one message; "-" where
/// the hop added nothing, or the figure is missing). The overhead table
/// gives the added TTFB p99 only; this sets recall's streaming beside the
/// least a proxy built like it adds, at the median and the tail.
fn streaming_against_hop(
    summary: &HashMap<(String, String), Figures>,
    scenario: &str,
    paths: &[String],
    hop: &str,
) {
    let of = |path: &str| summary.get(&(path.to_owned(), scenario.to_owned()));
    let (Some(base), Some(hop)) = (of("direct to mock"), of(hop)) else {
        return;
    };
    // TTFB p50, TTFB p99, chunk gap p50, chunk gap p99.
    let four = |f: &Figures| [f.ttfb50, f.ttfb99, f.gap50, f.gap99];
    let added = |f: &Figures| {
        let (own, direct) = (four(f), four(base));
        [0, 1, 2, 3].map(|k| own[k] - direct[k])
    };
    let hop_added = added(hop);
    println!();
    println!(
        "| path ({scenario}) | added TTFB p50 ms | added TTFB p99 ms | added chunk gap p50 ms | \
         added chunk gap p99 ms | TTFB p50 ÷ naive hop's | TTFB p99 ÷ naive hop's | \
         chunk gap p50 ÷ naive hop's | chunk gap p99 ÷ naive hop's | CPU µs per stream | \
         CPU per stream ÷ naive hop's |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let figure = |v: f64, digits: usize| {
        if v.is_nan() {
            "-".to_owned()
        } else {
            format!("{v:.digits$}")
        }
    };
    for path in paths.iter().filter(|p| *p != "direct to mock") {
        let Some(f) = of(path) else { continue };
        let own = added(f);
        // The gaps are a few µs: a fourth decimal.
        let shown = [0, 1, 2, 3].map(|k| figure(own[k], if k < 2 { 3 } else { 4 }));
        let ratios = [0, 1, 2, 3].map(|k| {
            if hop_added[k] > 0.0 {
                figure(own[k] / hop_added[k], 2)
            } else {
                "-".to_owned()
            }
        });
        println!(
            "| {path} | {} | {} | {} | {} |",
            shown.join(" | "),
            ratios.join(" | "),
            figure(f.cpu, 0),
            figure(f.cpu / hop.cpu, 2)
        );
    }
    let _ = std::io::stdout().flush();
}

/// 10 sessions of 500 turns each (100 with `--quick`), each turn sending
/// only its new message, turns of a session in sequence: the plain window
/// of 20, the same with a running summary folded every 10 messages (by the
/// mock, instantly; RECALL_BENCH_SUMMARY_EVERY sets another), and the full
/// history (no window). Per-turn latency,
/// and what the upstream was sent per turn.
async fn long_sessions(mock: SocketAddr, quick: bool, repeat: usize) {
    let turns = if quick { 100 } else { 500 };
    let sessions = 10;
    let every = env_number("RECALL_BENCH_SUMMARY_EVERY", 10);
    let window = "[history]\nwindow_messages = 20\nmax_messages = 20000\n";
    let paths = [
        ("plain window of 20", window.to_owned()),
        (
            "window of 20 + running summary",
            format!(
                "{window}[memory]\nsummarize = true\nsummary_model = \"{SUMMARY_MODEL}\"\n\
                 summary_every_messages = {every}\n"
            ),
        ),
        (
            "full history (no window)",
            "[history]\nwindow_messages = 0\nmax_messages = 0\n".to_owned(),
        ),
    ];
    println!();
    println!(
        "| long session ({sessions} sessions × {turns} turns, memory, a fold every {every} \
         messages) | p50 ms | p99 ms | \
         upstream bytes per turn | ≈ tokens per turn (bytes / 4) | summary calls | \
         recall's CPU µs per turn |"
    );
    println!("|---|---|---|---|---|---|---|");
    // Per path, per round: p50, p99, upstream bytes per turn, summary
    // calls, CPU µs per turn.
    type Run = (f64, f64, f64, u64, f64);
    let mut figures: Vec<Vec<Run>> = vec![Vec::new(); paths.len()];
    for round in 0..repeat {
        for (i, (_, sections)) in paths.iter().enumerate() {
            let target = launch(mock, "memory", 0, sections).await;
            let (calls, bytes, folds) = (
                CHAT_CALLS.load(Ordering::Relaxed),
                CHAT_BYTES.load(Ordering::Relaxed),
                SUMMARY_CALLS.load(Ordering::Relaxed),
            );
            let cpu = Cpu::start(&target);
            let mut lat = turn_by_turn(&target, sessions, turns, round).await;
            // The last fold runs after the last answer.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let cpu = cpu.per_request(lat.len()).unwrap_or(f64::NAN);
            let calls = CHAT_CALLS.load(Ordering::Relaxed) - calls;
            let bytes = CHAT_BYTES.load(Ordering::Relaxed) - bytes;
            let folds = SUMMARY_CALLS.load(Ordering::Relaxed) - folds;
            figures[i].push((
                pct(&mut lat, 0.5),
                pct(&mut lat, 0.99),
                bytes as f64 / calls.max(1) as f64,
                folds,
                cpu,
            ));
        }
    }
    for ((name, _), runs) in paths.iter().zip(&figures) {
        let mut p50: Vec<f64> = runs.iter().map(|r| r.0).collect();
        let mut p99: Vec<f64> = runs.iter().map(|r| r.1).collect();
        let mut per_turn: Vec<f64> = runs.iter().map(|r| r.2).collect();
        let mut cpu: Vec<f64> = runs.iter().map(|r| r.4).collect();
        let folds = runs.iter().map(|r| r.3).max().unwrap_or(0);
        let per_turn = median_of(&mut per_turn);
        println!(
            "| {name} | {:.3} | {:.3} | {per_turn:.0} | {:.0} | {folds} | {:.0} |",
            median_of(&mut p50),
            median_of(&mut p99),
            per_turn / 4.0,
            median_of(&mut cpu)
        );
    }
}

/// Latencies of `turns` turns in each of `sessions` new sessions, a
/// session's turns in sequence, the sessions side by side.
async fn turn_by_turn(target: &Target, sessions: usize, turns: usize, round: usize) -> Vec<f64> {
    let client = client();
    let url = format!("{}/chat/completions", target.base);
    let resend = target.resend;
    let workers: Vec<_> = (0..sessions)
        .map(|s| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let mut lat = Vec::with_capacity(turns);
                for i in 0..turns {
                    let due = tokio::time::Instant::now();
                    let session = Some(format!("long-{round}-{s}"));
                    let body = request_body(false, i, resend);
                    if let Ok((l, _, _)) = one(&client, &url, session, body, false, due).await {
                        lat.push(l);
                    }
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        if let Ok(lat) = w.await {
            all.extend(lat);
        }
    }
    all
}

// ------------------------------------------------------ long-term memory
//
// What `[long_term]` costs: searching one user's records as they grow
// (100, 1,000, 10,000), and turns with it on against off. The mock embeds
// (`/v1/embeddings`) and extracts instantly, with recall's own echo-mock
// logic, so what is measured is recall's work. `--only long-term` runs
// both; `--only "long-term search"` or `"long-term turns"` one.

/// The mock's `/v1/embeddings`: recall's own mock embedding of each input
/// (`proxy::mock::embed`, 256 dimensions, a bag of words), so that a
/// search finds records by their words; in the `encoding_format` asked.
fn mock_embeddings(body: &[u8]) -> Response {
    EMBED_CALLS.fetch_add(1, Ordering::Relaxed);
    let asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let inputs: Vec<&str> = match &asked["input"] {
        Value::String(s) => vec![s.as_str()],
        Value::Array(a) => a.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let v = embed::encoded(&embed::embedding(t), &asked["encoding_format"]);
            json!({"object": "embedding", "index": i, "embedding": v})
        })
        .collect();
    let reply = json!({"object": "list", "data": data, "model": asked["model"],
        "usage": {"prompt_tokens": inputs.len(), "total_tokens": inputs.len()}});
    json_reply(&reply)
}

/// An extraction request (its last user message under `EXTRACT_HEADING`):
/// answered as the echo mock does, with the conversation's statements.
fn mock_extraction(body: &[u8]) -> Response {
    EXTRACT_CALLS.fetch_add(1, Ordering::Relaxed);
    let asked: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let last_user = asked["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    let reply = json!({"id": "x", "object": "chat.completion", "created": 1, "model": "mock",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": embed::facts(last_user)}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16}});
    json_reply(&reply)
}

fn json_reply(v: &Value) -> Response {
    Response::builder()
        .header("content-type", "application/json")
        .body(Body::from(v.to_string()))
        .expect("response")
}

/// `[long_term]` on, both models served by the mock (the upstream's
/// `models` is `*`); `extra` adds keys to the section.
fn long_term_on(extra: &str) -> String {
    format!(
        "[long_term]\nenabled = true\nextract_model = \"bench-extractor\"\n\
         embedding_model = \"bench-embedder\"\nextract_every_turns = {}\n{extra}",
        env_number("RECALL_BENCH_EXTRACT_EVERY", 3)
    )
}

/// A seeded record's text: six words of its own, so that no two records
/// are near enough (cosine 0.92) to merge.
fn record_text(i: usize) -> String {
    let word = |j: u64| {
        // splitmix64 of (i, j): stable, and spread over the buckets.
        let mut z = (i as u64) << 3 ^ j;
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        format!("k{:x}", (z ^ (z >> 31)) % 1_000_000)
    };
    let words: Vec<String> = (0..6).map(word).collect();
    format!("fact {i}: {}", words.join(" "))
}

/// Search cost by records held: one user seeded through `POST
/// .../memory/records` (one at a time: a user's records change by
/// compare-and-set, so concurrent adds of one user only retry) to 100,
/// 1,000 and 10,000 records (10,000 skipped with `--quick`: each add
/// plans against, and copies, all the user's records, so seeding to
/// 10,000 takes about a minute here), and at each size sequential `POST
/// .../memory/records/search` (limit 5, the default threshold), each
/// embedding its query through the mock and ranking all the records.
/// Memory backend.
async fn long_term_search(mock: SocketAddr, quick: bool) {
    let sizes: &[usize] = if quick {
        &[100, 1000]
    } else {
        &[100, 1000, 10_000]
    };
    let searches = if quick { 50 } else { 200 };
    let sections = format!(
        "[history]\nwindow_messages = 20\nmax_messages = 20000\n{}",
        long_term_on("max_records_per_user = 20000\n")
    );
    let target = launch(mock, "memory", 0, &sections).await;
    let client = client();
    let records = format!("{}/users/lt-search/memory/records", target.base);
    println!();
    println!(
        "| long-term search (one user, {searches} sequential searches, limit 5, memory) | \
         p50 ms | p99 ms | max ms | results per search | adds/s while seeding |"
    );
    println!("|---|---|---|---|---|---|");
    let (mut held, mut merged, mut failed) = (0usize, 0usize, 0usize);
    for &n in sizes {
        let started = Instant::now();
        let from = held;
        while held < n {
            let r = client
                .post(&records)
                .json(&json!({"text": record_text(held)}))
                .send()
                .await;
            match answered(r).await {
                Some(v) if v["updated"] == true => merged += 1,
                Some(_) => {}
                None => failed += 1,
            }
            held += 1;
        }
        let adds = (held - from) as f64 / started.elapsed().as_secs_f64().max(1e-9);
        let url = format!("{records}/search");
        let (mut lat, mut found, mut errors) = (Vec::with_capacity(searches), 0usize, 0usize);
        // The first few warm the connection and the caches, unmeasured.
        for k in 0..searches + 5 {
            let query = record_text(k.wrapping_mul(7919) % n);
            let t0 = Instant::now();
            let r = client
                .post(&url)
                .json(&json!({"query": query, "limit": 5}))
                .send()
                .await;
            let Some(v) = answered(r).await else {
                errors += 1;
                continue;
            };
            if k >= 5 {
                lat.push(ms(t0.elapsed()));
                found += v["data"].as_array().map_or(0, Vec::len);
            }
        }
        if errors > 0 {
            let kind = BTreeMap::from([("search failed".to_owned(), errors)]);
            note_failures(&target.name, &format!("long-term search, {n}"), &kind);
        }
        println!(
            "| {n} records | {:.3} | {:.3} | {:.3} | {:.1} | {adds:.0} |",
            pct(&mut lat, 0.5),
            pct(&mut lat, 0.99),
            pct(&mut lat, 1.0),
            found as f64 / lat.len().max(1) as f64,
        );
    }
    if quick {
        println!("| 10000 records | skipped with --quick (seeding takes a while) | | | | |");
    }
    let kinds = [
        ("record merged into another", merged),
        ("add failed", failed),
    ];
    let kinds: BTreeMap<String, usize> = kinds
        .into_iter()
        .filter(|&(_, n)| n > 0)
        .map(|(k, n)| (k.to_owned(), n))
        .collect();
    note_failures(&target.name, "long-term seeding", &kinds);
}

/// Turn overhead: 20 sessions × 50 turns (200 without `--quick`), each
/// session a user of its own, a session's turns in sequence, with
/// `[long_term]` off and on, on the memory and the sqlite backend: closed
/// loop (the machine saturated, so background work takes CPU from the
/// turns) and paced (20 ms between a session's turns, time for it to run
/// between them); the paths take turns, `repeat` rounds, medians
/// reported. With it on, a new session's first turn reads its user's
/// records, each user message starts a search in the background (one at a
/// time per session, the newest query waiting) and an extraction starts
/// once 3 user messages are unextracted and none runs: nothing inline, so
/// on should be off within noise. The mock's counts show the work ran.
async fn long_term_turns(mock: SocketAddr, quick: bool, repeat: usize) {
    let (sessions, turns) = (20, if quick { 50 } else { 200 });
    let history = "[history]\nwindow_messages = 20\nmax_messages = 20000\n";
    let mut paths: Vec<(u64, &str, bool)> = Vec::new();
    for think in [0, 20] {
        for backend in ["memory", "sqlite"] {
            paths.extend([(think, backend, false), (think, backend, true)]);
        }
    }
    // Per path, per round: p50, p99, turns/s, errors, embeddings and
    // extraction calls, first turns' p50, CPU µs per turn.
    type Run = (f64, f64, f64, usize, u64, u64, f64, f64);
    let mut runs: Vec<Vec<Run>> = vec![Vec::new(); paths.len()];
    for round in 0..repeat {
        for (i, &(think, backend, on)) in paths.iter().enumerate() {
            let sections = if on {
                format!("{history}{}", long_term_on(""))
            } else {
                history.to_owned()
            };
            let target = launch(mock, backend, 0, &sections).await;
            let (embeds, extracts) = (
                EMBED_CALLS.load(Ordering::Relaxed),
                EXTRACT_CALLS.load(Ordering::Relaxed),
            );
            let cpu = Cpu::start(&target);
            let started = Instant::now();
            let think = Duration::from_millis(think);
            let (mut lat, mut firsts, errors) =
                user_turns(&target, sessions, turns, round, think).await;
            let rate = lat.len() as f64 / started.elapsed().as_secs_f64().max(1e-9);
            if errors > 0 {
                let kind = BTreeMap::from([("turn failed".to_owned(), errors)]);
                note_failures(&target.name, "long-term turns", &kind);
            }
            // The background jobs finish after the last answer: wait until
            // the mock has heard nothing for 300 ms (5 s at most), so that
            // they are counted and take no CPU from the next path.
            let until = Instant::now() + Duration::from_secs(5);
            let mut seen = EMBED_CALLS.load(Ordering::Relaxed);
            while Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let now = EMBED_CALLS.load(Ordering::Relaxed);
                if now == seen {
                    break;
                }
                seen = now;
            }
            runs[i].push((
                pct(&mut lat, 0.5),
                pct(&mut lat, 0.99),
                rate,
                errors,
                EMBED_CALLS.load(Ordering::Relaxed) - embeds,
                EXTRACT_CALLS.load(Ordering::Relaxed) - extracts,
                pct(&mut firsts, 0.5),
                cpu.per_request(lat.len()).unwrap_or(f64::NAN),
            ));
        }
    }
    println!();
    println!(
        "| long-term turns ({sessions} sessions × {turns} turns, a user each, extraction \
         every {} turns) | turns/s | \
         errors | p50 ms | p99 ms | first turns p50 ms | embeddings calls | extraction calls | \
         recall's CPU µs per turn |",
        env_number("RECALL_BENCH_EXTRACT_EVERY", 3)
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let mut off = (0.0, 0.0, 0.0, 0.0);
    for (&(think, backend, on), runs) in paths.iter().zip(&runs) {
        let mid = |f: fn(&Run) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(f).collect();
            median_of(&mut v)
        };
        let (p50, p99, first, cpu) = (mid(|r| r.0), mid(|r| r.1), mid(|r| r.6), mid(|r| r.7));
        let pace = if think == 0 {
            "closed loop".to_owned()
        } else {
            format!("{think} ms between turns")
        };
        println!(
            "| recall ({backend}), {pace}, long-term {} | {:.0} | {} | {p50:.3} | {p99:.3} | \
             {first:.3} | {:.0} | {:.0} | {cpu:.0} |",
            if on { "on" } else { "off" },
            mid(|r| r.2),
            runs.iter().map(|r| r.3).sum::<usize>(),
            mid(|r| r.4 as f64),
            mid(|r| r.5 as f64),
        );
        if on {
            println!(
                "| recall ({backend}), {pace}, on − off | | | {:+.3} | {:+.3} | {:+.3} | | | \
                 {:+.0} ({:+.0}%) |",
                p50 - off.0,
                p99 - off.1,
                first - off.2,
                cpu - off.3,
                100.0 * (cpu / off.3 - 1.0)
            );
        } else {
            off = (p50, p99, first, cpu);
        }
    }
}

/// A successful answer's JSON body (`Null` if it is not JSON).
async fn answered(r: reqwest::Result<reqwest::Response>) -> Option<Value> {
    let r = r.ok().filter(|r| r.status().is_success())?;
    let bytes = r.bytes().await.ok()?;
    Some(serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// `turn_by_turn` with a user per session (`x-user-id`) and user messages
/// that state facts (so that extractions store records and searches find
/// them): the latencies, those of the sessions' first turns, and the
/// count of failed turns.
async fn user_turns(
    target: &Target,
    sessions: usize,
    turns: usize,
    round: usize,
    think: Duration,
) -> (Vec<f64>, Vec<f64>, usize) {
    let client = client();
    let url = format!("{}/chat/completions", target.base);
    let workers: Vec<_> = (0..sessions)
        .map(|s| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let (mut lat, mut first, mut errors) = (Vec::with_capacity(turns), None, 0);
                let (session, user) = (format!("lt-{round}-{s}"), format!("lt-user-{round}-{s}"));
                for i in 0..turns {
                    let text = format!(
                        "I live in city {s} and I work on project {i}. My note {i} is about \
                         food and music. What would you suggest for step {i}?"
                    );
                    let body = json!({"model": "mock", "stream": false,
                        "messages": [{"role": "user", "content": text}]});
                    let t0 = Instant::now();
                    let r = client
                        .post(&url)
                        .header("authorization", "Bearer sk-bench")
                        .header("x-session-id", &session)
                        .header("x-user-id", &user)
                        .json(&body)
                        .send()
                        .await;
                    match answered(r).await {
                        Some(_) => {
                            lat.push(ms(t0.elapsed()));
                            first = first.or((i == 0).then(|| ms(t0.elapsed())));
                        }
                        None => errors += 1,
                    }
                    if !think.is_zero() {
                        tokio::time::sleep(think).await;
                    }
                }
                (lat, first, errors)
            })
        })
        .collect();
    let (mut all, mut firsts, mut errors) = (Vec::new(), Vec::new(), 0);
    for w in workers {
        if let Ok((lat, first, e)) = w.await {
            all.extend(lat);
            firsts.extend(first);
            errors += e;
        }
    }
    (all, firsts, errors)
}

/// A second of the scenario's load, not measured: connections, caches
/// and allocators settle first.
async fn warm_up(target: &Target, s: &Scenario) {
    let warm = Scenario {
        secs: 1.0,
        ..s.clone()
    };
    let _ = open_loop(target, &warm).await;
}

/// One conversation at a time per session: each session's next turn is
/// sent when its last one is answered (turns of one session never overlap).
async fn sequential(target: &Target, s: &Scenario) -> Stats {
    let client = client();
    let url = format!("{}/chat/completions", target.base);
    let per_session = ((s.rate * s.secs) as usize / s.sessions).max(1);
    let start = Instant::now();
    let (recall, resend) = (target.recall, target.resend);
    let workers: Vec<_> = (0..s.sessions)
        .map(|sess| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut failures = Stats::default();
                for i in 0..per_session {
                    let due = tokio::time::Instant::now();
                    let session = recall.then(|| format!("bench-{sess}"));
                    let body = request_body(false, i, resend);
                    match one(&client, &url, session, body, false, due).await {
                        Ok((l, _, _)) => lat.push(l),
                        Err(kind) => failures.failed(kind),
                    }
                }
                (lat, failures)
            })
        })
        .collect();
    let mut stats = Stats {
        sent: per_session * s.sessions,
        ..Stats::default()
    };
    for w in workers {
        if let Ok((lat, failures)) = w.await {
            stats.latency.extend(lat);
            stats.absorb_failures(failures);
        }
    }
    stats.elapsed = start.elapsed().as_secs_f64();
    stats
}
