//! The writer task: each round sends what has queued up, one script call
//! per session (`encode.rs`), and learns the new version of every session
//! it wrote.
//!
//! The indexes that span sessions (ids, activity, users' sets, kept
//! events) live in other slots than a session's keys, so they are written
//! by single-key commands outside the session's script, in an order
//! that errs towards an index naming too much, never too little:
//! - additions (a new or active session, a kept event) go before the
//!   session's script. A failure between the two leaves an index
//!   naming a session that is not stored (readers skip it; the sweeper's
//!   idle scan drops it) or an event kept for a session that is not
//!   deleted (it is sent, as it would have been anyway);
//! - removals (a deleted session) go after the script, and only if it
//!   went through. A failure between the two leaves an index naming a
//!   deleted session, which readers skip and the sweeper drops; a session
//!   missing from an index (an addition lost some other way) is added
//!   again by its next write.
//!
//! With one Redis the additions and the scripts go in one pipeline (one
//! round trip); with a cluster, the additions first, then each session's
//! script to its own node, all at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use prometheus_client::metrics::histogram::Histogram;
use redis::{Cmd, Pipeline, Value};
use tokio::sync::mpsc;

use super::conn::Conn;
use super::encode::{encode, Unit};
use super::keys::{bucket, Keys};
use super::{Stamp, RELEASE};
use crate::store::{Batch, Faults, Fences, Op};

/// Batches larger than this are split, to bound one script call's size.
const MAX_BATCH_OPS: usize = 2048;

/// What the writer task holds.
pub(super) struct Writer {
    pub conn: Conn,
    pub keys: Keys,
    pub known: Arc<DashMap<String, Stamp>>,
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

/// One round. Redis runs a script whole or refuses it (out of memory, a
/// version another replica moved), so a session whose script fails fails
/// alone; the others are stored.
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
        encode(&w.keys, &w.fences, &w.faults, unit, batches, &mut results);
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
        let outcome =
            match a {
                Err(e) => Err(format!("{e}")),
                Ok(answers) => match answers.first() {
                    Some(Value::Array(items)) => Ok(stamp(items)),
                    Some(other) => Err(server_error(other)
                        .unwrap_or_else(|| format!("unexpected answer {other:?}"))),
                    None => Err("no answer to the write".into()),
                },
            };
        match outcome {
            Ok(after) => {
                if let Some(id) = unit.session.as_deref() {
                    learn_version(w, id, batches, unit, after);
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

fn server_error(v: &Value) -> Option<String> {
    match v {
        Value::ServerError(e) => Some(match e.details() {
            Some(details) => format!("{} {details}", e.code()),
            None => e.code().to_owned(),
        }),
        _ => None,
    }
}

/// The script's answer: the session's version and late count after it.
fn stamp(items: &[Value]) -> Stamp {
    let int = |i: usize| match items.get(i) {
        Some(Value::Int(v)) => *v as u64,
        _ => 0,
    };
    Stamp {
        version: int(0),
        late: int(1),
    }
}

/// After a session's script ran: what this replica now knows of it. Its
/// own changes on top of what it knew (or of nothing, for a session it
/// creates) keep its copy fresh; anything more is another replica's
/// change, and the copy is read again before it is served.
fn learn_version(w: &Writer, id: &str, batches: &[Batch], unit: &Unit, after: Stamp) {
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
