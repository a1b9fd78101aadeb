//! What survives: restarts, `kill -9`, and SIGTERM in the middle of replies.
//! These run against SQLite whatever backend the rest of the suite uses.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::{json, Value};

fn runs_here() -> bool {
    !matches!(std::env::var("RECALL_TEST_BACKEND").as_deref(), Ok("redis"))
}

fn temp_db(name: &str) -> PathBuf {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("recall-durability-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.db"));
    let _ = std::fs::remove_file(&path);
    path
}

async fn in_process(db: &std::path::Path, upstream: &MockUpstream) -> Harness {
    let toml = format!(
        "[storage]\nbackend = \"sqlite\"\npath = \"{}\"\n[[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\n",
        db.display(),
        upstream.base_url()
    );
    let config = recall::Config::parse(&toml, std::path::Path::new("test.toml")).unwrap();
    let app = recall::App::new(config).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let served = Arc::clone(&app);
    tokio::spawn(async move { recall::serve(listener, served, std::future::pending()).await });
    Harness {
        url,
        upstream: upstream.clone(),
        app,
        client: reqwest::Client::new(),
    }
}

#[tokio::test]
async fn a_restart_keeps_history_system_messages_and_turn_ids() {
    if !runs_here() {
        return;
    }
    let db = temp_db("restart");
    let upstream = MockUpstream::start().await;
    let first = in_process(&db, &upstream).await;
    first.say("keep", "one").await;
    first
        .api(
            Method::PUT,
            "/v1/sessions/keep/system_messages",
            Some(json!({"system_messages": [system("likes tea")]})),
        )
        .await;
    first.say("keep", "two").await;
    let before = first.history("keep").await.1;
    first.app.wind_down().await;

    let second = in_process(&db, &upstream).await;
    assert_eq!(second.history("keep").await.1, before);
    let (_, sys) = second
        .api(Method::GET, "/v1/sessions/keep/system_messages", None)
        .await;
    assert_eq!(sys["system_messages"][0]["content"], "likes tea");
    second.say("keep", "three").await;
    let after = second.history("keep").await.1;
    assert_eq!(after["turn_id"], 3);
    assert_eq!(after["contents"][4]["turn_id"], 3);
    assert_eq!(
        upstream.last().transcript(),
        [
            "system: likes tea",
            "user: one",
            "assistant: reply 1",
            "user: two",
            "assistant: reply 2",
            "user: three"
        ]
    );
    let (_, list) = second.api(Method::GET, "/v1/sessions", None).await;
    assert_eq!(list["data"][0]["id"], "keep");
    assert_eq!(list["data"][0]["message_count"], 6);
}

#[tokio::test]
async fn a_restart_keeps_response_chains_and_conversations() {
    if !runs_here() {
        return;
    }
    let db = temp_db("responses");
    let upstream = MockUpstream::start().await;
    let first = in_process(&db, &upstream).await;
    let post = |h: &Harness, path: &str, body: Value| {
        let req = h.client.post(format!("{}{path}", h.url)).json(&body);
        async move {
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.json::<Value>().await.unwrap()
        }
    };
    let r1 = post(
        &first,
        "/v1/responses",
        json!({"model": "m", "input": "one"}),
    )
    .await;
    let c = post(
        &first,
        "/v1/conversations",
        json!({"metadata": {"k": "v"},
        "items": [{"role": "user", "content": "remember me"}]}),
    )
    .await;
    first.app.wind_down().await;

    let second = in_process(&db, &upstream).await;
    let path = format!("/v1/responses/{}", r1["id"].as_str().unwrap());
    let (status, got) = second.api(Method::GET, &path, None).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["output"][0]["content"][0]["text"], "reply 1");
    post(
        &second,
        "/v1/responses",
        json!({"model": "m", "input": "two", "previous_response_id": r1["id"]}),
    )
    .await;
    assert_eq!(
        upstream.last().transcript(),
        ["user: one", "assistant: reply 1", "user: two"]
    );
    let id = c["id"].as_str().unwrap();
    let (_, got) = second
        .api(Method::GET, &format!("/v1/conversations/{id}"), None)
        .await;
    assert_eq!(got["metadata"], json!({"k": "v"}));
    post(
        &second,
        "/v1/responses",
        json!({"model": "m", "input": "who?", "conversation": id}),
    )
    .await;
    assert_eq!(
        upstream.last().transcript(),
        ["user: remember me", "user: who?"]
    );
}

/// A recall process on a config of its own.
struct Process {
    child: Child,
    url: String,
    /// The "recall listening" log line.
    listening: String,
}

impl Process {
    fn start(config: &str) -> Self {
        Self::start_limited(config, None)
    }

    /// With `var` set in its environment, `MIMALLOC_ALLOW_THP` unset
    /// otherwise.
    fn start_with(config: &str, var: Option<(&str, &str)>) -> Self {
        Self::spawn(config, None, var)
    }

    /// With `max_file_bytes`, no file the process writes may grow past it
    /// (`RLIMIT_FSIZE`; SIGXFSZ ignored, so a write past it fails with
    /// EFBIG as on a full disk).
    fn start_limited(config: &str, max_file_bytes: Option<u64>) -> Self {
        Self::spawn(config, max_file_bytes, None)
    }

    fn spawn(config: &str, max_file_bytes: Option<u64>, var: Option<(&str, &str)>) -> Self {
        use std::os::unix::process::CommandExt;
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("recall-proc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{}.toml", rand_tag()));
        std::fs::write(&path, config).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_recall"));
        command
            .arg("--config")
            .arg(&path)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("MIMALLOC_ALLOW_THP")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some((name, value)) = var {
            command.env(name, value);
        }
        if let Some(max) = max_file_bytes {
            // SAFETY: between fork and exec only async-signal-safe calls
            // are made: setrlimit and signal.
            unsafe {
                command.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: max as libc::rlim_t,
                        rlim_max: max as libc::rlim_t,
                    };
                    if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                    Ok(())
                });
            }
        }
        let mut child = command.spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut lines = BufReader::new(stdout).lines();
        let (url, listening) = loop {
            let line = lines
                .next()
                .expect("recall exited before listening")
                .unwrap();
            if let Some(at) = line.find("addr=") {
                let addr = line[at + 5..].split_whitespace().next().unwrap();
                break (format!("http://{addr}"), line);
            }
        };
        // Keep reading so that the child never blocks on a full pipe.
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                if std::env::var_os("RECALL_TEST_ECHO").is_some() {
                    eprintln!("recall: {l}");
                }
            }
        });
        Self {
            child,
            url,
            listening,
        }
    }

    fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The process runs without transparent huge pages unless
/// `MIMALLOC_ALLOW_THP` says otherwise (docs/perf-journal.md item 45), whatever
/// the host's mode. The kernel shows it as `THP_enabled` (Linux 6.x): 0
/// by default, and with the variable set, what this test's own process
/// has (0 on a kernel without huge pages).
#[tokio::test]
async fn the_process_runs_without_transparent_huge_pages() {
    if !runs_here() {
        return;
    }
    let thp_enabled = |pid: &str| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("THP_enabled:"))
            .map(|v| v.trim().to_owned())
    };
    let Some(here) = thp_enabled("self") else {
        eprintln!("SKIPPED: this kernel does not show THP_enabled");
        return;
    };
    let upstream = MockUpstream::start().await;
    let config = process_config(&temp_db("thp"), &upstream, "");
    for (env, want) in [(None, "0"), (Some("1"), here.as_str())] {
        let recall = Process::start_with(&config, env.map(|v| ("MIMALLOC_ALLOW_THP", v)));
        let got = thp_enabled(&recall.child.id().to_string());
        assert_eq!(got.as_deref(), Some(want), "MIMALLOC_ALLOW_THP={env:?}");
    }
}

fn rand_tag() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    )
}

fn process_config(db: &std::path::Path, upstream: &MockUpstream, extra: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\n{extra}\n[log]\nformat = \"text\"\n\
         [storage]\nbackend = \"sqlite\"\npath = \"{}\"\n\
         [[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\n",
        db.display(),
        upstream.base_url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_9_during_a_burst_loses_no_acknowledged_message() {
    if !runs_here() {
        return;
    }
    let db = temp_db("kill9");
    let upstream = MockUpstream::start().await;
    let config = process_config(&db, &upstream, "");
    let recall = Process::start(&config);
    let client = reqwest::Client::new();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for w in 0..8 {
        let (client, url, stop) = (client.clone(), recall.url.clone(), Arc::clone(&stop));
        workers.push(tokio::spawn(async move {
            let session = format!("burst-{w}");
            let mut acked = Vec::new();
            for t in 0.. {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let text = format!("{session} turn {t}");
                let sent = client
                    .post(format!("{url}/v1/chat/completions"))
                    .header("x-session-id", &session)
                    .json(&json!({"model": "m", "messages": [user(&text)]}))
                    .send()
                    .await;
                match sent {
                    Ok(resp) if resp.status() == 200 => match resp.json::<Value>().await {
                        Ok(body) => {
                            acked.push((text, body["choices"][0]["message"]["content"].clone()))
                        }
                        Err(_) => break,
                    },
                    _ => break,
                }
            }
            (session, acked)
        }));
    }
    tokio::time::sleep(Duration::from_millis(2000)).await;
    recall.signal("KILL");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut results = Vec::new();
    for w in workers {
        results.push(w.await.unwrap());
    }
    drop(recall);

    let restarted = Process::start(&config);
    let mut total = 0;
    for (session, acked) in results {
        let hist: Value = client
            .get(format!("{}/v1/sessions/{session}/history", restarted.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let stored: Vec<Value> = hist["contents"].as_array().cloned().unwrap_or_default();
        for (i, (text, reply)) in acked.iter().enumerate() {
            assert_eq!(stored[2 * i]["content"], json!(text), "{session}: {hist}");
            assert_eq!(&stored[2 * i + 1]["content"], reply, "{session}: {hist}");
        }
        total += acked.len();
    }
    assert!(
        total > 20,
        "too few acknowledged turns to mean anything: {total}"
    );
    eprintln!("kill -9: {total} acknowledged turns, all present after restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_lets_short_replies_finish_and_records_long_ones_as_interrupted() {
    if !runs_here() {
        return;
    }
    let db = temp_db("sigterm");
    let upstream = MockUpstream::start().await;
    let config = process_config(&db, &upstream, "shutdown_grace_secs = 1");
    let recall = Process::start(&config);
    let client = reqwest::Client::new();
    let stream = |session: &'static str| {
        let (client, url) = (client.clone(), recall.url.clone());
        async move {
            let resp = client
                .post(format!("{url}/v1/chat/completions"))
                .header("x-session-id", session)
                .json(&json!({"model": "m", "stream": true, "messages": [user("go")]}))
                .send()
                .await
                .unwrap();
            let mut body = resp.bytes_stream();
            let first = body.next().await.unwrap().unwrap();
            (first, body)
        }
    };
    upstream.push(sse_text(&["short ", "reply"], Duration::from_millis(200)));
    let (_, short) = stream("short").await;
    upstream.push(sse_text(
        &["long ", "reply ", "that ", "takes ", "a while"],
        Duration::from_millis(800),
    ));
    let (_, long) = stream("long").await;

    let signalled = Instant::now();
    recall.signal("TERM");
    let read = |mut body: futures_util::stream::BoxStream<
        'static,
        reqwest::Result<bytes::Bytes>,
    >| async move {
        let mut text = String::new();
        while let Some(Ok(chunk)) = body.next().await {
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        text
    };
    let (short_text, long_text) = tokio::join!(read(short.boxed()), read(long.boxed()));
    assert!(short_text.contains("[DONE]"), "{short_text}");
    assert!(!long_text.contains("[DONE]"), "{long_text}");
    let mut recall = recall;
    let status = tokio::task::spawn_blocking(move || {
        let s = recall.child.wait().unwrap();
        (s, recall)
    })
    .await
    .unwrap();
    assert!(status.0.success(), "exit status {:?}", status.0);
    assert!(
        signalled.elapsed() < Duration::from_secs(10),
        "{:?}",
        signalled.elapsed()
    );
    drop(status.1);

    let restarted = Process::start(&config);
    let get = |s: &str| {
        let (client, url) = (client.clone(), restarted.url.clone());
        let s = s.to_owned();
        async move {
            client
                .get(format!("{url}/v1/sessions/{s}/history"))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    let short = get("short").await;
    assert_eq!(short["contents"][1]["content"], "short reply");
    assert!(short["contents"][1]["metadata"]
        .get("interrupted")
        .is_none());
    let long = get("long").await;
    assert_eq!(
        long["contents"][1]["metadata"]["interrupted"], true,
        "{long}"
    );
    assert!(long["contents"][1]["content"]
        .as_str()
        .unwrap()
        .starts_with("long "));
}

#[tokio::test]
async fn an_undeliverable_event_is_kept_and_sent_after_a_restart() {
    if !runs_here() {
        return;
    }
    let db = temp_db("kept-events");
    let upstream = MockUpstream::start().await;
    let config = |hook: &str| {
        format!(
            "[storage]\nbackend = \"sqlite\"\npath = \"{}\"\n\
             [webhook]\nurl = \"{hook}\"\nmax_retries = 1\nretry_backoff_ms = 20\n\
             [[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\n",
            db.display(),
            upstream.base_url()
        )
    };
    // The receiver refuses everything: the event is kept, not lost.
    let down = WebhookReceiver::start(usize::MAX).await;
    let first = Harness::with_config(&config(&down.url), upstream.clone()).await;
    first.say("kept", "remember me").await;
    first.api(Method::POST, "/v1/sessions/kept/end", None).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while down.attempts() < 2 {
        assert!(Instant::now() < deadline, "the webhook was not retried");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(down.attempts(), 2);
    let kept = first.app.policy.storage.kept_events().await.unwrap();
    assert_eq!(kept.len(), 1, "the event was not kept");
    first.app.wind_down().await;

    // After a restart with a working receiver, it is delivered and forgotten.
    let up = WebhookReceiver::start(0).await;
    let second = Harness::with_config(&config(&up.url), upstream.clone()).await;
    let (_, _, event) = up
        .wait_for(Duration::from_secs(5), |e| e["session_id"] == "kept")
        .await;
    assert_eq!(event["contents"][0]["content"], "remember me");
    // The same webhook-id on every attempt, before and after the restart:
    // the kept event's stored id, and the body as stored.
    let (kept_id, kept_body) = &kept[0];
    let (headers, body) = up.deliveries().remove(0);
    assert_eq!(headers["webhook-id"], kept_id.as_str());
    assert_eq!(&body, kept_body.as_bytes());
    let before: Vec<_> = down
        .tried()
        .iter()
        .map(|h| h["webhook-id"].clone())
        .collect();
    assert_eq!(before, [kept_id.as_str(), kept_id.as_str()]);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !second
        .app
        .policy
        .storage
        .kept_events()
        .await
        .unwrap()
        .is_empty()
    {
        assert!(
            Instant::now() < deadline,
            "the delivered event was not forgotten"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A carry-over still running when recall stops is kept as a job (in the
/// write that deletes its session) and runs when recall next starts: the
/// note is written once, and the job is forgotten. On Redis (the suite's
/// Redis pass) the stopped process's claim on the job lapses first.
#[tokio::test]
async fn a_carry_over_cut_short_by_a_stop_runs_after_the_restart() {
    let redis = std::env::var("RECALL_TEST_BACKEND").as_deref() == Ok("redis");
    let db = temp_db("kept-carry");
    let storage = match redis {
        true => format!(
            "[storage]\nbackend = \"redis\"\nurl = \"{}\"\nkey_prefix = \"kc{}\"\nlease_ms = 1000\n",
            std::env::var("RECALL_TEST_REDIS_URL").expect("the Redis pass sets RECALL_TEST_REDIS_URL"),
            rand_tag()
        ),
        false => format!("[storage]\nbackend = \"sqlite\"\npath = \"{}\"\n", db.display()),
    };
    let upstream = MockUpstream::start().await;
    let config = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nshutdown_grace_secs = 0\n[log]\nformat = \"text\"\n\
         [memory]\ncarry_over = true\nsummary_model = \"{SUMMARIZER}\"\nsummary_timeout_secs = 60\n\
         {storage}[[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\n",
        upstream.base_url()
    );
    let client = reqwest::Client::new();
    let summary_calls = || upstream.split().0.len();

    // The session ends; its last fold is under way when recall stops.
    upstream.summaries(SummaryMode::Slow(Duration::from_secs(60)));
    let first = Process::start(&config);
    let said = client
        .post(format!("{}/v1/chat/completions", first.url))
        .header("x-session-id", "leaving")
        .header("x-user-id", "ada")
        .json(&json!({"model": "m", "messages": [user("My name is Ada")]}))
        .send()
        .await
        .unwrap();
    assert_eq!(said.status(), 200);
    let ended = client
        .post(format!("{}/v1/sessions/leaving/end", first.url))
        .send()
        .await
        .unwrap();
    assert_eq!(ended.status(), 200);
    let deadline = Instant::now() + Duration::from_secs(10);
    while summary_calls() == 0 {
        assert!(Instant::now() < deadline, "the carry-over did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.signal("TERM");
    let mut first = first;
    let status = tokio::task::spawn_blocking(move || first.child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "exit status {status:?}");
    // With SQLite, what the file holds (Redis's keys are the suite's own).
    let kept_jobs = || {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.query_row("SELECT count(*) FROM kept_jobs", [], |r| r.get::<_, i64>(0))
            .unwrap()
    };
    if !redis {
        assert_eq!(kept_jobs(), 1, "the carry-over was not kept");
    }

    // Restarted with a model that answers: the note is written.
    upstream.summaries(SummaryMode::Fold);
    let before = summary_calls();
    let second = Process::start(&config);
    let deadline = Instant::now() + Duration::from_secs(15);
    let note = loop {
        let resp = client
            .get(format!("{}/v1/users/ada/memory", second.url))
            .send()
            .await
            .unwrap();
        if resp.status() == 200 {
            break resp.json::<Value>().await.unwrap();
        }
        assert_eq!(resp.status(), 404);
        assert!(Instant::now() < deadline, "no note after the restart");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(note["note"], "Known: My name is Ada");
    // The fold, then the note: once each.
    assert_eq!(summary_calls() - before, 2);
    drop(second);

    // Done, so forgotten: a third start has nothing to carry.
    let third = Process::start(&config);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(summary_calls() - before, 2, "the carry-over ran again");
    if !redis {
        assert_eq!(kept_jobs(), 0, "the carry-over that ran was not forgotten");
    }
    drop(third);
}

/// `[server] worker_threads` sets how many threads serve requests.
#[tokio::test]
async fn worker_threads_sets_the_serving_threads() {
    if !runs_here() {
        return;
    }
    let upstream = MockUpstream::start().await;
    for n in [1usize, 3] {
        let db = temp_db(&format!("workers-{n}"));
        let recall = Process::start(&process_config(
            &db,
            &upstream,
            &format!("worker_threads = {n}"),
        ));
        let at = recall.listening.find("workers=").expect("workers logged");
        let logged: usize = recall.listening[at + 8..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(logged, n);
        // Connections go round the threads: each of these is a new one.
        for i in 0..2 * n {
            let resp = reqwest::Client::new()
                .post(format!("{}/v1/chat/completions", recall.url))
                .header("x-session-id", format!("threads-{n}-{i}"))
                .json(&json!({"model": "m", "messages": [user("hi")]}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
        }
        // One serving thread per setting, each named after its index.
        let tasks = format!("/proc/{}/task", recall.child.id());
        let mut serving: Vec<String> = std::fs::read_dir(tasks)
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .map(|name| name.trim().to_owned())
            .filter(|name| name.starts_with("recall-serve-"))
            .collect();
        serving.sort();
        serving.dedup();
        let want: Vec<String> = (0..n).map(|k| format!("recall-serve-{k}")).collect();
        assert_eq!(serving, want);
    }
}

/// A small tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None` where mounting is not allowed (not root, no `mount`).
    fn mount(name: &str, size: &str) -> Option<Self> {
        let dir = PathBuf::from(format!("/tmp/recall-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Self(dir))
    }

    fn remount(&self, options: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.0)
            .status()
            .unwrap();
        assert!(status.success(), "remount {options}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// How the full-disk test fills its disk.
enum Filling {
    /// A 1 MiB tmpfs, later grown.
    Tmpfs(Tmpfs),
    /// A limit on the size of the files recall writes, lifted by a restart.
    FileSize,
}

/// Clients of three sessions keep sending turns (retrying a turn until it
/// is acknowledged) to a recall whose SQLite disk fills up (a tmpfs where
/// the test may mount one, else a file size limit). Every answer
/// is either the turn's end or a 503 `storage_unavailable` after which
/// the turn's reply is not in the history. Space is freed; the pending
/// turns go through on their retry; after a restart every acknowledged
/// turn is there once, in order, with its reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_full_disk_gets_truthful_503s_and_loses_nothing() {
    if !runs_here() {
        return;
    }
    // RECALL_TEST_FULL_DISK=filesize tries the fallback where tmpfs works.
    let tmpfs = std::env::var("RECALL_TEST_FULL_DISK").as_deref() != Ok("filesize");
    let (filling, db) = match tmpfs.then(|| Tmpfs::mount("full", "1m")).flatten() {
        Some(fs) => {
            let db = fs.0.join("recall.db");
            (Filling::Tmpfs(fs), db)
        }
        None => (Filling::FileSize, temp_db("full")),
    };
    let upstream = MockUpstream::start().await;
    let config = process_config(&db, &upstream, "");
    let mut recall = match &filling {
        Filling::Tmpfs(_) => Process::start(&config),
        Filling::FileSize => Process::start_limited(&config, Some(768 << 10)),
    };
    let client = reqwest::Client::new();
    let pad = "x".repeat(3000);
    let sessions = ["full-a", "full-b", "full-c"];
    let mut acked: Vec<Vec<String>> = vec![Vec::new(); 3];
    let mut pending: Vec<Option<String>> = vec![None; 3];
    let mut failures = [0usize; 3];
    let (mut attempted, mut told) = (0usize, 0usize);
    let turn = |url: String, session: &'static str, text: String, retry: bool| {
        let client = client.clone();
        async move {
            let mut req = client
                .post(format!("{url}/v1/chat/completions"))
                .header("x-session-id", session)
                .json(&json!({"model": "m", "messages": [user(&text)]}));
            if retry {
                req = req.header("x-stainless-retry-count", "1");
            }
            let resp = req.send().await.unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let history = |url: String, session: &'static str| {
        let client = client.clone();
        async move {
            let hist: Value = client
                .get(format!("{url}/v1/sessions/{session}/history"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            hist["contents"].as_array().cloned().unwrap_or_default()
        }
    };

    // Fill the disk: until every session has failed three times in a row.
    for t in 0..3000 {
        if failures.iter().all(|&f| f >= 3) {
            break;
        }
        let i = t % 3;
        let text = pending[i]
            .clone()
            .unwrap_or_else(|| format!("{} turn {t} {pad}", sessions[i]));
        attempted += 1;
        let (status, body) = turn(
            recall.url.clone(),
            sessions[i],
            text.clone(),
            pending[i].is_some(),
        )
        .await;
        if status == 200 {
            acked[i].push(text);
            pending[i] = None;
            failures[i] = 0;
            continue;
        }
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "storage_unavailable", "{body}");
        told += 1;
        failures[i] += 1;
        // Truthful: the turn's reply is not in the history.
        let stored = history(recall.url.clone(), sessions[i]).await;
        let at = stored.iter().position(|m| m["content"] == json!(text));
        assert!(
            at.is_none_or(|at| at + 1 == stored.len()),
            "a 503'd turn has a reply stored after it"
        );
        pending[i] = Some(text);
    }
    assert!(failures.iter().all(|&f| f >= 3), "the disk never filled");
    let filled_after: usize = acked.iter().map(Vec::len).sum();

    // Free space (or lift the limit, which takes a restart). (A read-only
    // remount is refused while recall holds its files open for writing.)
    match &filling {
        Filling::Tmpfs(fs) => fs.remount("size=64m"),
        Filling::FileSize => {
            drop(recall);
            recall = Process::start(&config);
        }
    }
    for i in 0..3 {
        if let Some(text) = pending[i].take() {
            attempted += 1;
            let (status, body) = turn(recall.url.clone(), sessions[i], text.clone(), true).await;
            assert_eq!(status, 200, "{body}");
            acked[i].push(text);
        }
        let text = format!("{} after {pad}", sessions[i]);
        attempted += 1;
        let (status, body) = turn(recall.url.clone(), sessions[i], text.clone(), false).await;
        assert_eq!(status, 200, "{body}");
        acked[i].push(text);
    }

    recall.signal("TERM");
    let _ = recall.child.wait();
    let restarted = Process::start(&config);
    let (mut found, mut lost, mut duplicated) = (0, 0, 0);
    for i in 0..3 {
        let stored = history(restarted.url.clone(), sessions[i]).await;
        let said: Vec<&Value> = stored.iter().filter(|m| m["role"] == "user").collect();
        found += said.len();
        for text in &acked[i] {
            match said.iter().filter(|m| m["content"] == json!(text)).count() {
                0 => lost += 1,
                1 => {}
                n => duplicated += n - 1,
            }
        }
        let order: Vec<&str> = said.iter().filter_map(|m| m["content"].as_str()).collect();
        assert_eq!(
            order,
            acked[i].iter().map(String::as_str).collect::<Vec<_>>()
        );
        for (j, m) in stored.iter().enumerate() {
            if m["role"] == "user" {
                assert_eq!(
                    stored.get(j + 1).map(|r| &r["role"]),
                    Some(&json!("assistant"))
                );
            }
        }
    }
    let how = match filling {
        Filling::Tmpfs(_) => "a 1 MiB tmpfs, grown to 64 MiB",
        Filling::FileSize => "a 768 KiB file size limit (no tmpfs here), lifted by a restart",
    };
    let acknowledged: usize = acked.iter().map(Vec::len).sum();
    eprintln!(
        "full disk ({how}): {attempted} requests, {acknowledged} turns acknowledged \
         ({filled_after} before the disk was full), {told} answered 503 storage_unavailable; \
         after a restart {found} found, {lost} lost, {duplicated} duplicated"
    );
    assert_eq!((lost, duplicated, found), (0, 0, acknowledged));
}
