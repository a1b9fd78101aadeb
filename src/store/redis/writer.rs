//! The writer task: each round sends what has queued up, with a MULTI/EXEC
//! per session, and learns the new version of every session it wrote.
//!
//! The indexes that span sessions (ids, activity, users' sets, kept
//! events) live in other slots than a session's keys, so they are written
//! by single-key commands outside the session's transaction, in an order
//! that errs towards an index naming too much, never too little:
//! - additions (a new or active session, a kept event) go before the
//!   session's transaction. A failure between the two leaves an index
//!   naming a session that is not stored (readers skip it; the sweeper's
//!   idle scan drops it) or an event kept for a session that is not
//!   deleted (it is sent, as it would have been anyway);
//! - removals (a deleted session) go after the transaction, and only if it
//!   went through. A failure between the two leaves an index naming a
//!   deleted session, which readers skip and the sweeper drops; a session
//!   missing from an index (an addition lost some other way) is added
//!   again by its next write.
//!
//! With one Redis the additions and the transactions go in one pipeline
//! (one round trip); with a cluster, the additions first, then each
//! session's transaction to its own node, all at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use prometheus_client::metrics::histogram::Histogram;
use redis::{Cmd, Pipeline, Value};
use tokio::sync::mpsc;

use super::conn::Conn;
use super::keys::{bucket, Keys};
use super::{BUMP, RELEASE, SET_IF_STORED, SET_LATE_IF_STORED};
use crate::memory::message::Message;
use crate::store::{Batch, Faults, Fences, Op, StorageError};

/// Batches larger than this are split, to bound one transaction's size.
const MAX_BATCH_OPS: usize = 2048;

/// What the writer task holds.
pub(super) struct Writer {
    pub conn: Conn,
    pub keys: Keys,
    pub known: Arc<DashMap<String, u64>>,
    pub writes: Histogram,
    pub fences: Arc<Fences>,
    pub faults: Arc<Faults>,
}

pub(super) async fn write_loop(mut w: Writer, mut rx: mpsc::UnboundedReceiver<Batch>) {
    while let Some(first) = rx.recv().await {
        while w.faults.is_paused() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let (batches, ops) = crate::store::gather(first, &mut rx, MAX_BATCH_OPS);
        let started = std::time::Instant::now();
        let results = apply_round(&mut w, &batches).await;
        w.writes.observe(started.elapsed().as_secs_f64());
        crate::store::settle("redis", ops, &w.fences, batches, results);
    }
}

/// One transaction of a round: the batches of one session (or one batch
/// that changes no session, a webhook event's), in order.
#[derive(Default)]
struct Unit {
    session: Option<String>,
    batches: Vec<usize>,
    /// Index additions, sent before the transaction.
    pre: Vec<Cmd>,
    /// The transaction (none for a unit without a session) and, after it,
    /// the releases of the session's leases.
    tx: Option<Pipeline>,
    /// Where its EXEC's answer is in the transaction's answers.
    exec_at: usize,
    /// Whether it ends with the session's version bump.
    bumps: bool,
    /// Whether it leaves the session deleted, and the users whose sets
    /// then no longer name it: removals sent after the transaction.
    deleted: bool,
    deleted_users: Vec<String>,
    failed: Option<String>,
}

/// One round. Redis refuses a transaction whole (EXECABORT: out of memory,
/// a bad command), so a session whose transaction fails fails alone; the
/// others are stored.
async fn apply_round(w: &mut Writer, batches: &[Batch]) -> Vec<Result<(), String>> {
    let mut results: Vec<Result<(), String>> = vec![Ok(()); batches.len()];
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
    for unit in &mut units {
        encode(w, unit, batches, &mut results);
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

    // Additions, one command a pipeline (each names its own slot).
    let mut pre: Vec<(usize, Pipeline)> = Vec::new();
    for (u, unit) in units.iter().enumerate() {
        for cmd in &unit.pre {
            let mut p = redis::pipe();
            p.add_command(cmd.clone());
            pre.push((u, p));
        }
    }
    let tx: Vec<(usize, Pipeline)> = units
        .iter_mut()
        .enumerate()
        .filter_map(|(u, unit)| unit.tx.take().map(|p| (u, p)))
        .collect();
    let (pre_answers, tx_answers) = match &w.conn {
        Conn::Single(_) => {
            let all: Vec<Pipeline> = pre
                .iter()
                .chain(&tx)
                .map(|(_, p)| p.clone())
                .chain(lone_releases)
                .collect();
            let mut answers = w.conn.run(&all).await;
            let rest = answers.split_off(pre.len().min(answers.len()));
            (answers, rest)
        }
        Conn::Cluster(_) => {
            let pipes: Vec<Pipeline> = pre.iter().map(|(_, p)| p.clone()).collect();
            let pre_answers = w.conn.run(&pipes).await;
            for ((u, _), a) in pre.iter().zip(&pre_answers) {
                if let Some(e) = failure(a) {
                    units[*u].failed.get_or_insert(e);
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
            (pre_answers, w.conn.run(&pipes).await)
        }
    };
    for ((u, _), a) in pre.iter().zip(&pre_answers) {
        if let Some(e) = failure(a) {
            units[*u].failed.get_or_insert(e);
        }
    }
    for ((u, _), a) in tx.iter().zip(&tx_answers) {
        let unit = &mut units[*u];
        if unit.failed.is_some() {
            continue;
        }
        let outcome = match a {
            Err(e) => Err(format!("{e}")),
            Ok(answers) => match answers.get(unit.exec_at) {
                Some(Value::Array(items)) => match items.iter().find_map(server_error) {
                    Some(e) => Err(e),
                    None => Ok(items.last().cloned()),
                },
                Some(other) => {
                    Err(server_error(other).unwrap_or_else(|| "transaction aborted".into()))
                }
                None => Err("no answer to the transaction".into()),
            },
        };
        match outcome {
            Ok(last) => {
                if let Some(id) = unit.session.as_deref() {
                    learn_version(w, id, batches, unit, last.as_ref());
                }
            }
            Err(e) => unit.failed = Some(e),
        }
    }

    // Removals, for the sessions whose deletion went through.
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
    for a in w.conn.run(&post).await {
        if let Some(e) = failure(&a) {
            // Left naming a deleted session: readers skip it.
            tracing::warn!(error = %e, "could not drop a deleted session from an index");
        }
    }

    for unit in &units {
        if let Some(e) = &unit.failed {
            tracing::error!(error = %e, session = ?unit.session, "redis write failed");
            for &i in &unit.batches {
                results[i] = Err(format!("redis: {e}"));
            }
        }
    }
    results
}

fn one(cmd: &mut Cmd) -> Pipeline {
    let mut p = redis::pipe();
    p.add_command(cmd.clone());
    p
}

/// A pipeline's failure: the call's, or a server error among its answers.
fn failure(a: &Result<Vec<Value>, redis::RedisError>) -> Option<String> {
    match a {
        Err(e) => Some(format!("{e}")),
        Ok(values) => values.iter().find_map(server_error),
    }
}

/// Encodes a unit's batches: its additions and its transaction.
fn encode(w: &Writer, unit: &mut Unit, batches: &[Batch], results: &mut [Result<(), String>]) {
    // A fenced session's batches are refused up to one that lifts the
    // fence; the rest go in its transaction.
    let mut fenced = unit
        .session
        .as_deref()
        .is_some_and(|id| w.fences.contains(id));
    let mut sent = Vec::new();
    for &i in &unit.batches {
        let b = &batches[i];
        if fenced && !b.lifts_fence() {
            results[i] = w
                .fences
                .admits(b)
                .and(Err("an earlier write failed".into()));
            continue;
        }
        fenced = false;
        sent.push(i);
    }
    unit.batches = sent;
    if unit.batches.is_empty() {
        return;
    }
    let mut tx = redis::pipe();
    tx.cmd("MULTI");
    let mut changed = false;
    for i in unit.batches.clone() {
        let b = &batches[i];
        let mut pre = Vec::new();
        for op in &b.ops {
            match queue(&mut tx, &mut pre, unit, &w.keys, op) {
                Ok(changes) => changed |= changes,
                Err(e) => {
                    // Not half a batch: the transaction is aborted.
                    tracing::error!(error = %e, "a change could not be encoded");
                    tx.cmd("HSET")
                        .arg(w.keys.poison(id_of(unit), "unencodable"));
                }
            }
        }
        if w.faults.batch_fails(b) {
            // A command Redis refuses while queuing: EXEC then aborts the
            // whole transaction, as it does for an out-of-memory. Nothing
            // of the batch is written, its additions neither.
            tx.cmd("HSET")
                .arg(w.keys.poison(id_of(unit), "injected-fault"));
            if unit.session.is_none() {
                unit.failed = Some("injected fault".into());
            }
            continue;
        }
        unit.pre.extend(pre);
    }
    let Some(id) = unit.session.clone() else {
        // A webhook event's batch: single-key commands, no transaction.
        return;
    };
    if changed {
        tx.cmd("EVAL").arg(BUMP).arg(1).arg(w.keys.meta(&id));
        unit.bumps = true;
    }
    tx.cmd("EXEC");
    unit.exec_at = tx.len() - 1;
    unit.tx = Some(tx);
}

fn id_of(unit: &Unit) -> &str {
    unit.session.as_deref().unwrap_or("events")
}

fn server_error(v: &Value) -> Option<String> {
    match v {
        Value::ServerError(e) => Some(format!("{e:?}")),
        _ => None,
    }
}

/// After a session's transaction went through: the version it left.
fn learn_version(w: &Writer, id: &str, batches: &[Batch], unit: &Unit, last: Option<&Value>) {
    let deleted = unit
        .batches
        .iter()
        .flat_map(|&i| &batches[i].ops)
        .any(|op| matches!(op, Op::Delete { .. }));
    if deleted {
        w.known.remove(id);
    }
    if !unit.bumps {
        return;
    }
    let version = match last {
        Some(Value::Int(v)) => *v as u64,
        _ => 0,
    };
    // One bump past what this replica knew: nobody else wrote. Anything
    // else: another replica did, and the local copy must be reloaded.
    match w.known.get(id).map(|v| *v) {
        Some(before) if before + 1 == version => {
            w.known.insert(id.to_owned(), version);
        }
        // Created by this replica in this round.
        None if version == 1 => {
            w.known.insert(id.to_owned(), version);
        }
        _ => {
            w.known.remove(id);
        }
    }
}

/// Queues one op: the session's own commands in its transaction, index
/// additions in `pre`, removals noted on the unit. Whether it changes the
/// session's data (and so bumps its version).
fn queue(
    tx: &mut Pipeline,
    pre: &mut Vec<Cmd>,
    unit: &mut Unit,
    keys: &Keys,
    op: &Op,
) -> Result<bool, StorageError> {
    let indexed = |pre: &mut Vec<Cmd>, id: &str, last_active_ms: i64| {
        let b = bucket(id);
        pre.push(redis::cmd("ZADD").arg(keys.ids(b)).arg(0).arg(id).clone());
        pre.push(
            redis::cmd("ZADD")
                .arg(keys.active(b))
                .arg(last_active_ms)
                .arg(id)
                .clone(),
        );
    };
    match op {
        Op::Save { id, meta } => {
            let users = serde_json::to_string(&meta.users).unwrap_or_else(|_| "[]".into());
            let system =
                serde_json::to_string(&meta.system_messages).unwrap_or_else(|_| "[]".into());
            tx.cmd("HSET")
                .arg(keys.meta(id))
                .arg("created_ms")
                .arg(meta.created_ms)
                .arg("last_active_ms")
                .arg(meta.last_active_ms)
                .arg("turn_id")
                .arg(meta.turn_id)
                .arg("first_seq")
                .arg(meta.first_seq)
                .arg("users")
                .arg(users)
                .arg("system_messages")
                .arg(system);
            indexed(pre, id, meta.last_active_ms);
            for user in &meta.users {
                pre.push(redis::cmd("SADD").arg(keys.user(user)).arg(id).clone());
            }
            unit.deleted = false;
            unit.deleted_users.retain(|u| !meta.users.contains(u));
            Ok(true)
        }
        Op::Touch {
            id,
            created_ms,
            last_active_ms,
            turn_id,
            first_seq,
        } => {
            // Every field a load needs, so that the session can be loaded
            // whatever became of its Save; `created_ms` only if missing.
            tx.cmd("HSETNX")
                .arg(keys.meta(id))
                .arg("created_ms")
                .arg(*created_ms);
            tx.cmd("HSET")
                .arg(keys.meta(id))
                .arg("last_active_ms")
                .arg(*last_active_ms)
                .arg("turn_id")
                .arg(*turn_id)
                .arg("first_seq")
                .arg(*first_seq);
            indexed(pre, id, *last_active_ms);
            unit.deleted = false;
            Ok(true)
        }
        Op::Push { id, seq, message } => {
            tx.cmd("HSET")
                .arg(keys.messages(id))
                .arg(*seq)
                .arg(to_json(message)?);
            Ok(true)
        }
        Op::Set { id, seq, message } => {
            tx.cmd("EVAL")
                .arg(SET_IF_STORED)
                .arg(1)
                .arg(keys.messages(id))
                .arg(*seq)
                .arg(to_json(message)?);
            Ok(true)
        }
        Op::SetLate { id, seq, message } => {
            let late = crate::memory::interruption::late_fields(message);
            tx.cmd("EVAL")
                .arg(SET_LATE_IF_STORED)
                .arg(2)
                .arg(keys.messages(id))
                .arg(keys.late(id))
                .arg(*seq)
                .arg(serde_json::Value::Object(late).to_string());
            Ok(true)
        }
        Op::DropBefore { id, from, seq } => {
            if seq > from {
                let gone: Vec<u64> = (*from..*seq).collect();
                tx.cmd("HDEL").arg(keys.messages(id)).arg(&gone);
                tx.cmd("HDEL").arg(keys.late(id)).arg(&gone);
            }
            Ok(true)
        }
        Op::Clear { id } => {
            tx.cmd("DEL").arg(keys.messages(id)).arg(keys.late(id));
            Ok(true)
        }
        Op::Delete { id, users } => {
            tx.cmd("DEL")
                .arg(keys.meta(id))
                .arg(keys.messages(id))
                .arg(keys.late(id));
            unit.deleted = true;
            unit.deleted_users.extend(users.iter().cloned());
            Ok(false)
        }
        // Handled by the round: after the transactions, or by the fences.
        Op::Release { .. } | Op::Resume { .. } => Ok(false),
        Op::KeepEvent { id, body } => {
            pre.push(
                redis::cmd("HSET")
                    .arg(keys.undelivered(bucket(id)))
                    .arg(id)
                    .arg(body)
                    .clone(),
            );
            Ok(false)
        }
        Op::ForgetEvent { id } => {
            pre.push(
                redis::cmd("HDEL")
                    .arg(keys.undelivered(bucket(id)))
                    .arg(id)
                    .clone(),
            );
            Ok(false)
        }
    }
}

fn to_json(message: &Message) -> Result<String, StorageError> {
    serde_json::to_string(message).map_err(|e| StorageError::Corrupt(e.to_string()))
}
