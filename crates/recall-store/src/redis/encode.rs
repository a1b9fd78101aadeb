//! A unit's batches as Redis commands: one call of `apply.lua` for the
//! session's own keys, and the index commands that go beside it.
//!
//! A script rather than MULTI/EXEC because a transaction cannot abort on
//! what it reads: the session's writes apply only if its version is the
//! one the writing replica expects (`Op::Expect`), so that a replica whose
//! lease lapsed while it worked cannot overwrite the turns of the replica
//! that took the session over.

use dashmap::DashMap;
use redis::{Cmd, Pipeline};

use super::keys::{bucket, Keys};
use super::Stamp;
use crate::{Batch, Faults, Fences, Op, StorageError};
use recall_core::memory::message::Message;

/// The script every session write runs (see its header for arguments).
pub(super) const APPLY: &str = include_str!("apply.lua");

/// A note's compare-and-set: written only over the body it was folded
/// from (`''` for none).
const NOTE_CAS: &str = "if (redis.call('GET', KEYS[1]) or '') ~= ARGV[2] then \
    return redis.error_reply('CHANGED the note changed since it was read') end \
    redis.call('SET', KEYS[1], ARGV[1]) return 1";

/// `APPLY`'s SHA1: writes send it in place of the script's body.
fn apply_sha() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| redis::Script::new(APPLY).get_hash().to_owned())
}

/// One session's part of a round: the batches of one session (or one
/// batch that changes no session, a webhook event's), in order.
#[derive(Default)]
pub(super) struct Unit {
    pub session: Option<String>,
    pub batches: Vec<usize>,
    /// Kept events and notes, sent before the script.
    pub pre: Vec<Cmd>,
    /// The script call (none for a unit without a session) and, after it,
    /// the releases of the session's leases.
    pub tx: Option<Pipeline>,
    /// Index additions: before the script on one Redis, beside it on a
    /// cluster (`writer.rs`).
    pub aside: Vec<Cmd>,
    /// The version the script expects (`Op::Expect`), by how much its
    /// batches move it, and its count of late updates.
    pub expect: Option<u64>,
    pub bumps: u64,
    pub lates: u64,
    /// This unit's write id, kept in the meta when the version moves.
    pub wid: u64,
    /// Whether it leaves the session deleted, and the users whose sets
    /// then no longer name it: removals sent after the script.
    pub deleted: bool,
    pub deleted_users: Vec<String>,
    /// Why it was not stored, naming the node.
    pub failed: Option<String>,
}

/// What a unit's batches come to.
#[derive(Default)]
struct Script {
    /// The version and creation time the session must have.
    expect: Option<(u64, i64)>,
    /// Why the whole is refused (nothing of it is written).
    refuse: Option<String>,
    bumps: u64,
    lates: u64,
    args: Vec<String>,
}

/// Encodes a unit's batches: its index additions and its script.
/// What encoding a round's units reads.
pub(super) struct Context<'a> {
    pub keys: &'a Keys,
    pub known: &'a DashMap<String, Stamp>,
    pub fences: &'a Fences,
    pub faults: &'a Faults,
    /// Sends the script's body (`EVAL`) rather than its SHA, to a node
    /// that did not have it.
    pub by_body: bool,
}

pub(super) fn encode(
    cx: &Context<'_>,
    unit: &mut Unit,
    batches: &[&Batch],
    results: &mut [crate::Outcome],
) {
    let Context {
        keys,
        known,
        fences,
        faults,
        by_body,
    } = *cx;
    // A fenced session's batches are refused up to one that lifts the
    // fence; the rest go in its script.
    let mut fenced = unit
        .session
        .as_deref()
        .is_some_and(|id| fences.contains(id));
    let mut sent = Vec::new();
    for &i in &unit.batches {
        let b = batches[i];
        if fenced && !b.lifts_fence() {
            results[i] = fences.admits(b).and(Err("an earlier write failed".into()));
            continue;
        }
        fenced = false;
        sent.push(i);
    }
    unit.batches = sent;
    if unit.batches.is_empty() {
        return;
    }
    let mut script = Script::default();
    for i in unit.batches.clone() {
        let b = batches[i];
        let (mut pre, mut index) = (Vec::new(), Vec::new());
        for op in &b.ops {
            if let Err(e) = queue(&mut script, &mut pre, &mut index, unit, keys, op) {
                // Not half a batch: the whole unit is refused.
                tracing::error!(error = %e, "a change could not be encoded");
                script.refuse.get_or_insert_with(|| format!("{e}"));
            }
        }
        script.bumps += u64::from(b.ops.iter().any(Op::bumps));
        script.lates += u64::from(b.ops.iter().any(|op| matches!(op, Op::SetLate { .. })));
        if faults.batch_fails(b) {
            // Refused as Redis refuses a script it cannot run (out of
            // memory): nothing of the unit is written, its additions
            // neither.
            script.refuse = Some("injected fault".into());
            if unit.session.is_none() {
                unit.failed = Some("injected fault".into());
            }
            continue;
        }
        unit.pre.extend(pre);
        unit.aside.extend(index);
    }
    let Some(id) = unit.session.as_deref() else {
        // A webhook event's batch: single-key commands only.
        return;
    };
    // The write that set the version this unit expects, when this replica
    // made or read that very version: a lost write and another replica's
    // reach the same number, not the same id.
    let expect_wid = script.expect.and_then(|(version, _)| {
        known
            .get(id)
            .filter(|k| k.version == version && k.wid != 0)
            .map(|k| k.wid)
    });
    let mut call = match by_body {
        true => redis::cmd("EVAL").arg(APPLY).clone(),
        false => redis::cmd("EVALSHA").arg(apply_sha()).clone(),
    };
    call.arg(3)
        .arg(keys.meta(id))
        .arg(keys.messages(id))
        .arg(keys.late(id))
        .arg(
            script
                .expect
                .map(|(v, _)| v.to_string())
                .unwrap_or_default(),
        )
        .arg(
            script
                .expect
                .map(|(_, c)| c.to_string())
                .unwrap_or_default(),
        )
        .arg(script.refuse.unwrap_or_default())
        .arg(script.bumps)
        .arg(script.lates)
        .arg(expect_wid.map(|w| w.to_string()).unwrap_or_default())
        .arg(unit.wid)
        .arg(script.args);
    unit.expect = script.expect.map(|(version, _)| version);
    unit.bumps = script.bumps;
    unit.lates = script.lates;
    let mut tx = redis::pipe();
    tx.add_command(call);
    unit.tx = Some(tx);
}

/// Queues one op: the session's own writes in the script, kept events
/// and notes in `pre`, index additions in `index`, removals noted on the
/// unit.
fn queue(
    s: &mut Script,
    pre: &mut Vec<Cmd>,
    index: &mut Vec<Cmd>,
    unit: &mut Unit,
    keys: &Keys,
    op: &Op,
) -> Result<(), StorageError> {
    let indexed = |index: &mut Vec<Cmd>, id: &str, last_active_ms: i64| {
        let b = bucket(id);
        index.push(redis::cmd("ZADD").arg(keys.ids(b)).arg(0).arg(id).clone());
        // GT: an addition tried again late never moves a session's
        // activity back.
        index.push(
            redis::cmd("ZADD")
                .arg(keys.active(b))
                .arg("GT")
                .arg(last_active_ms)
                .arg(id)
                .clone(),
        );
    };
    let mut put = |name: &str, args: &[String]| {
        s.args.push(name.to_owned());
        s.args.extend_from_slice(args);
    };
    match op {
        Op::Expect {
            version,
            created_ms,
            ..
        } => {
            // The unit's first: later ones count this session's own
            // batches in between.
            s.expect.get_or_insert((*version, *created_ms));
        }
        Op::Save { id, meta } => {
            let users = serde_json::to_string(&meta.users).unwrap_or_else(|_| "[]".into());
            let system =
                serde_json::to_string(&meta.system_messages).unwrap_or_else(|_| "[]".into());
            put(
                "save",
                &[
                    meta.created_ms.to_string(),
                    meta.last_active_ms.to_string(),
                    meta.turn_id.to_string(),
                    meta.first_seq.to_string(),
                    users,
                    system,
                    serde_json::to_string(&meta.metadata).unwrap_or_else(|_| "{}".into()),
                    serde_json::to_string(&meta.remembered).unwrap_or_else(|_| "{}".into()),
                ],
            );
            indexed(index, id, meta.last_active_ms);
            for user in &meta.users {
                index.push(redis::cmd("SADD").arg(keys.user(user)).arg(id).clone());
            }
            unit.deleted = false;
            unit.deleted_users.retain(|u| !meta.users.contains(u));
        }
        Op::Touch {
            id,
            created_ms,
            last_active_ms,
            turn_id,
            first_seq,
        } => {
            put(
                "touch",
                &[
                    created_ms.to_string(),
                    last_active_ms.to_string(),
                    turn_id.to_string(),
                    first_seq.to_string(),
                ],
            );
            indexed(index, id, *last_active_ms);
            unit.deleted = false;
        }
        Op::Push { seq, message, .. } => put("push", &[seq.to_string(), to_json(message)?]),
        Op::Set { seq, message, .. } => put("set", &[seq.to_string(), to_json(message)?]),
        Op::SetLate { seq, message, .. } => {
            let late = recall_core::memory::interruption::late_fields(message);
            put(
                "late",
                &[seq.to_string(), serde_json::Value::Object(late).to_string()],
            );
        }
        Op::DropBefore { from, seq, .. } => {
            if seq > from {
                put("drop", &[from.to_string(), seq.to_string()]);
            }
        }
        Op::Clear { .. } => put("clear", &[]),
        Op::Delete { users, .. } => {
            put("delete", &[]);
            unit.deleted = true;
            unit.deleted_users.extend(users.iter().cloned());
        }
        // Handled by the round: after the script, or by the fences.
        Op::Release { .. } | Op::Resume { .. } => {}
        Op::KeepEvent { .. }
        | Op::ForgetEvent { .. }
        | Op::KeepJob { .. }
        | Op::ForgetJob { .. } => {
            if let Some(k) = op.kept() {
                let key = keys.kept(k.what, bucket(k.id));
                pre.push(match k.body {
                    Some(body) => redis::cmd("HSET").arg(key).arg(k.id).arg(body).clone(),
                    None => redis::cmd("HDEL").arg(key).arg(k.id).clone(),
                });
            }
        }
        Op::SaveNote { user, body, expect } => match expect {
            None => pre.push(redis::cmd("SET").arg(keys.note(user)).arg(body).clone()),
            Some(expect) => pre.push(
                redis::cmd("EVAL")
                    .arg(NOTE_CAS)
                    .arg(1)
                    .arg(keys.note(user))
                    .arg(body)
                    .arg(expect)
                    .clone(),
            ),
        },
    }
    Ok(())
}

fn to_json(message: &Message) -> Result<String, StorageError> {
    serde_json::to_string(message).map_err(|e| StorageError::Corrupt(e.to_string()))
}
