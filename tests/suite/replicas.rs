//! Several recall replicas on one Redis: one conversation, any replica.
//! Needs `RECALL_TEST_REDIS_URL`; `.ci/run` starts a Redis server for it.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use reqwest::Method;
use serde_json::json;

/// Two replicas' configs on the same Redis keys, or `None` (with a loud
/// note) when no Redis is given.
fn shared(extra: &str) -> Option<String> {
    let Ok(url) = std::env::var("RECALL_TEST_REDIS_URL") else {
        assert!(
            std::env::var("CI").is_err(),
            "CI must provide RECALL_TEST_REDIS_URL"
        );
        eprintln!("\n*** SKIPPED: multi-replica tests need RECALL_TEST_REDIS_URL (`.ci/run` provides it) ***\n");
        return None;
    };
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    Some(format!(
        "[storage]\nbackend = \"redis\"\nurl = \"{url}\"\nkey_prefix = \"r{}-{n}\"\nlease_ms = 1000\n{extra}\n",
        std::process::id()
    ))
}

async fn pair(extra: &str) -> Option<(Harness, Harness, MockUpstream)> {
    let config = shared(extra)?;
    let upstream = MockUpstream::start().await;
    let toml = with_upstream(&config, &upstream);
    let a = Harness::with_config(&toml, upstream.clone()).await;
    let b = Harness::with_config(&toml, upstream.clone()).await;
    Some((a, b, upstream))
}

/// A replica's whole config: the shared storage and the mock upstream.
fn with_upstream(config: &str, upstream: &MockUpstream) -> String {
    format!(
        "{config}\n[[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\n",
        upstream.base_url()
    )
}

#[tokio::test]
async fn replicas_take_turns_in_one_conversation() {
    let Some((a, b, upstream)) = pair("").await else {
        return;
    };
    for (i, replica) in [&a, &b, &a, &b, &b, &a].into_iter().enumerate() {
        replica.say("shared", &format!("turn {i}")).await;
    }
    let sent = upstream.last().transcript();
    assert_eq!(sent.len(), 11, "{sent:?}");
    assert_eq!(sent[10], "user: turn 5");
    assert_eq!(sent[9], "assistant: reply 5");
    // Both replicas show the same memory.
    let (ha, hb) = (a.history("shared").await.1, b.history("shared").await.1);
    assert_eq!(ha, hb);
    assert_eq!(ha["turn_id"], 6);
    let turns: Vec<u64> = ha["contents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["turn_id"].as_u64().unwrap())
        .collect();
    assert_eq!(turns, [1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6]);
    // Session API writes on one replica are read on the other.
    a.api(
        Method::PUT,
        "/v1/sessions/shared/system_messages",
        Some(json!({"system_messages": [system("from replica a")]})),
    )
    .await;
    b.say("shared", "after the update").await;
    assert_eq!(upstream.last().transcript()[0], "system: from replica a");
    let (_, list) = b.api(Method::GET, "/v1/sessions", None).await;
    assert_eq!(list["data"][0]["id"], "shared");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn barge_in_on_another_replica_interrupts_the_streaming_one() {
    for round in 0..5 {
        let Some((a, b, upstream)) = pair("").await else {
            return;
        };
        let gap = Duration::from_millis(200);
        upstream.push(sse_text(
            &["Why did ", "the scarecrow ", "win ", "an award?"],
            gap,
        ));
        let resp = a
            .post_chat(
                "barge",
                json!({"model": "m", "stream": true, "messages": [user("joke?")]}),
            )
            .await;
        let mut stream = resp.bytes_stream();
        let mut seen = String::new();
        while !seen.contains("Why did") {
            seen.push_str(&String::from_utf8_lossy(
                &stream.next().await.unwrap().unwrap(),
            ));
        }
        let sent = Instant::now();
        b.say("barge", "story instead").await;
        let took = sent.elapsed();
        assert!(took < gap * 2, "round {round}: B waited {took:?}");
        // A's client sees its stream end without [DONE].
        let mut rest = String::new();
        while let Some(Ok(chunk)) = stream.next().await {
            rest.push_str(&String::from_utf8_lossy(&chunk));
        }
        assert!(!rest.contains("[DONE]"), "round {round}: {rest}");
        for replica in [&a, &b] {
            let (_, hist) = replica.history("barge").await;
            let c = hist["contents"].as_array().unwrap();
            let view: Vec<(&str, &str)> = c
                .iter()
                .map(|m| (m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
                .collect();
            assert_eq!(
                view,
                [
                    ("user", "joke?"),
                    ("assistant", "Why did "),
                    ("user", "story instead"),
                    ("assistant", "reply 2")
                ],
                "round {round}"
            );
            assert_eq!(c[1]["metadata"]["interrupted"], true);
        }
        assert_eq!(
            upstream.last().transcript(),
            ["user: joke?", "assistant: Why did ", "user: story instead"]
        );
    }
}

#[tokio::test]
async fn expiry_ends_a_session_once_across_replicas() {
    let hook = WebhookReceiver::start(0).await;
    let Some((a, b, _)) = pair(&format!(
        "[session]\nttl_secs = 1\n[webhook]\nurl = \"{}\"\nretry_backoff_ms = 50\n",
        hook.url
    ))
    .await
    else {
        return;
    };
    for i in 0..5 {
        a.say(&format!("exp-{i}"), "hi").await;
        b.say(&format!("exp-{i}"), "again").await;
    }
    for i in 0..5 {
        hook.wait_for(Duration::from_secs(6), |e| {
            e["session_id"] == format!("exp-{i}")
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let events = hook.events();
    assert_eq!(
        events.len(),
        5,
        "{:?}",
        events
            .iter()
            .map(|e| &e.2["session_id"])
            .collect::<Vec<_>>()
    );
    for (_, _, e) in &events {
        assert_eq!(e["reason"], "expired");
        assert_eq!(e["contents"].as_array().unwrap().len(), 4, "{e}");
    }
    assert_eq!(a.history("exp-0").await.0, 404);
    assert_eq!(b.history("exp-0").await.0, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_killed_mid_stream_does_not_block_the_next_turn() {
    let Some(config) = shared("[server]\nlisten = \"127.0.0.1:0\"\n") else {
        return;
    };
    let upstream = MockUpstream::start().await;
    let toml = with_upstream(&config, &upstream);
    // Replica A is a real process, so that it can die for real.
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("recall-replicas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("a.toml");
    std::fs::write(&path, &toml).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_recall"))
        .arg("--config")
        .arg(&path)
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().unwrap().unwrap();
        if let Some(at) = line.find("addr=") {
            break format!(
                "http://{}",
                line[at + 5..].split_whitespace().next().unwrap()
            );
        }
    };
    std::thread::spawn(move || for _ in lines {});

    upstream.push(sse_text(
        &["one ", "two ", "three"],
        Duration::from_millis(500),
    ));
    let client = reqwest::Client::new();
    let resp = client
        .post(format!("{url}/v1/chat/completions"))
        .header("x-session-id", "orphan")
        .json(&json!({"model": "m", "stream": true, "messages": [user("count")]}))
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let _ = stream.next().await;
    child.kill().unwrap();
    child.wait().unwrap();

    let b = Harness::with_config(&toml, upstream.clone()).await;
    let started = Instant::now();
    b.say("orphan", "still there?").await;
    // B waited for the dead replica's lease to lapse (lease_ms = 1000), no longer.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        b.transcript("orphan").await,
        ["user: count", "user: still there?", "assistant: reply 2"]
    );
}

/// The `key_prefix` in a config from `shared`.
fn prefix_of(config: &str) -> String {
    let at = config.find("key_prefix = \"").unwrap() + "key_prefix = \"".len();
    config[at..].split('"').next().unwrap().to_owned()
}

/// Keeps a `session_ended` event in storage under `id`, as a run that
/// could not deliver it would have.
async fn keep_event(storage: &recall::store::Storage, id: &str, session: &str) {
    let body = json!({"event": "session_ended", "reason": "ended", "session_id": session,
                      "turn_id": 1, "users": [], "created_at": 1, "ended_at": 2,
                      "system_messages": [], "contents": []})
    .to_string();
    let op = recall::store::Op::KeepEvent {
        id: id.into(),
        body,
    };
    storage.submit(vec![op]).durable().await.unwrap();
}

/// Deliveries per session id, and how many sessions got more than one.
fn tally(hook: &WebhookReceiver) -> (usize, std::collections::BTreeMap<String, usize>) {
    let mut per = std::collections::BTreeMap::new();
    for (_, _, e) in hook.events() {
        *per.entry(e["session_id"].as_str().unwrap().to_owned())
            .or_insert(0) += 1;
    }
    let duplicates = per.values().map(|n| n - 1).sum();
    (duplicates, per)
}

/// Replicas that start while another is sending kept
/// events (its own ends', and an earlier run's) do not send them again.
/// Each replica reads every kept event at start; only the holder of an
/// event's claim sends it, and the others wait for it to go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kept_events_are_sent_once_by_replicas_starting_while_they_are_sent() {
    let Some(config) = shared("") else {
        return;
    };
    const EARLIER: usize = 8;
    const ENDED: usize = 8;
    let upstream = MockUpstream::start().await;
    // A slow receiver, so that deliveries are still under way when the
    // other replicas start.
    let hook = WebhookReceiver::start_slow(0, Duration::from_millis(400)).await;
    let base = format!(
        "{config}\n[[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\n",
        upstream.base_url()
    );
    let with_hook = format!(
        "{base}\n[webhook]\nurl = \"{}\"\nretry_backoff_ms = 50\n",
        hook.url
    );
    // An earlier run's undelivered events (written by a replica without a
    // webhook, which sends nothing).
    let earlier = Harness::with_config(&base, upstream.clone()).await;
    for i in 0..EARLIER {
        keep_event(
            &earlier.app.policy.storage,
            &format!("msg_earlier{i}"),
            &format!("earlier-{i}"),
        )
        .await;
    }
    // Replica A starts (and sends those), then ends sessions of its own:
    // their events are kept too, and sent at once.
    let a = Harness::with_config(&with_hook, upstream.clone()).await;
    for i in 0..ENDED {
        a.say(&format!("ended-{i}"), "hi").await;
    }
    for i in 0..ENDED {
        let (status, _) = a
            .api(Method::DELETE, &format!("/v1/sessions/ended-{i}"), None)
            .await;
        assert_eq!(status, 200);
    }
    let kept_at_start = earlier
        .app
        .policy
        .storage
        .kept_events()
        .await
        .unwrap()
        .len();
    // B and C start while A's deliveries are under way.
    let (b, c) = tokio::join!(
        Harness::with_config(&with_hook, upstream.clone()),
        Harness::with_config(&with_hook, upstream.clone())
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    while tally(&hook).1.len() < EARLIER + ENDED
        || !earlier
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
            "not all delivered: {:?}",
            tally(&hook)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Time for a late second delivery to show (claims last lease_ms = 1 s).
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (duplicates, per) = tally(&hook);
    eprintln!(
        "kept events: {} ({EARLIER} from an earlier run, {ENDED} ended on A), {kept_at_start} still kept \
         when B and C started; deliveries received: {}; distinct events: {}; duplicates: {duplicates}",
        EARLIER + ENDED,
        hook.deliveries().len(),
        per.len()
    );
    assert_eq!(per.len(), EARLIER + ENDED, "{per:?}");
    assert_eq!(duplicates, 0, "{per:?}");
    // An earlier run's event goes out under its stored id.
    for (headers, body) in hook.deliveries() {
        let event: serde_json::Value = serde_json::from_slice(&body).unwrap();
        if let Some(i) = event["session_id"]
            .as_str()
            .unwrap()
            .strip_prefix("earlier-")
        {
            assert_eq!(headers["webhook-id"], format!("msg_earlier{i}").as_str());
        }
    }
    drop((a, b, c));
}

/// A claim on a kept event stops other replicas until it lapses: the claim
/// of a replica that died mid-delivery (written here by hand, as it would
/// have left it) holds a starting replica back for the rest of its time,
/// and then that replica sends the event, once.
#[tokio::test]
async fn a_kept_event_claimed_by_a_dead_replica_is_sent_once_its_claim_lapses() {
    let Some(config) = shared("") else {
        return;
    };
    let prefix = prefix_of(&config);
    let url = std::env::var("RECALL_TEST_REDIS_URL").unwrap();
    let upstream = MockUpstream::start().await;
    let hook = WebhookReceiver::start(0).await;
    let base = format!(
        "{config}\n[[upstreams]]\nname = \"mock\"\nbase_url = \"{}\"\n",
        upstream.base_url()
    );
    let earlier = Harness::with_config(&base, upstream.clone()).await;
    keep_event(&earlier.app.policy.storage, "msg_orphan", "orphan").await;
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let claim = Duration::from_millis(1500);
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}:{{e:msg_orphan}}:claim"))
        .arg("dead-replica:0")
        .arg("PX")
        .arg(claim.as_millis() as u64)
        .query_async(&mut conn)
        .await
        .unwrap();
    let claimed_at = Instant::now();
    let b = Harness::with_config(
        &format!(
            "{base}\n[webhook]\nurl = \"{}\"\nretry_backoff_ms = 50\n",
            hook.url
        ),
        upstream.clone(),
    )
    .await;
    hook.wait_for(Duration::from_secs(8), |e| e["session_id"] == "orphan")
        .await;
    let waited = claimed_at.elapsed();
    assert!(
        waited >= claim - Duration::from_millis(100),
        "sent {waited:?} after the claim was taken, before it lapsed"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(hook.deliveries().len(), 1);
    assert_eq!(hook.deliveries()[0].0["webhook-id"], "msg_orphan");
    assert!(b.app.policy.storage.kept_events().await.unwrap().is_empty());
}

/// A session's lease that is dropped without being released (an error
/// after the claim, a client that left before its turn began) is given up
/// at once, not when it lapses: another replica claims it without waiting.
#[tokio::test]
async fn a_dropped_lease_is_released_at_once() {
    let Some(config) = shared("lease_ms = 30000\n").map(|c| c.replace("lease_ms = 1000\n", ""))
    else {
        return;
    };
    let config = format!("{config}\n[[upstreams]]\nname = \"m\"\nbase_url = \"mock://echo\"\n");
    let config = recall::Config::parse(&config, std::path::Path::new("test.toml")).unwrap();
    let metrics = recall::metrics::Metrics::default();
    let a = recall::store::Storage::open(&config.storage, &metrics)
        .await
        .unwrap();
    let b = recall::store::Storage::open(&config.storage, &metrics)
        .await
        .unwrap();
    let (mut attempted, mut released) = (0, 0);
    for round in 0..20 {
        let id = format!("dropped-{round}");
        let held = a.claim(&id, recall::store::Wait::No).await.unwrap();
        assert!(held.is_some());
        assert!(
            b.claim(&id, recall::store::Wait::No)
                .await
                .unwrap()
                .is_none(),
            "a held lease is not given to another replica"
        );
        attempted += 1;
        drop(held);
        // The release is queued to the writer; give it a moment, far
        // shorter than the 30 s lease.
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            if let Some(claim) = b.claim(&id, recall::store::Wait::No).await.unwrap() {
                released += 1;
                b.release(claim).durable().await.unwrap();
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    eprintln!("dropped leases: attempted {attempted}, released at once {released}");
    assert_eq!(released, attempted);
}

/// A drain that ends after its replica gave the session up writes only
/// what it learnt (the complete original), beside the record: a change
/// another replica made to that record meanwhile (here, what the user
/// heard, from the client's resend) stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_drain_keeps_another_replicas_change_to_the_record() {
    let Some((a, b, upstream)) = pair("[interruption]\ndrain_timeout_secs = 10\n").await else {
        return;
    };
    let pieces = [
        "Why did ",
        "the scarecrow ",
        "win ",
        "an ",
        "award? ",
        "Because ",
        "he was ",
        "outstanding ",
        "in his ",
        "field.",
    ];
    let full: String = pieces.concat();
    upstream.push(sse_text(&pieces, Duration::from_millis(150)));
    let resp = a
        .post_chat(
            "late",
            json!({"model": "m", "stream": true, "messages": [user("joke?")]}),
        )
        .await;
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("the scarecrow") {
        seen.push_str(&String::from_utf8_lossy(
            &stream.next().await.unwrap().unwrap(),
        ));
    }
    // The user heard less than A relayed; B learns it from the resend,
    // while A's drain still reads the rest of the joke.
    let (status, body) = b
        .chat(
            Some("late"),
            json!({"model": "m", "messages": [user("joke?"), assistant("Why"), user("go on")]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let record = wait_for(&b, "late", 1, Duration::from_secs(10), |m| {
        m["metadata"]["original_complete"] == true
    })
    .await;
    assert_eq!(record["metadata"]["original"], full.as_str(), "{record}");
    assert_eq!(
        record["content"], "Why",
        "the drain replaced what B stored of the record: {record}"
    );
    assert_eq!(record["metadata"]["interrupted"], true);
    let (_, hist) = a.history("late").await;
    assert_eq!(hist["contents"][1]["content"], "Why", "{hist}");
}

/// A replica whose lease lapsed while it worked (a stall, a partition:
/// here the lease is taken from it by hand) does not write its turn over
/// the turns of the replica that took the session over: its write expects
/// the version it read, finds another, and is refused; its client is told
/// the turn was not stored, and the replica serves the session again from
/// what storage holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_whose_lease_lapsed_does_not_write_over_the_next_holder() {
    let Some(config) = shared("") else {
        return;
    };
    let upstream = MockUpstream::start().await;
    let toml = with_upstream(&config, &upstream);
    let a = Harness::with_config(&toml, upstream.clone()).await;
    let b = Harness::with_config(&toml, upstream.clone()).await;
    // A third replica reads what storage holds, with nothing in memory.
    let c = Harness::with_config(&toml, upstream.clone()).await;
    let url = std::env::var("RECALL_TEST_REDIS_URL").unwrap();
    let mut redis = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let (mut attempted, mut refused, mut overwritten, mut kept) = (0, 0, 0, 0);
    for round in 0..4 {
        let id = format!("fenced-{round}");
        a.say(&id, "hello").await;
        let meta = format!("{}:{{{id}}}:s", prefix_of(&config));
        let version = |redis: &mut redis::aio::MultiplexedConnection| {
            let (mut redis, meta) = (redis.clone(), meta.clone());
            async move {
                let v: Option<u64> = redis::cmd("HGET")
                    .arg(&meta)
                    .arg("version")
                    .query_async(&mut redis)
                    .await
                    .unwrap();
                v.unwrap_or(0)
            }
        };
        let before = version(&mut redis).await;
        let first = upstream.received().len();
        upstream.push(Reply::Delayed(
            Duration::from_millis(700),
            Box::new(completion("from a, too late")),
        ));
        let slow = {
            let (a_url, id) = (a.url.clone(), id.clone());
            tokio::spawn(async move {
                let resp = reqwest::Client::new()
                    .post(format!("{a_url}/v1/chat/completions"))
                    .header("x-session-id", id)
                    .json(&json!({"model": "m", "messages": [
                        user("hello"), assistant("reply 1"), user("a asks")]}))
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                (status, resp.json::<serde_json::Value>().await.unwrap())
            })
        };
        let t = Instant::now();
        while upstream.received().len() == first {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "A's turn never went upstream"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A's user message is written beside its upstream call, not before
        // it: B is to take over after that write, so that only A's reply
        // meets the fence (B reading before it would meet the fence itself).
        while version(&mut redis).await == before {
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "A's user message was never stored"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // A's lease lapses while its upstream call runs; B takes over.
        let lease = format!("{}:{{{id}}}:lease", prefix_of(&config));
        let taken: i64 = redis::cmd("DEL")
            .arg(&lease)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert_eq!(taken, 1, "A held no lease on {lease}");
        let (status, body) = b
            .chat(
                Some(&id),
                json!({"model": "m", "messages": [user("hello"), assistant("reply 1"), user("b asks")]}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let b_reply = body["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_owned();

        attempted += 1;
        let (status, body) = slow.await.unwrap();
        if status == 503 {
            refused += 1;
            assert_eq!(body["error"]["code"], "storage_unavailable", "{body}");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(message.contains("another replica"), "{message}");
        }
        let stored = c.transcript(&id).await;
        if stored.iter().any(|m| m.contains("too late")) {
            overwritten += 1;
        }
        let b_turn = ["user: b asks".to_owned(), format!("assistant: {b_reply}")];
        if stored.ends_with(&b_turn) {
            kept += 1;
        }
        // A serves the session again from what storage holds.
        let (status, body) = a
            .chat(
                Some(&id),
                json!({"model": "m", "messages": [user("hello"), assistant("reply 1"),
                    user("b asks"), assistant(&b_reply), user("and now?")]}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let stored = c.transcript(&id).await;
        let n = stored.len();
        assert!(n >= 4, "{stored:?}");
        assert_eq!(stored[n - 4..n - 2], b_turn, "{stored:?}");
        assert_eq!(stored[n - 2], "user: and now?", "{stored:?}");
    }
    eprintln!(
        "stale holders' turns: attempted {attempted}, refused {refused}, \
         written over the next holder's {overwritten}; next holder's turns kept {kept}"
    );
    assert_eq!((refused, overwritten, kept), (attempted, 0, attempted));
}

/// A write expects the session it was made on: not another session
/// started under the same id after that one ended, even when the new one
/// has reached the same version (versions count from 0 again).
#[tokio::test]
async fn a_write_for_an_ended_session_does_not_land_in_its_successor() {
    use recall::memory::message::{Message, Role};
    use recall::store::{Meta, Op, Storage};
    use std::sync::Arc;

    let Some(config) = shared("") else {
        return;
    };
    let config = format!("{config}\n[[upstreams]]\nname = \"m\"\nbase_url = \"mock://echo\"\n");
    let config = recall::Config::parse(&config, std::path::Path::new("test.toml")).unwrap();
    let storage = Storage::open(&config.storage, &recall::metrics::Metrics::default())
        .await
        .unwrap();
    let id = "reborn";
    let expect = |version, created_ms| Op::Expect {
        id: id.into(),
        version,
        created_ms,
    };
    let save = |created_ms| Op::Save {
        id: id.into(),
        meta: Box::new(Meta {
            created_ms,
            last_active_ms: created_ms,
            ..Meta::default()
        }),
    };
    let push = |seq, text: &str| Op::Push {
        id: id.into(),
        seq,
        message: Arc::new(Message::new(Role::User, text)),
    };
    let write = |ops: Vec<Op>| storage.submit(ops).durable();
    // The first session, created at 1: two writes, version 2.
    write(vec![expect(0, 1), save(1)]).await.unwrap();
    write(vec![expect(1, 1), push(0, "first")]).await.unwrap();
    // Ended, then started anew at 5 by another replica: version 2 again.
    let end = Op::Delete {
        id: id.into(),
        users: Vec::new(),
    };
    write(vec![expect(2, 1), end]).await.unwrap();
    write(vec![expect(0, 5), save(5)]).await.unwrap();
    write(vec![expect(1, 5), push(0, "second")]).await.unwrap();

    // A replica that still holds the first session writes its next turn.
    let stale = write(vec![expect(2, 1), push(1, "stale")]).await;
    let err = stale.expect_err("a write for the ended session was stored");
    assert!(err.to_string().contains("started anew"), "{err}");
    let stored = storage.load(id).await.unwrap().unwrap();
    let texts: Vec<_> = stored.messages.iter().map(|m| m.content.clone()).collect();
    assert_eq!(texts, [serde_json::json!("second")]);
    assert_eq!((stored.meta.created_ms, stored.version), (5, 2));
}

#[tokio::test]
async fn a_response_chain_and_a_conversation_go_on_from_either_replica() {
    let Some((a, b, upstream)) = pair("").await else {
        return;
    };
    let r1 = a.respond_ok(json!({"model": "m", "input": "one"})).await;
    let r2 = b
        .respond_ok(json!({"model": "m", "input": "two", "previous_response_id": r1["id"]}))
        .await;
    let r3 = a
        .respond_ok(json!({"model": "m", "input": "three", "previous_response_id": r2["id"]}))
        .await;
    assert_eq!(
        upstream.last().transcript(),
        [
            "user: one",
            "assistant: reply 1",
            "user: two",
            "assistant: reply 2",
            "user: three"
        ]
    );
    // A fork made on B from a response A answered.
    b.respond_ok(
        json!({"model": "m", "input": "two, otherwise", "previous_response_id": r1["id"]}),
    )
    .await;
    assert_eq!(
        upstream.last().transcript(),
        ["user: one", "assistant: reply 1", "user: two, otherwise"]
    );
    let path = format!("/v1/responses/{}", r3["id"].as_str().unwrap());
    let (status, got) = b.api(Method::GET, &path, None).await;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["output"][0]["content"][0]["text"], "reply 3");

    let (_, c) = a
        .api(
            Method::POST,
            "/v1/conversations",
            Some(json!({"metadata": {"k": "v"}})),
        )
        .await;
    let id = c["id"].as_str().unwrap();
    b.respond_ok(json!({"model": "m", "input": "hi", "conversation": id}))
        .await;
    let (_, c) = b
        .api(Method::GET, &format!("/v1/conversations/{id}"), None)
        .await;
    assert_eq!(c["metadata"], json!({"k": "v"}));
    let (_, items) = a
        .api(Method::GET, &format!("/v1/conversations/{id}/items"), None)
        .await;
    assert_eq!(items["data"].as_array().unwrap().len(), 2, "{items}");
}
