//! The writer task: it sends what has queued up in rounds, one script
//! call per session (`encode.rs`), and learns the new version of every
//! session it wrote.
//!
//! Rounds go to one Redis node each, and each node has at most one round
//! in flight, so that a node that is dead, paused or failing over holds
//! up only the sessions whose keys it serves: the others' rounds go to
//! their own nodes meanwhile. A session's batches are written in order:
//! one of its batches waits while an earlier one is in flight, wherever
//! the slot map sends it. A flush (a batch of no ops) resolves once every
//! batch queued before it is settled, or, for a flush of one key (a
//! session read back, a note), every such batch of that key.
//!
//! When the deployment has replicas, a round's writes count once
//! `min_replicas` of the node's replicas have them (`WAIT`): a write a
//! failover could still lose is answered as not replicated, never as
//! stored.
//!
//! The indexes that span sessions (ids, activity, users' sets, kept
//! events) live in other slots than a session's keys, so they are written
//! by single-key commands outside the session's script, in an order
//! that errs towards an index naming too much:
//! - kept events go before the session's script. A failure between the
//!   two leaves an event kept for a session that is not deleted (it is
//!   sent, as it would have been anyway);
//! - index additions (a new or active session, a user who joined it) go
//!   before the script on one Redis, in the same pipeline. On a cluster
//!   their node may be another than the session's, and a fault there must
//!   not hold up the session's turn: they go beside the script, the round
//!   waits for them only a moment (`INDEX_GRACE`, so that a session read
//!   in a list right after its first turn is there), and they are tried
//!   again a few times when they fail. A session missing from an index
//!   meanwhile is added again by its next write;
//! - removals (a deleted session) go after the script, and only if it
//!   went through, not waited for. A failure leaves an index naming a
//!   deleted session, which readers skip and the sweeper drops.
//!
//! With one Redis a round's additions and scripts go in one pipeline (one
//! round trip); with a cluster, kept events first, then each session's
//! script to its own node, all at once.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use redis::{Cmd, Pipeline, Value};
use tokio::sync::mpsc;

use super::conn::{describe, Pool};
use super::encode::{encode, Unit};
use super::keys::{bucket, Keys};
use super::{Stamp, RELEASE};
use crate::{Batch, Faults, Fences, Op, Outcome, Refused};

/// Batches larger than this are split, to bound one script call's size.
const MAX_BATCH_OPS: usize = 2048;

/// How often an index addition beside a session's script is tried, and
/// the wait before the first retry (doubled each time).
const ASIDE_TRIES: u32 = 5;
const ASIDE_RETRY: Duration = Duration::from_millis(500);

/// How long a cluster round waits for its index additions after its
/// scripts are done: they go at the same time, so on a healthy cluster
/// they are done too; a node that does not answer costs this, not a turn.
const INDEX_GRACE: Duration = Duration::from_millis(50);

/// What the writer task holds.
pub(super) struct Writer {
    pub pool: Pool,
    pub keys: Keys,
    pub known: Arc<DashMap<String, Stamp>>,
    /// The id of this writer's next session write (`Stamp::wid`): random
    /// per replica, then counted, so that no two writes share one.
    pub next_wid: AtomicU64,
    /// How many replicas must have a session's writes before they count
    /// as stored (`WAIT`), and for how long to wait for them.
    pub min_replicas: Replicas,
    pub replica_ack_timeout_ms: u64,
    pub writes: Histogram,
    pub not_replicated: Counter,
    pub fences: Arc<Fences>,
    pub faults: Arc<Faults>,
}

/// How many of its node's replicas a write must reach before it counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Replicas {
    /// This many, whatever the node (`[storage] min_replicas`, or, for one
    /// Redis, 1 when it had a replica at start).
    Exactly(u32),
    /// A cluster's default: 1 when the node's master has a working replica
    /// in the cluster's table (one cut off from it still counts, so its
    /// writes wait) or a failover is under way, else 0 (a shard whose
    /// replica was promoted after its master died has none to wait for
    /// until another joins). See `Pool::has_replica`.
    OneIfAny,
}

impl Writer {
    /// How many replicas a write to `key`'s node must reach.
    fn needed(&self, key: &str) -> u32 {
        match self.min_replicas {
            Replicas::Exactly(n) => n,
            Replicas::OneIfAny => u32::from(self.pool.has_replica(key).unwrap_or(false)),
        }
    }
}

/// What is in flight: the nodes with a round, the sessions of those
/// rounds, and every batch not yet settled (by sequence number: its owner
/// and the key that routes it), for flushes.
#[derive(Default)]
struct Flights {
    nodes: HashSet<String>,
    sessions: HashSet<String>,
    unsettled: BTreeMap<u64, (Option<String>, String)>,
}

impl Flights {
    /// Whether a flush queued as `seq` may resolve: no earlier batch it
    /// waits for is unsettled.
    fn flushed(&self, seq: u64, after: Option<&str>) -> bool {
        let mut earlier = self.unsettled.range(..seq);
        match after {
            None => earlier.next().is_none(),
            Some(key) => {
                !earlier.any(|(_, (owner, route))| owner.as_deref() == Some(key) || route == key)
            }
        }
    }
}

/// A round that has settled.
struct Landed {
    node: String,
    sessions: Vec<String>,
    seqs: Vec<u64>,
}

/// Tells the dispatcher a round is over even if its task panics, so that
/// its node and sessions are not held for ever.
struct Landing(Option<(Landed, mpsc::UnboundedSender<Landed>)>);

impl Drop for Landing {
    fn drop(&mut self) {
        if let Some((landed, tx)) = self.0.take() {
            let _ = tx.send(landed);
        }
    }
}

pub(super) async fn write_loop(w: Writer, mut rx: mpsc::UnboundedReceiver<Batch>) {
    let w = Arc::new(w);
    let (landed_tx, mut landed_rx) = mpsc::unbounded_channel::<Landed>();
    let mut queue: VecDeque<(u64, Batch)> = VecDeque::new();
    let mut flights = Flights::default();
    let mut next_seq = 0u64;
    let mut open = true;
    loop {
        let mut take = |b: Batch, queue: &mut VecDeque<(u64, Batch)>| {
            next_seq += 1;
            if !b.ops.is_empty() {
                let owner = owner(&b).map(str::to_owned);
                flights
                    .unsettled
                    .insert(next_seq, (owner, route(&w.keys, &b)));
            }
            queue.push_back((next_seq, b));
        };
        tokio::select! {
            b = rx.recv(), if open => match b {
                Some(b) => {
                    take(b, &mut queue);
                    while let Ok(b) = rx.try_recv() {
                        take(b, &mut queue);
                    }
                }
                None => open = false,
            },
            Some(l) = landed_rx.recv() => {
                flights.nodes.remove(&l.node);
                for s in &l.sessions {
                    flights.sessions.remove(s);
                }
                for seq in &l.seqs {
                    flights.unsettled.remove(seq);
                }
            }
        }
        while w.faults.is_paused() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        dispatch(&w, &mut queue, &mut flights, &landed_tx);
        if !open && queue.is_empty() && flights.nodes.is_empty() {
            return;
        }
    }
}

/// Starts a round on each node that has none in flight, with the queued
/// batches that may go now, in order; the rest wait.
fn dispatch(
    w: &Arc<Writer>,
    queue: &mut VecDeque<(u64, Batch)>,
    flights: &mut Flights,
    landed: &mpsc::UnboundedSender<Landed>,
) {
    let mut rounds: HashMap<String, (Vec<(u64, Batch)>, usize)> = HashMap::new();
    let mut held: HashSet<String> = HashSet::new();
    let mut rest = VecDeque::new();
    for (seq, b) in queue.drain(..) {
        if b.ops.is_empty() {
            if flights.flushed(seq, b.after.as_deref()) {
                if let Some(done) = b.done {
                    let _ = done.send(Ok(()));
                }
            } else {
                rest.push_back((seq, b));
            }
            continue;
        }
        let owner = owner(&b).map(str::to_owned);
        let node = w.pool.node_of(&route(&w.keys, &b));
        let full = rounds
            .get(&node)
            .is_some_and(|(_, ops)| *ops >= MAX_BATCH_OPS);
        let waits = flights.nodes.contains(&node)
            || full
            || owner
                .as_ref()
                .is_some_and(|s| flights.sessions.contains(s) || held.contains(s));
        if waits {
            held.extend(owner);
            rest.push_back((seq, b));
            continue;
        }
        let round = rounds.entry(node).or_default();
        round.1 += b.ops.len();
        round.0.push((seq, b));
    }
    *queue = rest;
    for (node, (batches, ops)) in rounds {
        let sessions: Vec<String> = batches
            .iter()
            .filter_map(|(_, b)| owner(b).map(str::to_owned))
            .collect();
        let seqs: Vec<u64> = batches.iter().map(|(seq, _)| *seq).collect();
        flights.nodes.insert(node.clone());
        flights.sessions.extend(sessions.iter().cloned());
        let landing = Landing(Some((
            Landed {
                node,
                sessions,
                seqs,
            },
            landed.clone(),
        )));
        let w = Arc::clone(w);
        let batches: Vec<Batch> = batches.into_iter().map(|(_, b)| b).collect();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let results = apply_with_script(&w, &batches).await;
            w.writes.observe(started.elapsed().as_secs_f64());
            crate::settle("redis", ops, &w.fences, batches, results);
            drop(landing);
        });
    }
}

/// The session a batch belongs to: the one whose data it changes, or
/// whose lease it gives up.
fn owner(b: &Batch) -> Option<&str> {
    b.session().or_else(|| {
        b.ops.iter().find_map(|op| match op {
            Op::Release { id, .. } => Some(id.as_str()),
            _ => None,
        })
    })
}

/// A key of the slot a batch is written to, which picks its node.
fn route(keys: &Keys, b: &Batch) -> String {
    if let Some(id) = b.session() {
        return keys.meta(id);
    }
    match b.ops.first() {
        Some(Op::Release { id, .. }) => keys.lease(id),
        Some(Op::SaveNote { user, .. }) => keys.note(user),
        Some(op) => op
            .kept()
            .map(|k| keys.kept(k.what, bucket(k.id)))
            .unwrap_or_default(),
        None => String::new(),
    }
}

/// One round, whose writes name the script by its SHA (`EVALSHA`). A node
/// that does not have it (restarted, promoted, its cache flushed) refuses
/// those writes whole (NOSCRIPT), having run nothing of them: they are
/// sent once more with the script's body, which the node then keeps.
async fn apply_with_script(w: &Writer, batches: &[Batch]) -> Vec<Outcome> {
    let all: Vec<&Batch> = batches.iter().collect();
    let mut results = apply_round(w, &all, false).await;
    let again: Vec<usize> = (0..results.len())
        .filter(
            |&i| matches!(&results[i], Err(Refused::NotStored(why)) if why.contains("NOSCRIPT")),
        )
        .collect();
    if again.is_empty() {
        return results;
    }
    let retried: Vec<&Batch> = again.iter().map(|&i| &batches[i]).collect();
    for (i, r) in again.into_iter().zip(apply_round(w, &retried, true).await) {
        results[i] = r;
    }
    results
}

/// One round. Redis runs a script whole or refuses it (out of memory, a
/// version another replica moved), so a session whose script fails fails
/// alone; the others are stored.
async fn apply_round(w: &Writer, batches: &[&Batch], by_body: bool) -> Vec<Outcome> {
    let mut results: Vec<Outcome> = vec![Ok(()); batches.len()];
    if w.faults.round_fails(batches.len()) {
        return vec![Err("injected fault: the write round failed".into()); batches.len()];
    }
    // Batches by session, in the order sessions first appear; each
    // session's batches keep their order.
    let mut units: Vec<Unit> = Vec::new();
    let mut by_session: HashMap<&str, usize> = HashMap::new();
    let mut releases: Vec<(String, String)> = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        for op in &b.ops {
            if let Op::Release { id, token } = op {
                releases.push((id.clone(), token.clone()));
            }
        }
        let changes = b
            .ops
            .iter()
            .any(|op| !matches!(op, Op::Release { .. } | Op::Resume { .. }));
        let unit = match b.session() {
            Some(id) => *by_session.entry(id).or_insert_with(|| {
                units.push(Unit {
                    session: Some(id.to_owned()),
                    ..Unit::default()
                });
                units.len() - 1
            }),
            None if changes => {
                units.push(Unit::default());
                units.len() - 1
            }
            None => continue,
        };
        units[unit].batches.push(i);
    }
    let how = super::encode::Context {
        keys: &w.keys,
        known: &w.known,
        fences: &w.fences,
        faults: &w.faults,
        by_body,
    };
    for unit in &mut units {
        unit.wid = next_wid(&w.next_wid);
        encode(&how, unit, batches, &mut results);
    }
    // Leases are given up after the writes they covered, whether those
    // were stored or not (the next holder reloads what was), on the
    // session's own node: after its transaction, or alone.
    let mut lone_releases = Vec::new();
    for (id, token) in &releases {
        let mut release = redis::cmd("EVAL");
        release.arg(RELEASE).arg(1).arg(w.keys.lease(id)).arg(token);
        match by_session
            .get(id.as_str())
            .and_then(|&u| units[u].tx.as_mut())
        {
            Some(tx) => {
                tx.add_command(release);
            }
            None => lone_releases.push(one(&mut release)),
        }
    }

    // Index additions: on one Redis before the scripts, on a cluster
    // beside them.
    let mut indexed = None;
    if w.pool.is_cluster() {
        let aside: Vec<Pipeline> = units
            .iter_mut()
            .flat_map(|u| std::mem::take(&mut u.aside))
            .map(|mut c| one(&mut c))
            .collect();
        if !aside.is_empty() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            tokio::spawn(index_aside(w.pool.clone(), aside, tx));
            indexed = Some(rx);
        }
    } else {
        for u in &mut units {
            let aside = std::mem::take(&mut u.aside);
            u.pre.extend(aside);
        }
    }
    // Kept events (and, on one Redis, index additions) before the
    // scripts, one command a pipeline (each names its own slot).
    let mut pre: Vec<(usize, Pipeline)> = Vec::new();
    for (u, unit) in units.iter().enumerate() {
        for cmd in &unit.pre {
            let mut p = redis::pipe();
            p.add_command(cmd.clone());
            pre.push((u, p));
        }
    }
    let mut tx: Vec<(usize, Pipeline)> = units
        .iter_mut()
        .enumerate()
        .filter_map(|(u, unit)| unit.tx.take().map(|p| (u, p)))
        .collect();
    let wait = |n: u32| {
        let mut c = redis::cmd("WAIT");
        c.arg(n).arg(w.replica_ack_timeout_ms);
        c
    };
    // Each session's replicas needed, and how many have its writes.
    let needed: Vec<u32> = units
        .iter()
        .map(|u| w.needed(&unit_key(&w.keys, u, batches)))
        .collect();
    let mut acked: Vec<Option<Result<i64, String>>> = vec![None; units.len()];
    let (pre_answers, tx_answers) = match &w.pool {
        Pool::Single(..) => {
            // One connection: a `WAIT` at the end covers every write
            // before it.
            let most = tx.iter().map(|(u, _)| needed[*u]).max().unwrap_or(0);
            let all: Vec<Pipeline> = pre
                .iter()
                .chain(&tx)
                .map(|(_, p)| p.clone())
                .chain(lone_releases)
                .chain((most > 0).then(|| one(&mut wait(most))))
                .collect();
            let mut answers = w.pool.run(&all).await;
            let mut rest = answers.split_off(pre.len().min(answers.len()));
            if most > 0 {
                let n = match rest.last() {
                    Some(Ok(v)) => replicas_acked(v.first()),
                    Some(Err(e)) => Err(describe(e)),
                    None => Err("gave no answer to WAIT".into()),
                };
                for (u, _) in &tx {
                    acked[*u] = Some(n.clone());
                }
            }
            rest.truncate(tx.len());
            (answers, rest)
        }
        Pool::Cluster(_) => {
            let pipes: Vec<Pipeline> = pre.iter().map(|(_, p)| p.clone()).collect();
            let pre_answers = w.pool.run(&pipes).await;
            for ((u, p), a) in pre.iter().zip(&pre_answers) {
                if let Some(e) = failure(a) {
                    let node = w.pool.node_of_pipe(p);
                    units[*u]
                        .failed
                        .get_or_insert(format!("Redis node {node} {e}"));
                }
            }
            // Each session's `WAIT` on its own node's connection, right
            // after its script.
            for (u, p) in &mut tx {
                if needed[*u] > 0 {
                    p.add_command(wait(needed[*u]));
                }
            }
            // A session whose additions failed is not written at all.
            let pipes: Vec<Pipeline> = tx
                .iter()
                .map(|(u, p)| match units[*u].failed {
                    Some(_) => redis::pipe(),
                    None => p.clone(),
                })
                .chain(lone_releases)
                .collect();
            let mut answers = w.pool.run(&pipes).await;
            answers.truncate(tx.len());
            for ((u, _), a) in tx.iter().zip(&mut answers) {
                if let (true, Ok(values)) = (needed[*u] > 0, a) {
                    acked[*u] = Some(replicas_acked(values.last()));
                    values.pop();
                }
            }
            (pre_answers, answers)
        }
    };
    for ((u, p), a) in pre.iter().zip(&pre_answers) {
        if let Some(e) = failure(a) {
            let node = w.pool.node_of_pipe(p);
            units[*u]
                .failed
                .get_or_insert(format!("Redis node {node} {e}"));
        }
    }
    for ((u, _), a) in tx.iter().zip(&tx_answers) {
        let unit = &mut units[*u];
        if unit.failed.is_some() {
            continue;
        }
        let node = w.pool.node_of(&unit_key(&w.keys, unit, batches));
        let outcome = match a {
            Err(e) => Err(describe(e)),
            Ok(answers) => match answers.first() {
                Some(Value::Array(items)) => Ok(stamp(items)),
                Some(other) => Err(server_error(other)
                    .map(|e| format!("refused the write ({e})"))
                    .unwrap_or_else(|| format!("gave an unexpected answer ({other:?})"))),
                None => Err("gave no answer to the write".into()),
            },
        };
        match outcome {
            Ok(after) => {
                if let Some(id) = unit.session.as_deref() {
                    learn_version(w, id, batches, unit, after);
                }
            }
            Err(e) => unit.failed = Some(format!("Redis node {node} {e}")),
        }
    }

    if let Some(rx) = indexed {
        let _ = tokio::time::timeout(INDEX_GRACE, rx).await;
    }

    // Removals, for the sessions whose deletion went through: not waited
    // for.
    let mut post = Vec::new();
    for unit in &units {
        if let (Some(id), None) = (unit.session.as_deref(), &unit.failed) {
            let b = bucket(id);
            if unit.deleted {
                post.push(one(redis::cmd("ZREM").arg(w.keys.ids(b)).arg(id)));
                post.push(one(redis::cmd("ZREM").arg(w.keys.active(b)).arg(id)));
            }
            for user in &unit.deleted_users {
                post.push(one(redis::cmd("SREM").arg(w.keys.user(user)).arg(id)));
            }
        }
    }
    if !post.is_empty() {
        let pool = w.pool.clone();
        tokio::spawn(async move {
            for a in pool.run(&post).await {
                if let Some(e) = failure(&a) {
                    // Left naming a deleted session: readers skip it.
                    tracing::warn!(error = %e, "could not drop a deleted session from an index");
                }
            }
        });
    }

    let mut failed_any = false;
    for (u, unit) in units.iter().enumerate() {
        let refused = match (&unit.failed, &acked[u]) {
            (Some(e), _) => {
                tracing::error!(error = %e, session = ?unit.session, "redis write failed");
                failed_any = true;
                Refused::NotStored(e.clone())
            }
            (None, Some(Err(why))) => {
                let node = w.pool.node_of(&unit_key(&w.keys, unit, batches));
                tracing::error!(%node, session = ?unit.session, error = %why, "a write's WAIT for replicas failed");
                w.not_replicated.inc();
                Refused::NotReplicated(format!(
                    "Redis node {node} took this write, but waiting for its replica failed \
                     ({why}): the node may be failing over, and may lose it"
                ))
            }
            (None, Some(Ok(n))) if *n < i64::from(needed[u]) => {
                let n = *n;
                let node = w.pool.node_of(&unit_key(&w.keys, unit, batches));
                tracing::error!(
                    %node,
                    session = ?unit.session,
                    replicas = n,
                    needed = needed[u],
                    "a write reached its node but too few of its replicas in time"
                );
                w.not_replicated.inc();
                Refused::NotReplicated(format!(
                    "Redis node {node} took this write, but only {n} of the {} replicas \
                     it needs acknowledged it within {} ms (storage.min_replicas, \
                     storage.replica_ack_timeout_ms), so a failover may still lose it",
                    needed[u], w.replica_ack_timeout_ms
                ))
            }
            (None, _) => continue,
        };
        for &i in &unit.batches {
            results[i] = Err(refused.clone());
        }
    }
    if failed_any {
        w.pool.failed();
    }
    results
}

/// `WAIT`'s answer: how many replicas have the writes before it, or why
/// it failed (a node that turned replica unblocks it with an error).
fn replicas_acked(v: Option<&Value>) -> Result<i64, String> {
    match v {
        Some(Value::Int(n)) => Ok(*n),
        Some(other) => Err(server_error(other).unwrap_or_else(|| format!("{other:?}"))),
        None => Err("no answer".into()),
    }
}

/// A write id, never 0 (which stands for none).
fn next_wid(counter: &AtomicU64) -> u64 {
    loop {
        let wid = counter.fetch_add(1, Ordering::Relaxed);
        if wid != 0 {
            return wid;
        }
    }
}

/// A key of the node a unit was written to, for errors and logs.
fn unit_key(keys: &Keys, unit: &Unit, batches: &[&Batch]) -> String {
    match (&unit.session, unit.batches.first()) {
        (Some(id), _) => keys.meta(id),
        (None, Some(&i)) => route(keys, batches[i]),
        (None, None) => String::new(),
    }
}

/// Sends index additions beside the scripts (`first` told when the first
/// try is over), and tries the failed ones again a few times, in case
/// their node was failing over.
async fn index_aside(
    pool: Pool,
    mut pipes: Vec<Pipeline>,
    first: tokio::sync::oneshot::Sender<()>,
) {
    let mut pause = ASIDE_RETRY;
    let mut first = Some(first);
    for attempt in 1..=ASIDE_TRIES {
        let answers = pool.run(&pipes).await;
        if let Some(tx) = first.take() {
            let _ = tx.send(());
        }
        let mut last = None;
        pipes = pipes
            .into_iter()
            .zip(answers)
            .filter_map(|(p, a)| {
                let e = failure(&a)?;
                last = Some(e);
                Some(p)
            })
            .collect();
        let Some(e) = last else { return };
        if attempt == ASIDE_TRIES {
            tracing::warn!(error = %e, left = pipes.len(), "could not add sessions to an index; their next write adds them");
            return;
        }
        pool.failed();
        tokio::time::sleep(pause).await;
        pause *= 2;
    }
}

fn one(cmd: &mut Cmd) -> Pipeline {
    let mut p = redis::pipe();
    p.add_command(cmd.clone());
    p
}

/// A pipeline's failure: the call's, or a server error among its answers.
fn failure(a: &Result<Vec<Value>, redis::RedisError>) -> Option<String> {
    match a {
        Err(e) => Some(describe(e)),
        Ok(values) => values.iter().find_map(server_error),
    }
}

fn server_error(v: &Value) -> Option<String> {
    match v {
        Value::ServerError(e) => Some(match e.details() {
            Some(details) => format!("{} {details}", e.code()),
            None => e.code().to_owned(),
        }),
        _ => None,
    }
}

/// The script's answer: the session's version, late count and write id
/// after it.
fn stamp(items: &[Value]) -> Stamp {
    let int = |i: usize| match items.get(i) {
        Some(Value::Int(v)) => *v as u64,
        _ => 0,
    };
    let wid = match items.get(2) {
        Some(Value::BulkString(b)) => std::str::from_utf8(b).ok().and_then(|s| s.parse().ok()),
        Some(Value::SimpleString(s)) => s.parse().ok(),
        _ => None,
    };
    Stamp {
        version: int(0),
        wid: wid.unwrap_or(0),
        late: int(1),
    }
}

/// After a session's script ran: what this replica now knows of it. Its
/// own changes on top of what it knew (or of nothing, for a session it
/// creates) keep its copy fresh; anything more is another replica's
/// change, and the copy is read again before it is served.
fn learn_version(w: &Writer, id: &str, batches: &[&Batch], unit: &Unit, after: Stamp) {
    let deleted = unit
        .batches
        .iter()
        .flat_map(|&i| &batches[i].ops)
        .any(|op| matches!(op, Op::Delete { .. }));
    if deleted {
        w.known.remove(id);
        return;
    }
    let before = w
        .known
        .get(id)
        .map(|s| *s)
        .or((unit.expect == Some(0)).then(Stamp::default));
    let fresh = before.is_some_and(|b| {
        unit.expect.unwrap_or(b.version) + unit.bumps == after.version
            && b.late + unit.lates == after.late
    });
    if fresh {
        w.known.insert(id.to_owned(), after);
    } else {
        w.known.remove(id);
    }
}
