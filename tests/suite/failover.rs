//! Redis Cluster failover under two recall replicas: a forced
//! failover of a replica that lags behind its master, a master killed
//! (-9), a master paused. Each test starts its own 6-node cluster (3
//! masters with a replica each, AOF on) and drives sessions' turns on
//! alternating replicas, as `redis_faults.rs` does, and reports what it
//! saw: attempted, acknowledged, refused, found, lost, duplicated, and
//! the fault window's p50/p99 for the sessions on the faulty node and for
//! the others.
//!
//! Run with `RECALL_TEST_BACKEND=redis`, like `redis_faults.rs`.

use crate::common;
use crate::redis_faults::{
    barge_in_across, drive, enabled, ms, replica_config, slow_replies, tally, wait_acks, Cluster,
    Log, Scratch,
};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const SESSIONS: usize = 12;

/// Two replicas of recall on `cluster`, with `[storage]` lines added.
async fn two_on(
    cluster: &Cluster,
    prefix: &str,
    upstream: &MockUpstream,
    storage: &str,
) -> (Arc<Harness>, Arc<Harness>) {
    let toml = replica_config(&cluster.url(), prefix, upstream)
        .replace("lease_ms = 1000\n", &format!("lease_ms = 1000\n{storage}"));
    let a = Arc::new(Harness::with_config(&toml, upstream.clone()).await);
    let b = Arc::new(Harness::with_config(&toml, upstream.clone()).await);
    (a, b)
}

/// A load on a cluster of the test's own: two replicas of recall on it
/// (`[storage]` lines `storage` added), and `SESSIONS` clients taking
/// `turns` turns each on alternating replicas, of which 30 have been
/// acknowledged when it returns.
struct Load {
    cluster: Cluster,
    upstream: MockUpstream,
    a: Arc<Harness>,
    b: Arc<Harness>,
    began: Instant,
    clients: Vec<tokio::task::JoinHandle<(String, Log)>>,
    // Last: removed after the cluster's servers are killed.
    _scratch: Scratch,
}

async fn load(prefix: &str, node_timeout_ms: u64, storage: &str, turns: usize) -> Load {
    let scratch = Scratch::new(prefix);
    let cluster = Cluster::start_with(&scratch.0, node_timeout_ms).await;
    let upstream = MockUpstream::start().await;
    slow_replies(&upstream, 4000);
    let (a, b) = two_on(&cluster, prefix, &upstream, storage).await;
    let acks = Arc::new(AtomicUsize::new(0));
    let began = Instant::now();
    let clients = drive(
        [Arc::clone(&a), Arc::clone(&b)],
        prefix,
        SESSIONS,
        turns,
        Arc::clone(&acks),
    );
    wait_acks(&acks, 30).await;
    Load {
        cluster,
        upstream,
        a,
        b,
        began,
        clients,
        _scratch: scratch,
    }
}

/// The sessions whose keys the master on `port` serves.
async fn sessions_on(cluster: &Cluster, prefix: &str, port: u16) -> HashSet<String> {
    let mut on = HashSet::new();
    for s in 0..SESSIONS {
        let id = format!("{prefix}-{s}");
        if cluster.master_and_replica(&id).await.0 == port {
            on.insert(id);
        }
    }
    on
}

/// Waits until `id`'s slot is served by the node on `port`.
async fn wait_master(cluster: &Cluster, id: &str, port: u16, within: Duration) -> Duration {
    let began = Instant::now();
    while cluster.master_and_replica(id).await.0 != port {
        assert!(began.elapsed() < within, "{id} did not move to :{port}");
        tokio::time::sleep(ms(20)).await;
    }
    began.elapsed()
}

/// A field of `INFO replication`.
async fn replication(cluster: &Cluster, port: u16, field: &str) -> String {
    let info = cluster.node(port).cli(&["INFO", "replication"]).await;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_default()
        .trim()
        .to_owned()
}

/// Latency figures of one group of sessions' turns.
#[derive(Debug, Default)]
struct Group {
    turns: usize,
    refused: usize,
    p50: Duration,
    p99: Duration,
    slowest: Duration,
}

impl std::fmt::Display for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} turns, {} refused at least once, p50 {:.0} ms, p99 {:.0} ms, slowest {:.0} ms",
            self.turns,
            self.refused,
            self.p50.as_secs_f64() * 1000.0,
            self.p99.as_secs_f64() * 1000.0,
            self.slowest.as_secs_f64() * 1000.0
        )
    }
}

/// The turns of the sessions `of` picks that overlap `from..to`.
fn group(logs: &[(String, Log)], of: impl Fn(&str) -> bool, from: Instant, to: Instant) -> Group {
    let mut took: Vec<Duration> = Vec::new();
    let mut refused = 0;
    for (session, log) in logs.iter().filter(|(s, _)| of(s)) {
        let _ = session;
        // A turn counts in the window when it overlaps it.
        for t in log
            .turns
            .iter()
            .filter(|t| t.began < to && t.began + t.took > from)
        {
            took.push(t.took);
            refused += usize::from(t.refused > 0);
        }
    }
    took.sort();
    let at = |q: f64| {
        took.get(((took.len() as f64 * q).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    };
    Group {
        turns: took.len(),
        refused,
        p50: at(0.5),
        p99: at(0.99),
        slowest: took.last().copied().unwrap_or_default(),
    }
}

/// For each acknowledged turn, what the upstream was sent with it against
/// what storage held before it: the history read back, up to the turn's
/// message, without superseded messages (a retried turn's first reply).
/// The context sent is the end of that (the window). Returns the turns
/// checked and those sent a context storage did not hold.
async fn stale_contexts(
    upstream: &MockUpstream,
    h: &Harness,
    logs: &[(String, Log)],
) -> (usize, Vec<String>) {
    let pairs = |messages: &[Value]| -> Vec<(String, String)> {
        messages
            .iter()
            .filter(|m| m["role"] == "user" || m["role"] == "assistant")
            .filter(|m| m["metadata"]["superseded"] != true)
            .map(|m| {
                (
                    m["role"].as_str().unwrap_or_default().to_owned(),
                    m["content"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    };
    // The last request of each turn is the one its acknowledgement came from.
    let mut sent: HashMap<String, Vec<(String, String)>> = HashMap::new();
    for r in upstream.turns() {
        let mut m = pairs(r.messages());
        if let Some((role, text)) = m.pop() {
            if role == "user" {
                sent.insert(text, m);
            }
        }
    }
    let mut checked = 0;
    let mut stale = Vec::new();
    for (session, log) in logs {
        let (_, hist) = h.history(session).await;
        let stored = pairs(hist["contents"].as_array().unwrap());
        for t in &log.acked {
            let Some(at) = stored.iter().position(|(r, x)| r == "user" && x == t) else {
                continue; // lost: counted by `tally`
            };
            let before = &stored[..at];
            let context = &sent[t];
            checked += 1;
            if context.len() > before.len() || before[before.len() - context.len()..] != context[..]
            {
                let tail = |v: &[(String, String)]| {
                    v.iter()
                        .rev()
                        .take(3)
                        .map(|(_, x)| x.clone())
                        .collect::<Vec<_>>()
                };
                stale.push(format!(
                    "{session} {t:?}: sent ...{:?}, storage held ...{:?}",
                    tail(context),
                    tail(before)
                ));
            }
        }
    }
    (checked, stale)
}

async fn join(clients: Vec<tokio::task::JoinHandle<(String, Log)>>) -> Vec<(String, Log)> {
    let mut logs = Vec::new();
    for c in clients {
        logs.push(c.await.unwrap());
    }
    logs
}

/// The replica of one master is cut off from it (a wrong `masterauth`,
/// its link killed) while the master takes writes, then promoted by
/// `CLUSTER FAILOVER FORCE`: the old master's writes since the cut are
/// dropped when it rejoins as a replica. Turns written in the meantime
/// wait for the replica (`WAIT`), are refused when it does not answer,
/// and their retries go through after the failover: no acknowledged turn
/// is lost, and every acknowledged turn was sent the context storage held
/// (the sessions whose copies held a dropped write are read again first).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_failover_of_a_lagging_replica_loses_no_acknowledged_turn() {
    if !enabled("a_forced_failover_of_a_lagging_replica") {
        return;
    }
    let turns = 16;
    let Load {
        cluster,
        upstream,
        a,
        b,
        began,
        clients,
        _scratch,
    } = load("lag", 1000, "", turns).await;
    let (master, replica) = cluster.master_and_replica("lag-0").await;
    let replica = replica.expect("a replica");
    let faulty = sessions_on(&cluster, "lag", master).await;

    // Cut the replica off: it cannot resync while the master takes writes.
    let cut_at = Instant::now();
    cut_off(&cluster, replica).await;
    let offset = |port, field| {
        let cluster = &cluster;
        async move {
            replication(cluster, port, field)
                .await
                .parse::<i64>()
                .unwrap_or(0)
        }
    };
    // Let the master take writes the replica does not get.
    tokio::time::sleep(ms(1500)).await;
    let lag =
        offset(master, "master_repl_offset").await - offset(replica, "slave_repl_offset").await;
    let forced_at = Instant::now();
    force_failover(&cluster, "lag-0", master, replica).await;
    let promoted_in = forced_at.elapsed();
    let healed_at = Instant::now();
    let logs = join(clients).await;
    let took = began.elapsed();

    let f = tally(&[&a, &b], &logs, turns).await;
    let (checked, stale) = stale_contexts(&upstream, &a, &logs).await;
    let on = |s: &str| faulty.contains(s);
    let faulty_group = group(&logs, on, cut_at, healed_at);
    let others = group(&logs, |s| !on(s), cut_at, healed_at);
    let baseline = group(&logs, |_| true, began, cut_at);
    eprintln!(
        "forced failover of a lagging replica (:{replica} cut off from :{master} for {:.1} s, {lag} bytes \
         behind, promoted and the old master rejoined in {:.2} s): {} turns attempted in {} requests ({:.1} s), {} acknowledged, \
         {} answers refused (storage_unavailable); found {}, lost {}, duplicated {}; {checked} \
         acknowledged turns' contexts checked, {} stale; fault window: {} sessions on :{master}: {faulty_group}; \
         the other {}: {others}; before the fault, all: {baseline}",
        forced_at.duration_since(cut_at).as_secs_f64(),
        promoted_in.as_secs_f64(),
        f.attempted,
        f.requests,
        took.as_secs_f64(),
        f.acknowledged,
        f.told,
        f.found,
        f.lost,
        f.duplicated,
        stale.len(),
        faulty.len(),
        SESSIONS - faulty.len(),
    );
    assert!(lag > 0, "the replica was not behind when promoted");
    assert!(f.told > 0, "no write waited for the cut-off replica");
    assert_eq!((f.lost, f.duplicated), (0, 0), "acknowledged turns lost");
    assert!(stale.is_empty(), "turns sent a stale context: {stale:#?}");
    assert_eq!(
        f.acknowledged, f.attempted,
        "every turn went through in the end"
    );
    assert_eq!(others.refused, 0, "sessions on other masters were refused");
}

/// A master killed (-9) mid-load: its sessions' turns are refused until
/// its replica is promoted (`cluster-node-timeout`), and then go through;
/// the sessions on the other masters are never refused and do not wait
/// for it, nor does a barge-in across replicas on one of them meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_holds_up_only_its_own_sessions() {
    if !enabled("a_killed_master_holds_up_only_its_own_sessions") {
        return;
    }
    // A node timeout long enough that the dead master's sessions wait
    // clearly longer than any other turn takes.
    let turns = 24;
    let Load {
        mut cluster,
        upstream: _,
        a,
        b,
        began,
        clients,
        _scratch,
    } = load("km", 3000, "timeout_ms = 2000\n", turns).await;
    let (killed, heir) = cluster.master_and_replica("km-0").await;
    let heir = heir.expect("a replica");
    let faulty = sessions_on(&cluster, "km", killed).await;

    // A pair of its own for a barge-in on a session of a healthy master.
    let barge_upstream = MockUpstream::start().await;
    let (c, d) = two_on(&cluster, "kmb", &barge_upstream, "timeout_ms = 2000\n").await;
    let mut barge_id = String::new();
    for k in 0.. {
        barge_id = format!("kmb-{k}");
        if cluster.master_and_replica(&barge_id).await.0 != killed {
            break;
        }
    }

    let killed_at = Instant::now();
    cluster
        .nodes
        .iter_mut()
        .find(|n| n.port == killed)
        .unwrap()
        .kill9();
    // While the master is dead: a barge-in across replicas elsewhere.
    let barge_took = barge_in_across(&barge_upstream, &c, &d, &barge_id).await;
    let dead_during_barge = cluster.master_and_replica("km-0").await.0 == killed;

    let promoted_in = wait_master(&cluster, "km-0", heir, Duration::from_secs(20)).await;
    let fault_end = Instant::now() + Duration::from_millis(500);
    let logs = join(clients).await;
    let took = began.elapsed();

    let f = tally(&[&a, &b], &logs, turns).await;
    let on = |s: &str| faulty.contains(s);
    let faulty_group = group(&logs, on, killed_at, fault_end);
    let others = group(&logs, |s| !on(s), killed_at, fault_end);
    let baseline = group(&logs, |s| !on(s), began, killed_at);
    eprintln!(
        "master :{killed} killed, :{heir} promoted in {:.2} s: {} turns attempted in {} requests ({:.1} s), \
         {} acknowledged, {} answers refused (storage_unavailable); found {}, lost {}, duplicated {}; \
         fault window: {} sessions on :{killed}: {faulty_group}; the other {}: {others} \
         (before the fault: {baseline}); a barge-in across replicas on a healthy master answered in \
         {:.2} s (master still dead: {dead_during_barge})",
        promoted_in.as_secs_f64(),
        f.attempted,
        f.requests,
        took.as_secs_f64(),
        f.acknowledged,
        f.told,
        f.found,
        f.lost,
        f.duplicated,
        faulty.len(),
        SESSIONS - faulty.len(),
        barge_took.as_secs_f64()
    );
    assert_eq!((f.lost, f.duplicated), (0, 0));
    assert_eq!(
        f.acknowledged, f.attempted,
        "every turn went through in the end"
    );
    assert!(!faulty.is_empty() && faulty.len() < SESSIONS);
    assert!(
        faulty_group.refused > 0,
        "the dead master's sessions were never refused"
    );
    assert_eq!(
        others.refused, 0,
        "sessions on healthy masters were refused"
    );
    // Coarse: the dead master's sessions waited for the failover, seconds.
    assert!(
        faulty_group.slowest > Duration::from_secs(2),
        "{faulty_group}"
    );
    assert!(
        others.slowest < Duration::from_millis(1500),
        "sessions on healthy masters waited for the dead one: {others}"
    );
    assert!(barge_took < ms(1000), "the barge-in waited {barge_took:?}");
}

/// One master paused (`CLIENT PAUSE 3000 ALL`) mid-load: its sessions
/// wait for it and go through; the others do not wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_holds_up_only_its_own_sessions() {
    if !enabled("a_paused_master_holds_up_only_its_own_sessions") {
        return;
    }
    let turns = 20;
    let Load {
        cluster,
        upstream: _,
        a,
        b,
        began,
        clients,
        _scratch,
    } = load("pm", 5000, "", turns).await;
    let (paused, _) = cluster.master_and_replica("pm-0").await;
    let faulty = sessions_on(&cluster, "pm", paused).await;
    let paused_at = Instant::now();
    assert_eq!(
        cluster
            .node(paused)
            .cli(&["CLIENT", "PAUSE", "3000", "ALL"])
            .await
            .trim(),
        "OK"
    );
    tokio::time::sleep(ms(3000)).await;
    let fault_end = Instant::now();
    let logs = join(clients).await;
    let took = began.elapsed();

    let f = tally(&[&a, &b], &logs, turns).await;
    let on = |s: &str| faulty.contains(s);
    let faulty_group = group(&logs, on, paused_at, fault_end);
    let others = group(&logs, |s| !on(s), paused_at, fault_end);
    let baseline = group(&logs, |s| !on(s), began, paused_at);
    eprintln!(
        "master :{paused} paused 3 s: {} turns attempted in {} requests ({:.1} s), {} acknowledged, \
         {} answers refused (storage_unavailable); found {}, lost {}, duplicated {}; fault window: \
         {} sessions on :{paused}: {faulty_group}; the other {}: {others} (before the pause: {baseline})",
        f.attempted,
        f.requests,
        took.as_secs_f64(),
        f.acknowledged,
        f.told,
        f.found,
        f.lost,
        f.duplicated,
        faulty.len(),
        SESSIONS - faulty.len(),
    );
    assert_eq!((f.lost, f.duplicated), (0, 0));
    assert_eq!(f.acknowledged, f.attempted);
    assert!(!faulty.is_empty() && faulty.len() < SESSIONS);
    assert!(
        faulty_group.slowest > Duration::from_secs(2),
        "{faulty_group}"
    );
    assert_eq!(others.refused, 0, "sessions on other masters were refused");
    assert!(
        others.slowest < Duration::from_millis(1500),
        "sessions on other masters waited for the paused one: {others}"
    );
}

/// Cuts `replica` off from its master: a wrong `masterauth`, its link
/// killed, so that it cannot resync while the master takes writes.
async fn cut_off(cluster: &Cluster, replica: u16) {
    let r = cluster.node(replica);
    assert_eq!(
        r.cli(&["CONFIG", "SET", "masterauth", "wrong-password"])
            .await
            .trim(),
        "OK"
    );
    r.cli(&["CLIENT", "KILL", "TYPE", "master"]).await;
    let cut_at = Instant::now();
    while replication(cluster, replica, "master_link_status").await != "down" {
        assert!(
            cut_at.elapsed() < Duration::from_secs(5),
            "the link stayed up"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

/// Promotes `replica` (`CLUSTER FAILOVER FORCE`), and waits until the old
/// master rejoins as its replica, dropping the writes it had that the new
/// master has not.
async fn force_failover(cluster: &Cluster, id: &str, master: u16, replica: u16) {
    let r = cluster.node(replica);
    assert_eq!(r.cli(&["CLUSTER", "FAILOVER", "FORCE"]).await.trim(), "OK");
    wait_master(cluster, id, replica, Duration::from_secs(10)).await;
    r.cli(&["CONFIG", "SET", "masterauth", ""]).await;
    let rejoin = Instant::now();
    while replication(cluster, master, "master_link_status").await != "up" {
        assert!(
            rejoin.elapsed() < Duration::from_secs(20),
            "the old master did not rejoin"
        );
        tokio::time::sleep(ms(50)).await;
    }
}

/// With `min_replicas = 0` (acknowledged before the replica has it), a
/// turn written through replica A is lost in a forced failover; B's next
/// turn brings the session back to the version A's lost write had. A's
/// next turn must still see B's turn and not its own lost one: the write
/// id in the fence tells the two writes apart, and A reloads the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lost_in_a_failover_is_not_served_from_a_replicas_copy() {
    if !enabled("a_write_lost_in_a_failover_is_not_served") {
        return;
    }
    let scratch = Scratch::new("stale");
    let cluster = Cluster::start_with(&scratch.0, 1000).await;
    let upstream = MockUpstream::start().await;
    let (a, b) = two_on(&cluster, "st", &upstream, "min_replicas = 0\n").await;
    let id = "st-0";
    a.say(id, "first, through A").await;
    b.say(id, "second, through B").await;
    let (master, replica) = cluster.master_and_replica(id).await;
    let replica = replica.expect("a replica");
    cut_off(&cluster, replica).await;
    a.say(id, "lost, through A").await;
    force_failover(&cluster, id, master, replica).await;
    let (_, hist) = b.history(id).await;
    assert!(
        !hist.to_string().contains("lost, through A"),
        "the failover kept the write: nothing to test: {hist}"
    );

    b.say(id, "third, through B").await;
    let sent_b = upstream.last();
    a.say(id, "fourth, through A").await;
    let sent_a = upstream.last();
    let said = |r: &Received| -> Vec<String> {
        r.messages()
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| m["content"].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    eprintln!(
        "a write lost in a failover: B sent {:?}; A sent {:?}",
        said(&sent_b),
        said(&sent_a)
    );
    assert_eq!(
        said(&sent_b),
        ["first, through A", "second, through B", "third, through B"]
    );
    assert_eq!(
        said(&sent_a),
        [
            "first, through A",
            "second, through B",
            "third, through B",
            "fourth, through A"
        ],
        "A served its copy holding the lost write"
    );
    let (_, hist) = a.history(id).await;
    let users: Vec<&str> = hist["contents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_str())
        .collect();
    assert_eq!(users, said(&sent_a));
}

/// With the replica cut off and `min_replicas` at its default (1, the
/// cluster has replicas), a turn is not acknowledged: a 503 that names the
/// node and says the write reached it but not its replica, counted in
/// `recall_storage_not_replicated_total`; once the replica is back, the
/// retry goes through and the history holds the turn once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_its_replica_did_not_take_is_refused_honestly() {
    if !enabled("a_write_its_replica_did_not_take") {
        return;
    }
    let scratch = Scratch::new("notrep");
    let cluster = Cluster::start_with(&scratch.0, 1000).await;
    let upstream = MockUpstream::start().await;
    let (a, _b) = two_on(&cluster, "nr", &upstream, "replica_ack_timeout_ms = 300\n").await;
    let id = "nr-0";
    a.say(id, "before the cut").await;
    let (master, replica) = cluster.master_and_replica(id).await;
    let replica = replica.expect("a replica");
    cut_off(&cluster, replica).await;
    let began = Instant::now();
    let body = json!({"model": "m", "messages": [user("during the cut")]});
    let (status, answer) = a.chat(Some(id), body.clone()).await;
    let waited = began.elapsed();
    eprintln!("a write its replica did not take: {status} after {waited:?}: {answer}");
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "storage_unavailable");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!(
            "Redis node 127.0.0.1:{master} took this write, but only 0 of the 1 replicas"
        )),
        "{message}"
    );
    assert!(waited >= ms(300), "it did not wait for the replica");
    let metrics = a
        .client
        .get(format!("{}/metrics", a.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("recall_storage_not_replicated_total 1"),
        "{metrics}"
    );

    // The replica back: the retry goes through, and the turn is stored once.
    cluster
        .node(replica)
        .cli(&["CONFIG", "SET", "masterauth", ""])
        .await;
    let back = Instant::now();
    while replication(&cluster, replica, "master_link_status").await != "up" {
        assert!(
            back.elapsed() < Duration::from_secs(10),
            "the replica did not resync"
        );
        tokio::time::sleep(ms(20)).await;
    }
    let (status, answer) = a.chat(Some(id), body).await;
    assert_eq!(status, 200, "{answer}");
    let users: Vec<String> = a
        .transcript(id)
        .await
        .into_iter()
        .filter(|l| l.starts_with("user: "))
        .collect();
    assert_eq!(users, ["user: before the cut", "user: during the cut"]);
}

/// Writes send the script's SHA (`EVALSHA`), not its body; a node that
/// lost it (`SCRIPT FLUSH`, as a restart or a promoted replica would) gets
/// it again, and the turn goes through whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_send_the_scripts_sha_and_load_it_where_it_is_missing() {
    if !enabled("writes_send_the_scripts_sha") {
        return;
    }
    let scratch = Scratch::new("sha");
    let port = crate::redis_faults::free_ports(6600, 1)[0];
    let server = crate::redis_faults::RedisServer::start(
        port,
        &scratch.0,
        &["--save", "", "--appendonly", "no"],
    )
    .await;
    let upstream = MockUpstream::start().await;
    let toml = replica_config(&server.url(), "sha", &upstream);
    let h = Harness::with_config(&toml, upstream.clone()).await;
    for t in 0..10 {
        h.say("sha-0", &format!("turn {t}")).await;
    }
    let calls = |stats: &str, cmd: &str| -> u64 {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    let stats = server.cli(&["INFO", "commandstats"]).await;
    let (evalsha, eval) = (calls(&stats, "evalsha"), calls(&stats, "eval"));
    let input: u64 = server
        .cli(&["INFO", "stats"])
        .await
        .lines()
        .find_map(|l| l.strip_prefix("total_net_input_bytes:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    eprintln!(
        "10 turns: {evalsha} EVALSHA, {eval} EVAL (lease releases), {input} bytes sent to Redis"
    );
    assert!(evalsha >= 20, "each turn's writes by SHA: {stats}");
    assert_eq!(server.cli(&["SCRIPT", "FLUSH"]).await.trim(), "OK");
    h.say("sha-0", "after the flush").await;
    let said: Vec<String> = h
        .transcript("sha-0")
        .await
        .into_iter()
        .filter(|l| l.starts_with("user: "))
        .collect();
    assert_eq!(said.len(), 11);
    assert_eq!(said[10], "user: after the flush");
}
